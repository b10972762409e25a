"""Reads (protocol 5): receivers that read announced offers themselves, and what guards them.

Real processes and NIXL, as in test_transfer; the byte-level paths are also run in both modes there
(its ``pair`` fixture). These tests are about the announcement's life: who gets one, that each gets
exactly one release, that the sender keeps its blocks until then, and hostile announcements.
"""

from __future__ import annotations

import time

import msgpack
import pytest

from kvpolicy.transports import KVLayout, control

from .conftest import requires_nixl

pytestmark = requires_nixl

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)
BLOCKS = 32


def until(predicate, timeout_s: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def ranks(workers):
    """A prefill rank that allows reads and a decode rank connected to it."""
    prefill = workers("prefill", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=1, allow_reads=True)
    decode = workers("decode", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=2, limits={"offers_per_peer": 4})
    decode.call("connect", prefill.address)
    assert decode.call("stats")["read_sources"] == 1
    return prefill, decode


def test_an_announced_offer_is_read_and_released(ranks):
    prefill, decode = ranks
    prefill.call("send", "r1", [3, 4, 5], to=decode.key_name)
    assert until(lambda: decode.call("announced") == ["r1"])
    decode.call("receive", "r1", [10, 11, 12])
    received, sent = decode.call("wait", "r1"), prefill.call("wait", "r1")
    assert received["state"] == sent["state"] == "completed", (received, sent)
    assert decode.call("digests", [10, 11, 12]) == prefill.call("digests", [3, 4, 5])
    assert decode.call("stats")["reads"] == 1
    assert received["metrics"]["bytes"] == sent["metrics"]["bytes"] == 3 * LAYOUT.block_bytes
    assert prefill.call("released", "r1") and decode.call("released", "r1")
    assert decode.call("announced") == []


def test_a_skipped_prefix_is_not_read(ranks):
    prefill, decode = ranks
    decode.call("fill", 7)
    held = decode.call("digests", [20])
    prefill.call("send", "prefix", [1, 2, 3], to=decode.key_name)
    assert until(lambda: decode.call("announced") == ["prefix"])
    decode.call("receive", "prefix", [21, 22], skip_blocks=1)
    assert decode.call("wait", "prefix")["state"] == "completed"
    assert decode.call("digests", [21, 22]) == prefill.call("digests", [2, 3])
    assert decode.call("digests", [20]) == held
    assert prefill.call("wait", "prefix")["metrics"]["bytes"] == 2 * LAYOUT.block_bytes


def test_a_receive_before_the_offer_is_written_and_gets_no_announcement(ranks):
    prefill, decode = ranks
    decode.call("receive", "early", [8, 9])
    time.sleep(0.2)  # the ask reaches the sender first
    prefill.call("send", "early", [1, 2], to=decode.key_name)
    assert decode.call("wait", "early")["state"] == "completed"
    assert prefill.call("wait", "early")["state"] == "completed"
    assert decode.call("digests", [8, 9]) == prefill.call("digests", [1, 2])
    assert decode.call("stats")["reads"] == 0 and decode.call("announced") == []
    assert prefill.call("released", "early")  # no announcement was made: no release is owed


def test_a_sender_cancel_withdraws_the_announcement_before_releasing_the_blocks(ranks):
    prefill, decode = ranks
    prefill.call("send", "withdrawn", [4, 5], to=decode.key_name)
    assert until(lambda: decode.call("announced") == ["withdrawn"])
    # False: decode may be reading it; it ends once decode declined (or, had it read, completed)
    assert prefill.call("cancel", "withdrawn", role="sender") is False
    assert prefill.call("wait", "withdrawn")["state"] == "cancelled"
    # Released only once decode answered the withdrawal: it can no longer start a read.
    assert until(lambda: prefill.call("released", "withdrawn"))
    assert decode.call("announced") == []
    decode.call("receive", "withdrawn", [6, 7], timeout_s=5.0)
    outcome = decode.call("wait", "withdrawn")
    assert outcome["state"] == "cancelled", outcome
    assert decode.call("stats")["reads"] == 0


def test_an_announcement_nobody_takes_ends_with_the_offer(ranks):
    prefill, decode = ranks
    prefill.call("send", "orphan", [9], to=decode.key_name, timeout_s=1.0)
    assert until(lambda: decode.call("announced") == ["orphan"])
    assert prefill.call("wait", "orphan")["state"] == "timed_out"
    assert until(lambda: prefill.call("released", "orphan"))
    assert until(lambda: decode.call("announced") == [])


def test_only_the_named_receiver_gets_the_announcement(workers):
    prefill = workers("prefill", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=1, allow_reads=True)
    named = workers("named", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=2)
    other = workers("other", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=3)
    for decode in (named, other):
        decode.call("connect", prefill.address)
    prefill.call("send", "private", [1, 2], to=named.key_name)
    assert until(lambda: named.call("announced") == ["private"])
    assert other.call("announced") == []
    other.call("receive", "private", [3, 4], timeout_s=1.0)  # not named: treated like an unknown id
    # (its deadline, or the sender's refusal when the ask's wait for an offer ends at the same time)
    assert other.call("wait", "private")["state"] in ("timed_out", "failed")
    named.call("receive", "private", [3, 4])
    assert named.call("wait", "private")["state"] == "completed"
    assert (named.call("stats")["reads"], other.call("stats")["reads"]) == (1, 0)


def test_no_metadata_and_no_announcement_without_allow_reads(workers):
    prefill = workers("prefill", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=2)
    decode.call("connect", prefill.address)
    assert decode.call("stats")["read_sources"] == 0  # the welcome carried no metadata
    prefill.call("send", "plain", [1], to=decode.key_name)
    time.sleep(0.2)
    assert decode.call("announced") == []
    decode.call("receive", "plain", [2])
    assert decode.call("wait", "plain")["state"] == "completed"
    assert decode.call("stats")["reads"] == 0


def _offer(request_id: str, token: int, blocks: list[int], timeout_ms: int = 30_000) -> bytes:
    return msgpack.packb([control.PROTOCOL_VERSION, "offer", request_id, token, blocks, timeout_ms])


def test_hostile_announcements_are_declined_and_bounded(ranks):
    prefill, decode = ranks
    before, sender_before = decode.call("stats"), prefill.call("stats")["dropped_unknown_request"]
    prefill.call("announce_raw", [
        _offer("beyond", 1, [BLOCKS + 5]),  # blocks outside the sender's own pool
        _offer("long", 3, [1] * (BLOCKS + 1)),  # more blocks than the receiver's pool could take
        msgpack.packb([control.PROTOCOL_VERSION, "offer", "zero", 0, [1], 1]),  # token 0: off-schema
        _offer("past", 2, [1], timeout_ms=1),  # over 1 ms after it arrives
    ])
    assert until(lambda: decode.call("stats")["dropped_malformed"] == before["dropped_malformed"] + 3)
    # Each was answered: beyond and long declined at once, past when its 1 ms ran out (not before
    # it arrived: so the flood below finds the budget empty).
    assert until(lambda: prefill.call("stats")["dropped_unknown_request"] == sender_before + 3)
    assert decode.call("announced") == []
    # A flood: at most offers_per_peer (4) are kept, the rest declined at once.
    prefill.call("announce_raw", [_offer(f"flood-{i}", 10 + i, [1]) for i in range(10)])
    assert until(lambda: decode.call("stats")["dropped_over_budget"] == before["dropped_over_budget"] + 6)
    assert len(decode.call("announced")) == 4
    # Each one declined was answered (3 + 6 releases): the sender, which never announced them, drops them.
    assert until(lambda: prefill.call("stats")["dropped_unknown_request"] == sender_before + 9)
    # So is a forged release, for something never announced to this receiver.
    decode.call("raw", "prefill", [msgpack.packb([control.PROTOCOL_VERSION, "release", "r-none", 5, "ok", "", 1 << 20, 1])])
    assert until(lambda: prefill.call("stats")["dropped_unknown_request"] == sender_before + 10)
    # The service goes on: a real offer, declined while the flood fills the budget, is written instead.
    prefill.call("send", "after", [2], to=decode.key_name)
    assert until(lambda: decode.call("stats")["dropped_over_budget"] == before["dropped_over_budget"] + 7)
    decode.call("receive", "after", [3])
    assert decode.call("wait", "after")["state"] == prefill.call("wait", "after")["state"] == "completed"
    assert decode.call("digests", [3]) == prefill.call("digests", [2])
    assert decode.call("stats")["reads"] == 0 and prefill.call("released", "after")


def test_reads_over_ucx_tcp(workers):
    """Without CMA (UCX over TCP, as between two hosts), a read still moves every byte."""
    env = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_CMA_SEG_SIZE": None}
    prefill = workers("prefill", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=1, allow_reads=True, env=env)
    decode = workers("decode", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=2, env=env)
    decode.call("connect", prefill.address)
    prefill.call("send", "tcp", [1, 2, 3, 9], to=decode.key_name)
    assert until(lambda: decode.call("announced") == ["tcp"])
    decode.call("receive", "tcp", [4, 5, 6, 7])
    assert decode.call("wait", "tcp")["state"] == prefill.call("wait", "tcp")["state"] == "completed"
    assert decode.call("digests", [4, 5, 6, 7]) == prefill.call("digests", [1, 2, 3, 9])
    assert decode.call("stats")["reads"] == 1


def test_an_announcement_owed_by_a_dead_receiver_fences_the_blocks_until_disconnect(ranks):
    """The sender cannot know whether a receiver that never answered is reading: past its deadline
    the offer ends, but its blocks stay fenced until the receiver answers or is disconnected."""
    prefill, decode = ranks
    prefill.call("send", "ghost", [5, 6], to=decode.key_name, timeout_s=1.5)
    assert until(lambda: decode.call("announced") == ["ghost"])
    decode.kill()  # no release will ever come
    assert prefill.call("wait", "ghost")["state"] == "timed_out"
    time.sleep(0.5)
    assert prefill.call("released", "ghost") is False
    assert prefill.call("disconnect", decode.key_name)
    assert prefill.call("released", "ghost") is True


BIG = KVLayout(num_layers=8, kv_heads=8, tokens_per_block=16, head_dim=128)  # 512 KiB blocks


@pytest.mark.parametrize("how", ["deadline", "cancel"])
def test_a_receive_that_ends_during_its_read_keeps_its_blocks_fenced_until_the_read_ended(workers, how):
    """Over TCP a read takes milliseconds: end the receive meanwhile. Its blocks stay held until
    NIXL says the read is over (or it was aborted), the sender's until the release says so; then
    both are reusable, and the next read into the same blocks is whole."""
    env = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_CMA_SEG_SIZE": None}
    prefill = workers("prefill", layout=BIG.to_wire(), num_blocks=64, seed=1, allow_reads=True, env=env)
    decode = workers("decode", layout=BIG.to_wire(), num_blocks=64, seed=2, env=env)
    decode.call("connect", prefill.address)
    src, dst = list(range(64)), list(range(64))
    prefill.call("send", "slow", src, to=decode.key_name)
    assert until(lambda: decode.call("announced") == ["slow"])
    if how == "deadline":
        decode.call("receive", "slow", dst, timeout_s=0.002)
    else:
        decode.call("receive", "slow", dst)
        decode.call("cancel", "slow", role="receiver")
    ended = decode.call("wait", "slow")
    assert ended["state"] in ({"timed_out", "completed"} if how == "deadline" else {"cancelled", "completed"}), ended
    assert until(lambda: decode.call("released", "slow"))
    assert prefill.call("wait", "slow")["state"] in ("cancelled", "completed")
    assert until(lambda: prefill.call("released", "slow"))
    prefill.call("send", "again", src, to=decode.key_name)
    assert until(lambda: decode.call("announced") == ["again"])
    decode.call("receive", "again", dst)
    assert decode.call("wait", "again")["state"] == "completed"
    assert decode.call("digests", dst) == prefill.call("digests", src)


@pytest.mark.parametrize("forged", ["agent not bound to the key", "metadata of another agent", "another layout"])
def test_a_receiver_loads_no_metadata_an_insider_forged(workers, forged):
    """A sender whose key is allowed may still lie in its welcome. The receiver loads its metadata
    (and could then read its memory) only if the agent name carries the key that CURVE
    authenticated, the metadata names that agent, and the layout is its own; otherwise it reads
    nothing from it (it may still be written to, as before)."""
    import threading

    from .attackers import RogueSender

    victim = workers("victim", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=1, allow_reads=True)
    decode = workers("decode", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=2)
    rogue = RogueSender()
    try:
        victim_agent, victim_metadata = victim.call("metadata")
        agent, metadata, layout = rogue.agent, victim_metadata, LAYOUT
        if forged == "agent not bound to the key":
            agent = victim_agent  # claims the victim's agent (and its metadata): would read the victim
        elif forged == "another layout":
            layout = KVLayout(num_layers=4, kv_heads=2, tokens_per_block=8, head_dim=32)
        rank = control.RankInfo("rogue", agent, metadata, layout, 1 << 30, BLOCKS, "DRAM", 0)
        answered = []
        thread = threading.Thread(target=lambda: answered.append(rogue.welcome_next_hello(rank)), daemon=True)
        thread.start()
        assert decode.call("connect", rogue.address) == rogue.key_name
        thread.join(10)
        assert answered == [True]
        assert decode.call("stats")["read_sources"] == 0
    finally:
        rogue.close()
