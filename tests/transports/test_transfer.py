"""Two real processes, prefill and decode, move KV blocks through NIXL; every byte is checked."""

from __future__ import annotations

import random
import time

import pytest
import torch

from kvpolicy.transports import KVLayout

from .conftest import requires_nixl

pytestmark = requires_nixl

LAYOUT = KVLayout(num_layers=4, kv_heads=4, tokens_per_block=8, head_dim=32)
BLOCKS = 64


@pytest.fixture(scope="module", params=["writes", "reads"])
def pair(request):
    """A prefill and a decode rank with the same layout, the decode rank connected to the prefill.
    Twice: the sender writes (the default), and the sender allows reads and names the receiver, so
    the decode rank reads every request it can (:mod:`kvpolicy.transports.reads`)."""
    from .transfer_worker import Worker

    reads = request.param == "reads"
    prefill = Worker("prefill", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=1, allow_reads=reads)
    decode = Worker("decode", layout=LAYOUT.to_wire(), num_blocks=BLOCKS, seed=2)
    # Only a sender that names the receiver announces to it; the same calls then take either path.
    prefill.to = decode.key_name if reads else None
    try:
        assert decode.call("connect", prefill.address) == prefill.key_name  # named by its key
        assert decode.call("stats")["read_sources"] == int(reads)
        yield prefill, decode
        stats = decode.call("stats")
        assert stats["dropped_malformed"] == stats["dropped_unknown_request"] == 0
        assert prefill.call("stats")["dropped_unknown_request"] == 0
    finally:
        decode.stop()
        prefill.stop()


def offer(prefill, request_id, src):
    prefill.call("send", request_id, src, to=prefill.to)


def transfer(prefill, decode, request_id, src, dst, **receive_options):
    offer(prefill, request_id, src)
    decode.call("receive", request_id, dst, **receive_options)
    return prefill.call("wait", request_id), decode.call("wait", request_id)


def test_scattered_blocks_arrive_bit_identical(pair):
    prefill, decode = pair
    rng = random.Random(7)
    src = rng.sample(range(BLOCKS), 16)
    dst = rng.sample(range(BLOCKS), 16)
    sent, received = transfer(prefill, decode, "scattered", src, dst)
    assert sent["state"] == received["state"] == "completed", (sent, received)
    assert decode.call("digests", dst) == prefill.call("digests", src)
    metrics = received["metrics"]
    assert metrics["bytes"] == 16 * LAYOUT.block_bytes
    assert metrics["writers"] == 1
    # one run per (layer, K/V) per block before coalescing; whole blocks (or runs of them) after
    assert metrics["descriptors_before"] == 16 * LAYOUT.num_layers * 2
    assert metrics["descriptors"] in range(1, 17)


def test_adjacent_blocks_coalesce_into_one_descriptor(pair):
    prefill, decode = pair
    sent, received = transfer(prefill, decode, "adjacent", [8, 9, 10, 11, 12], [40, 41, 42, 43, 44])
    assert received["state"] == "completed"
    assert received["metrics"]["descriptors"] == 1
    assert decode.call("digests", [40, 41, 42, 43, 44]) == prefill.call("digests", [8, 9, 10, 11, 12])


def test_partial_request_writes_only_the_missing_suffix(pair):
    prefill, decode = pair
    decode.call("fill", 99)
    held = [50, 51]  # the decode side already holds the first two blocks (a prefix hit)
    before = decode.call("digests", held)
    src = [1, 2, 3, 4, 5, 6]
    dst = [52, 53, 54, 55]
    sent, received = transfer(prefill, decode, "partial", src, dst, skip_blocks=2)
    assert received["state"] == "completed", received
    assert received["metrics"]["bytes"] == 4 * LAYOUT.block_bytes
    assert decode.call("digests", dst) == prefill.call("digests", src[2:])
    assert decode.call("digests", held) == before


def test_receiver_may_ask_before_the_sender_offers(pair):
    prefill, decode = pair
    decode.call("receive", "early", [60, 61])
    assert decode.call("state", "early") in ("pending", "waiting")
    offer(prefill, "early", [30, 31])
    assert decode.call("wait", "early")["state"] == "completed"
    assert prefill.call("wait", "early")["state"] == "completed"
    assert decode.call("digests", [60, 61]) == prefill.call("digests", [30, 31])


