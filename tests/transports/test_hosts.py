"""Prefill and decode on two hosts (network namespaces joined by a veth link) that find each other
through etcd; NIXL moves the blocks over TCP across the link, and the link's counters prove it.

Faults across the link: the decode process killed mid-transfer, the link dropped, etcd stopped,
result frames delayed. Each ends every affected request in a clear per-request state within its
timeout, releases its pages, and a new request succeeds once the peer is back.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from kvpolicy.transports import KVLayout
from kvpolicy.transports.addresses import split_address

from tests.support.transfer import HOSTS_BLOCKS as BLOCKS
from tests.support.transfer import HOSTS_LAYOUT as LAYOUT
from tests.support.transfer import HOSTS_TIMEOUT as TIMEOUT
from tests.support.transfer import start_pair

from .conftest import requires_nixl

pytestmark = requires_nixl

BIG = KVLayout(num_layers=8, kv_heads=8, tokens_per_block=32, head_dim=128)  # 1 MiB blocks


def transfer_ok(prefill, decode, request_id, src, dst, **options):
    prefill.call("send", request_id, src)
    decode.call("receive", request_id, dst, **options)
    outcome = decode.call("wait", request_id)
    assert outcome["state"] == "completed", outcome
    assert prefill.call("wait", request_id)["state"] == "completed"
    assert decode.call("digests", dst) == prefill.call("digests", src)
    return outcome


def start_in_flight(prefill, decode, request_id, blocks):
    """Start a request and return once the prefill side's write is in flight (False if it finished
    before that could be seen)."""
    prefill.call("send", request_id, blocks)
    decode.call("receive", request_id, blocks)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        state = prefill.call("state", request_id)
        if state == "transferring":
            return True
        if state not in ("waiting", "pending"):
            return False
    return False


def test_transfer_crosses_the_veth_link(two_hosts, workers):
    prefill, decode = start_pair(two_hosts, workers, "link")
    rng = random.Random(3)
    src, dst = rng.sample(range(BLOCKS), 32), rng.sample(range(BLOCKS), 32)
    payload = len(src) * LAYOUT.block_bytes
    pair = two_hosts.pair
    tx_before, rx_before = pair.link_bytes(pair.prefill)[1], pair.link_bytes(pair.decode)[0]
    outcome = transfer_ok(prefill, decode, "across", src, dst)
    assert outcome["metrics"]["bytes"] == payload
    sent = pair.link_bytes(pair.prefill)[1] - tx_before
    received = pair.link_bytes(pair.decode)[0] - rx_before
    assert sent >= payload and received >= payload, (sent, received, payload)


def test_decode_killed_mid_transfer_then_replaced(two_hosts, workers):
    prefill, decode = start_pair(two_hosts, workers, "kill", layout=BIG, num_blocks=200)
    blocks = list(range(200))  # 200 MiB: long enough on the link to be caught in flight
    for attempt in range(3):
        if start_in_flight(prefill, decode, f"doomed-{attempt}", blocks):
            break
        assert decode.call("wait", f"doomed-{attempt}")["state"] == "completed"
    else:
        pytest.skip("the write always finished before it could be seen in flight")
    prefill.call("send", "never-asked", [0, 1], timeout_s=2.0)
    decode.kill()
    started = time.monotonic()
    doomed = prefill.call("wait", f"doomed-{attempt}")
    assert doomed["state"] in ("failed", "timed_out"), doomed
    assert doomed["reason"]
    orphan = prefill.call("wait", "never-asked")
    assert orphan["state"] == "timed_out" and "did not ask" in orphan["reason"], orphan
    assert time.monotonic() - started < TIMEOUT + 3
    assert prefill.call("stats")["registrations"] == 1

    # A new decode process (new agent, metadata again through etcd) is served by the same prefill.
    replacement = workers("decode", layout=BIG.to_wire(), num_blocks=200, seed=4, timeout_s=TIMEOUT, **two_hosts.config("decode"))
    assert replacement.call("connect_by_name", two_hosts.etcd.endpoint, "kill", prefill.key_name) == prefill.key_name
    transfer_ok(prefill, replacement, "after-kill", [3, 4, 5], [7, 8, 9])


def test_link_dropped_mid_transfer_then_restored(two_hosts, workers):
    prefill, decode = start_pair(two_hosts, workers, "drop", layout=BIG, num_blocks=200)
    # Blocks of an attempt cut mid-write stay fenced until the sender reports: later requests use others.
    blocks = list(range(180))
    try:
        for attempt in range(3):
            if start_in_flight(prefill, decode, f"cut-{attempt}", blocks):
                break
            assert decode.call("wait", f"cut-{attempt}")["state"] == "completed"
        else:
            pytest.skip("the write always finished before it could be seen in flight")
        two_hosts.pair.set_link(False)
        decode.call("receive", "while-down", [190, 191])  # asked while the link is down: never arrives
        started = time.monotonic()
        sent, received = prefill.call("wait", f"cut-{attempt}"), decode.call("wait", f"cut-{attempt}")
        assert sent["state"] in ("failed", "timed_out") and sent["reason"], sent
        assert received["state"] in ("failed", "timed_out") and received["reason"], received
        down = decode.call("wait", "while-down")
        assert down["state"] == "timed_out" and "no result frame" in down["reason"], down
        assert time.monotonic() - started < TIMEOUT + 3
    finally:
        two_hosts.pair.set_link(True)
    # Same processes, same connection: ZMQ and UCX reconnect over the restored link.
    for i in range(3):
        transfer_ok(prefill, decode, f"restored-{i}", [20 + i, 40 + i], [192 + 2 * i, 193 + 2 * i])
    assert prefill.call("stats")["registrations"] == decode.call("stats")["registrations"] == 1


def test_delayed_result_frames_time_out_then_recover(two_hosts, workers):
    prefill, decode = start_pair(two_hosts, workers, "delay")
    prefill.call("delay_results", 3.0)
    prefill.call("send", "slow", [1, 2])
    decode.call("receive", "slow", [1, 2], timeout_s=1.0)
    started = time.monotonic()
    slow = decode.call("wait", "slow")
    assert slow["state"] == "timed_out" and "no result frame" in slow["reason"], slow
    assert time.monotonic() - started < 3.0
    prefill.call("delay_results", 0)
    transfer_ok(prefill, decode, "prompt", [3], [4])
    # The held frame arrives after its request ended: counted as late, never applied.
    deadline = time.monotonic() + TIMEOUT
    while decode.call("stats")["late_frames"] < 1:
        assert time.monotonic() < deadline, "the delayed result frame never arrived"
        time.sleep(0.1)


def test_etcd_stopped_mid_run(two_hosts, workers):
    prefill, decode = start_pair(two_hosts, workers, "outage")
    endpoint = two_hosts.etcd.endpoint
    two_hosts.etcd.stop()
    try:
        # Discovery fails fast and says why; established peers keep transferring.
        started = time.monotonic()
        answer = decode.call("lookup", endpoint, "outage", prefill.key_name, 1.0)
        assert isinstance(answer, str) and answer.startswith("RegistryUnavailable"), answer
        assert time.monotonic() - started < 5.0
        transfer_ok(prefill, decode, "during-outage", [1, 2], [3, 4])
        # A decode process that starts now cannot publish its NIXL metadata (NIXL only logs that).
        late = workers("late", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=5, timeout_s=TIMEOUT, **two_hosts.config("decode"))
        time.sleep(max(0.0, 3.5 - (time.monotonic() - started)))  # past the lease's TTL (3 s)
    finally:
        two_hosts.etcd.start()
    # Back: the prefill's record is there again (its lease restored or re-granted), and the late
    # process finds it, publishes its metadata again on connect, and is served.
    record = decode.call("lookup", endpoint, "outage", prefill.key_name, 10.0)
    assert split_address(record["address"] if isinstance(record, dict) else record.address)[0].startswith("tcp://10.231.7.1:"), record
    assert late.call("connect_by_name", endpoint, "outage", prefill.key_name) == prefill.key_name
    transfer_ok(prefill, late, "after-outage", [5, 6], [7, 8])
    transfer_ok(prefill, decode, "old-peer-after-outage", [9], [10])


SOAK_REQUESTS = int(os.environ.get("KVPOLICY_SOAK_REQUESTS", "200"))


@pytest.mark.parametrize("mode", ["writes", "reads"])
def test_soak_random_sizes_and_cancels(two_hosts, workers, mode):
    """``KVPOLICY_SOAK_REQUESTS`` requests (200 by default; 1,000 in the full soak) of 1-16 blocks,
    eight in flight at a time, about one in four cancelled from either side at a random moment.
    Every request ends; completed ones match by checksum; cancelled ones say cancelled. Twice:
    written by the sender, and read by the receiver (``allow_reads``, offers naming it)."""
    prefill, decode = start_pair(two_hosts, workers, f"soak-{mode}", num_blocks=128, allow_reads=mode == "reads")
    to = decode.key_name if mode == "reads" else None
    rng = random.Random(int(os.environ.get("KVPOLICY_SOAK_SEED", "11")))
    counts = {"completed": 0, "cancelled": 0, "cancel_requested": 0}
    nbytes, began = 0, time.monotonic()
    done = 0
    batch_no = 0
    while done < SOAK_REQUESTS:
        batch_no += 1
        # Fresh contents each batch, so a request that 'completed' without writing would be caught.
        prefill.call("fill", 1000 + batch_no)
        decode.call("fill", 5000 + batch_no)
        src_free, dst_free = list(range(128)), list(range(128))
        rng.shuffle(src_free), rng.shuffle(dst_free)
        batch = []
        for _ in range(min(8, SOAK_REQUESTS - done)):
            n = rng.randint(1, 16)
            src, dst = [src_free.pop() for _ in range(n)], [dst_free.pop() for _ in range(n)]
            cancel = rng.choice([None] * 6 + ["sender-early", "sender-late", "receiver"])
            batch.append((f"soak-{done}", src, dst, cancel))
            done += 1
        for request_id, src, _dst, cancel in batch:
            prefill.call("send", request_id, src, to=to)
            if cancel == "sender-early":
                prefill.call("cancel", request_id)
        for request_id, _src, dst, cancel in batch:
            decode.call("receive", request_id, dst)
            if cancel == "receiver":
                decode.call("cancel", request_id)
            elif cancel == "sender-late":
                prefill.call("cancel", request_id)
        for request_id, src, dst, cancel in batch:
            received, sent = decode.call("wait", request_id), prefill.call("wait", request_id)
            if cancel is None:
                assert received["state"] == sent["state"] == "completed", (request_id, received, sent)
            else:
                counts["cancel_requested"] += 1
                # A cancel that lands after the write finished leaves a completed request.
                assert received["state"] in ("completed", "cancelled"), (request_id, cancel, received)
                assert sent["state"] in ("completed", "cancelled"), (request_id, cancel, sent)
                if cancel == "sender-early":  # (a receive that took the announcement first reads it whole)
                    assert received["state"] == sent["state"] == ("cancelled" if to is None else sent["state"]), (request_id, received, sent)
            counts[received["state"]] += 1
            if received["state"] == "completed":
                assert decode.call("digests", dst) == prefill.call("digests", src), request_id
                nbytes += received["metrics"]["bytes"]
    assert counts["completed"] + counts["cancelled"] == SOAK_REQUESTS
    assert counts["cancelled"] > 0
    assert prefill.call("stats")["registrations"] == decode.call("stats")["registrations"] == 1
    reads = decode.call("stats")["reads"]
    assert (reads > 0) == (mode == "reads")
    print(f"soak ({mode}): {SOAK_REQUESTS} requests, {counts}, {reads} read, {nbytes / 2**20:.0f} MiB verified in {time.monotonic() - began:.1f}s")
