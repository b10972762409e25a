"""Fencing: no byte of a timed-out, retried or aborted attempt lands in blocks given to a later one."""

from __future__ import annotations

import os
import signal
import time

import pytest

from kvpolicy.transports import KVLayout, RequestState

from tests.support.transfer import eventually, slow_other_decode, stop

from .conftest import requires_nixl
from .transfer_worker import WorkerError

pytestmark = requires_nixl

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)


def test_a_sender_paused_past_the_deadline_never_writes_into_reused_blocks(workers):
    slow, other, decode = slow_other_decode(workers)
    stop(slow.process.pid)
    try:
        decode.call("receive", "A", [10, 11], peers=["slow"], timeout_s=1.0)
        assert decode.call("wait", "A")["state"] == "timed_out"
        # Ended, but the sender never confirmed: the blocks stay fenced, a new receive is refused.
        assert decode.call("released", "A") is False
        with pytest.raises(WorkerError, match="still held"):
            decode.call("receive", "B", [10, 11], peers=["other"])
    finally:
        os.kill(slow.process.pid, signal.SIGCONT)
    # Resumed: the sender counts the ask's time from when it reads it (its own clock; no clock is
    # compared across hosts), so it may still write, into blocks that are still fenced; its answer,
    # whatever it is, ends the attempt and releases them. Nothing lands in blocks given to B.
    eventually(lambda: decode.call("released", "A"))
    other.call("send", "B", [5, 6], to=decode.key_name)
    decode.call("receive", "B", [10, 11], peers=["other"])
    assert decode.call("wait", "B")["state"] == "completed"
    expected = other.call("digests", [5, 6])
    time.sleep(1.0)  # room for a late write, if there were one
    assert decode.call("digests", [10, 11]) == expected
    # The decoder's cancel at its deadline ends that attempt only (a retry could still ask), so the
    # offer ended by the write it still made, or by its own deadline.
    assert slow.call("wait", "A")["state"] in ("completed", "timed_out")


def test_a_retry_with_the_same_request_id_never_completes_from_the_first_attempt(workers):
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", prefill.address)
    decode.call("fill", 5)
    prefill.call("delay_results", 2.0)  # the first attempt's result comes after its deadline
    prefill.call("send", "R", [1, 2], to=decode.key_name, timeout_s=30)
    decode.call("receive", "R", [10, 11], timeout_s=1.0)
    assert decode.call("wait", "R")["state"] == "timed_out"
    retry_blocks = [20, 21]
    untouched = decode.call("digests", retry_blocks)
    decode.call("receive", "R", retry_blocks, timeout_s=6.0)
    outcome = decode.call("wait", "R")
    # The first attempt's result (ok, for blocks 10-11) arrives during the retry and must not count.
    assert outcome["state"] != "completed" or decode.call("digests", retry_blocks) == prefill.call("digests", [1, 2]), outcome
    assert outcome["state"] == "failed", outcome
    assert "already served" in outcome["reason"] or "sender request completed" in outcome["reason"], outcome
    assert decode.call("digests", retry_blocks) == untouched
    eventually(lambda: decode.call("released", "R"))
    stats = decode.call("stats")
    assert stats["late_frames"] >= 1


def test_an_aborted_write_is_reported_to_the_receiver(tmp_path):
    """In one process: a write NIXL never reports done is aborted at the sender's deadline, and the
    receiver hears ``aborted`` at once instead of waiting out its own (longer) timeout."""
    from kvpolicy.transports import BlockPool, NixlTransceiver, TransferError, create_keys

    create_keys(tmp_path, "p")
    create_keys(tmp_path, "d")
    pools = [BlockPool(LAYOUT, 8, huge_pages=False) for _ in range(2)]
    with NixlTransceiver(pools[0], name="p", identity=tmp_path / "p.key_secret", allowed_peers=tmp_path, timeout_s=30) as p, \
            NixlTransceiver(pools[1], name="d", identity=tmp_path / "d.key_secret", allowed_peers=tmp_path, timeout_s=30) as d:
        d.connect(p.address)
        agent = p._local.agent
        real_transfer, real_check = agent.transfer, agent.check_xfer_state
        agent.transfer = lambda xfer: (real_transfer(xfer), "PROC")[1]  # posted, but never reported done
        agent.check_xfer_state = lambda xfer: (real_check(xfer), "PROC")[1]
        try:
            sent = p.send("stuck", [1, 2], to="d", timeout_s=1.0)
            received = d.receive("stuck", [3, 4], timeout_s=20.0)
            with pytest.raises(TransferError) as caught:
                received.wait(10.0)
        finally:
            agent.transfer, agent.check_xfer_state = real_transfer, real_check
        assert caught.value.state is RequestState.FAILED and "aborted" in caught.value.reason
        assert received.released  # an aborted write is over: the blocks are free again
        with pytest.raises(TransferError):
            sent.wait(5.0)
        assert sent.state is RequestState.FAILED


def test_a_second_receive_into_the_same_blocks_is_refused(workers):
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", prefill.address)
    decode.call("receive", "first", [1, 2])
    with pytest.raises(WorkerError, match="still held"):
        decode.call("receive", "second", [2, 3])
    prefill.call("send", "first", [4, 5], to=decode.key_name)
    assert decode.call("wait", "first")["state"] == "completed"
    assert decode.call("released", "first") is True
    prefill.call("send", "second", [6, 7], to=decode.key_name)
    decode.call("receive", "second", [2, 3])
    assert decode.call("wait", "second")["state"] == "completed"