def test_many_concurrent_requests_every_block_checked(pair):
    prefill, decode = pair
    prefill.call("fill", 1234)
    rng = random.Random(11)
    src_all = rng.sample(range(BLOCKS), 48)
    dst_all = rng.sample(range(BLOCKS), 48)
    requests = {f"many-{i}": (src_all[i * 2 : i * 2 + 2], dst_all[i * 2 : i * 2 + 2]) for i in range(24)}
    reads_before = decode.call("stats")["reads"]
    for request_id, (src, _) in requests.items():
        offer(prefill, request_id, src)
    if prefill.to:
        # A receive that finds no announcement yet asks for a write (by design): wait until every
        # announcement has arrived, so that the count below does not depend on scheduling.
        deadline = time.monotonic() + 20
        while len(decode.call("announced")) < len(requests) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(decode.call("announced")) == sorted(requests)
    for request_id, (_, dst) in requests.items():
        decode.call("receive", request_id, dst)
    for request_id in requests:
        assert decode.call("wait", request_id)["state"] == "completed"
        assert prefill.call("wait", request_id)["state"] == "completed"
    assert decode.call("digests", dst_all) == prefill.call("digests", src_all)
    stats = decode.call("stats")
    assert stats["registrations"] == 1
    assert stats["dropped_malformed"] == stats["dropped_unknown_request"] == 0
    # With reads, every one was read (each announcement reached decode before its receive).
    assert stats["reads"] - reads_before == (len(requests) if prefill.to else 0)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality (random bits include NaNs, which never compare equal as floats)."""
    return torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


MODES = pytest.mark.parametrize("reads", [False, True], ids=["writes", "reads"])


def wait_announced(receiver, request_id, reads, senders=1):
    """With reads, let every sender's announcement arrive first (then the receive reads them)."""
    deadline = time.monotonic() + 10
    while reads and receiver.call("announcers", request_id) < senders and time.monotonic() < deadline:
        time.sleep(0.02)


@MODES
def test_one_sender_feeds_two_tp_receivers_head_by_head(workers, reads):
    sender = workers("tp1-prefill", layout=LAYOUT.to_wire(), seed=5, allow_reads=reads)
    shards = [LAYOUT.shard(tp_size=2, tp_rank=r) for r in range(2)]
    receivers = [workers(f"tp2-decode{r}", layout=s.to_wire(), seed=10 + r) for r, s in enumerate(shards)]
    for receiver in receivers:
        receiver.call("connect", sender.address)
    src, dst = [3, 17, 18, 40], [9, 2, 3, 33]
    sender.call("send", "tp", src, receivers=2, to=[r.key_name for r in receivers] if reads else None)
    for receiver in receivers:
        wait_announced(receiver, "tp", reads)
        receiver.call("receive", "tp", dst)
    assert sender.call("wait", "tp")["state"] == "completed"
    full = sender.call("blocks", src)
    for shard, receiver in zip(shards, receivers):
        outcome = receiver.call("wait", "tp")
        assert outcome["state"] == "completed", outcome
        # a head split leaves one run per (layer, K/V) that cannot merge across blocks
        assert outcome["metrics"]["descriptors"] == len(src) * LAYOUT.num_layers * 2
        got = receiver.call("blocks", dst)
        for head in range(shard.kv_heads):
            assert same_bits(got[:, :, :, head], full[:, :, :, shard.first_head + head]), f"head {head}"
        assert receiver.call("stats")["reads"] == int(reads)


@MODES
def test_two_tp_senders_feed_one_receiver_head_by_head(workers, reads):
    shards = [LAYOUT.shard(tp_size=2, tp_rank=r) for r in range(2)]
    senders = [workers(f"tp2-prefill{r}", layout=s.to_wire(), seed=20 + r, allow_reads=reads) for r, s in enumerate(shards)]
    receiver = workers("tp1-decode", layout=LAYOUT.to_wire(), seed=30)
    for sender in senders:
        receiver.call("connect", sender.address)
    src, dst = [0, 1, 2, 7], [5, 6, 7, 8]
    for sender in senders:
        sender.call("send", "tpn", src, to=receiver.key_name if reads else None)
    wait_announced(receiver, "tpn", reads, senders=2)
    receiver.call("receive", "tpn", dst)
    outcome = receiver.call("wait", "tpn")
    assert outcome["state"] == "completed", outcome
    assert outcome["metrics"]["writers"] == 2
    got = receiver.call("blocks", dst)
    for shard, sender in zip(shards, senders):
        assert sender.call("wait", "tpn")["state"] == "completed"
        part = sender.call("blocks", src)
        for head in shard.heads:
            assert same_bits(got[:, :, :, head], part[:, :, :, head - shard.first_head]), f"head {head}"
    assert receiver.call("stats")["reads"] == (2 if reads else 0)


@MODES
def test_pipeline_stages_feed_one_receiver_layer_by_layer(workers, reads):
    stages = [LAYOUT.shard(pp_size=2, pp_rank=r) for r in range(2)]
    senders = [workers(f"pp-prefill{r}", layout=s.to_wire(), seed=40 + r, allow_reads=reads) for r, s in enumerate(stages)]
    receiver = workers("pp-decode", layout=LAYOUT.to_wire(), seed=50)
    for sender in senders:
        receiver.call("connect", sender.address)
    src, dst = [10, 11, 12], [20, 21, 30]
    for sender in senders:
        sender.call("send", "pp", src, to=receiver.key_name if reads else None)
    wait_announced(receiver, "pp", reads, senders=2)
    receiver.call("receive", "pp", dst)
    outcome = receiver.call("wait", "pp")
    assert outcome["state"] == "completed", outcome
    got = receiver.call("blocks", dst)
    for stage, sender in zip(stages, senders):
        part = sender.call("blocks", src)
        assert same_bits(got[:, stage.layers.start : stage.layers.stop], part)
    assert receiver.call("stats")["reads"] == (2 if reads else 0)
