"""Layouts, rank overlap and descriptor planning: pure functions, checked as properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.transports import KVLayout, block_segments, map_ranks, plan_descriptors
from kvpolicy.transports.mapping import coalesce

LLAMA = KVLayout(num_layers=32, kv_heads=8, tokens_per_block=32, head_dim=128, dtype="bfloat16")


def test_llama_block_sizes():
    assert LLAMA.block_bytes == 4 << 20
    assert LLAMA.layer_bytes == 128 << 10
    assert LLAMA.block_shape == (32, 2, 8, 32, 128)


def test_layout_rejects_bad_input():
    with pytest.raises(ValueError, match="num_layers"):
        KVLayout(num_layers=0, kv_heads=8, tokens_per_block=32, head_dim=128)
    with pytest.raises(ValueError, match="dtype"):
        KVLayout(num_layers=1, kv_heads=8, tokens_per_block=32, head_dim=128, dtype="complex64")
    with pytest.raises(ValueError, match="split evenly"):
        LLAMA.shard(tp_size=3, tp_rank=0)
    with pytest.raises(ValueError, match="layout fields"):
        KVLayout.from_wire({"num_layers": 1})


def test_layout_wire_round_trip():
    shard = LLAMA.shard(tp_size=2, tp_rank=1, pp_size=4, pp_rank=3)
    assert KVLayout.from_wire(shard.to_wire()) == shard
    assert shard.heads == range(4, 8) and shard.layers == range(24, 32)


def test_same_layout_is_one_run_per_block():
    segments = block_segments(LLAMA, LLAMA)
    assert segments.runs.tolist() == [[0, 0, LLAMA.block_bytes]]
    assert segments.unmerged == 64


def test_head_split_is_one_run_per_layer_and_kv():
    half = LLAMA.shard(tp_size=2, tp_rank=1)
    segments = block_segments(LLAMA, half)
    assert len(segments.runs) == 64
    assert set(segments.runs[:, 2].tolist()) == {4 * LLAMA.head_bytes}
    # the first run starts at head 4 of layer 0's K in the sender, at 0 in the receiver
    assert segments.runs[0].tolist() == [4 * LLAMA.head_bytes, 0, 4 * LLAMA.head_bytes]


def test_layer_split_is_one_run_per_block():
    stage = LLAMA.shard(pp_size=4, pp_rank=2)
    segments = block_segments(stage, LLAMA)
    assert segments.runs.tolist() == [[0, 16 * LLAMA.layer_bytes, stage.block_bytes]]


def test_incompatible_layouts_are_refused():
    other = KVLayout(num_layers=32, kv_heads=8, tokens_per_block=16, head_dim=128)
    with pytest.raises(ValueError, match="tokens_per_block"):
        block_segments(LLAMA, other)


def test_map_ranks_tp_one_to_many_and_many_to_one():
    shards = [LLAMA.shard(tp_size=4, tp_rank=r) for r in range(4)]
    fan_out = map_ranks([LLAMA], shards)
    assert fan_out.writers == ((0,), (0,), (0,), (0,))
    assert fan_out.readers == ((0, 1, 2, 3),)
    fan_in = map_ranks(shards, [LLAMA])
    assert fan_in.writers == ((0, 1, 2, 3),)


def test_map_ranks_tp2_to_tp4_and_pp():
    senders = [LLAMA.shard(tp_size=2, tp_rank=r, pp_size=2, pp_rank=p) for p in range(2) for r in range(2)]
    receivers = [LLAMA.shard(tp_size=4, tp_rank=r) for r in range(4)]
    mapping = map_ranks(senders, receivers)
    # receiver 0 holds heads 0-1 of all layers: written by the tp-rank-0 sender of each stage
    assert mapping.writers[0] == (0, 2)
    assert mapping.writers[3] == (1, 3)


def test_map_ranks_refuses_gaps_and_double_writes():
    with pytest.raises(ValueError, match="cover only"):
        map_ranks([LLAMA.shard(tp_size=2, tp_rank=0)], [LLAMA])
    with pytest.raises(ValueError, match="overlapping senders"):
        map_ranks([LLAMA, LLAMA], [LLAMA])


def _expand(runs: np.ndarray) -> dict[int, int]:
    """Byte-level map src address -> dst address (small sizes only)."""
    mapping = {}
    for src, dst, length in runs.tolist():
        for i in range(length):
            mapping[src + i] = dst + i
    return mapping


small_layouts = st.builds(
    lambda layers, heads, tokens: KVLayout(num_layers=layers, kv_heads=heads, tokens_per_block=tokens, head_dim=2),
    st.integers(1, 4),
    st.sampled_from([1, 2, 4]),
    st.integers(1, 3),
)


@settings(max_examples=60, deadline=None)
@given(
    layout=small_layouts,
    tp=st.sampled_from([1, 2, 4]),
    pairs=st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15)), min_size=1, max_size=10, unique_by=(lambda p: p[0], lambda p: p[1])),
)
def test_coalescing_never_changes_which_bytes_go_where(layout, tp, pairs):
    if layout.kv_heads % tp:
        tp = 1
    receiver = layout.shard(tp_size=tp, tp_rank=tp - 1)
    segments = block_segments(layout, receiver)
    src = [p[0] for p in pairs]
    dst = [p[1] for p in pairs]
    plan = plan_descriptors(
        segments, src, dst, src_base=1000, src_block_bytes=layout.block_bytes, dst_base=0, dst_block_bytes=receiver.block_bytes
    )
    assert plan.nbytes == len(pairs) * receiver.block_bytes
    assert plan.descriptors <= plan.descriptors_before
    uncoalesced = np.array(
        [
            (1000 + s * layout.block_bytes + a, d * receiver.block_bytes + b, n)
            for s, d in pairs
            for a, b, n in segments.runs.tolist()
        ],
        dtype=np.int64,
    )
    assert _expand(plan.runs) == _expand(uncoalesced)
    # nothing left that could still merge
    assert len(coalesce(plan.runs)) == plan.descriptors


def test_adjacent_blocks_merge_whatever_the_request_order():
    plan = plan_descriptors(
        block_segments(LLAMA, LLAMA), [5, 3, 4], [12, 10, 11], src_base=0, src_block_bytes=LLAMA.block_bytes,
        dst_base=0, dst_block_bytes=LLAMA.block_bytes,
    )
    assert plan.descriptors == 1 and plan.descriptors_before == 3 * 64


def test_block_ids_are_ints_in_range_and_distinct():
    """A pool takes block ids as ints (numpy's too); a float or a string is refused, not truncated."""
    from kvpolicy.transports import BlockPool

    pool = BlockPool(KVLayout(num_layers=1, kv_heads=1, tokens_per_block=4, head_dim=8), 8, huge_pages=False)
    assert pool.check_blocks([3, 1]) == [3, 1]
    assert pool.check_blocks(np.array([2, 5])) == [2, 5]
    assert all(type(b) is int for b in pool.check_blocks(np.array([2, 5])))
    for bad, match in (([1.5], "must be ints"), (["3"], "must be ints"), ([True], "must be ints"),
                       ([8], "out of range"), ([-1], "out of range"), ([2, 2], "distinct")):
        with pytest.raises(ValueError, match=match):
            pool.check_blocks(bad)
