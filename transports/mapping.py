"""Which bytes of a sender's blocks land where in a receiver's blocks.

Two ranks with different tensor- or pipeline-parallel sizes overlap in a rectangle of (layers x kv heads).
:func:`map_ranks` computes, for whole groups of senders and receivers, which ranks overlap and how many
writers each receiver waits for; :func:`block_segments` turns one overlap into byte runs inside a block;
:func:`plan_descriptors` expands those runs over a request's blocks and coalesces adjacent runs, so that
a request becomes as few NIXL descriptors as its memory allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .layout import KVLayout

#: Requests up to this many blocks are planned in plain Python (faster than numpy at this size).
_SMALL_REQUEST = 64


@dataclass(frozen=True)
class Overlap:
    """The model layers and kv heads two pools both hold."""

    layers: range
    heads: range

    @property
    def area(self) -> int:
        """Number of (layer, head) cells shared."""
        return len(self.layers) * len(self.heads)


def _intersect(a: range, b: range) -> range:
    return range(max(a.start, b.start), min(a.stop, b.stop))


def overlap(sender: KVLayout, receiver: KVLayout) -> Overlap | None:
    """Return the layers and heads ``sender`` can supply to ``receiver``, or ``None`` if disjoint.

    Raises ``ValueError`` if the two layouts disagree on the shape of a head (tokens per block, head
    dim, dtype): such pools cannot exchange blocks at all, and silently skipping them would hang the
    receiver.
    """
    mismatched = [
        f"{field}: {getattr(sender, field)} vs {getattr(receiver, field)}"
        for field in ("tokens_per_block", "head_dim", "dtype")
        if getattr(sender, field) != getattr(receiver, field)
    ]
    if mismatched:
        raise ValueError("sender and receiver layouts are incompatible (" + "; ".join(mismatched) + ")")
    layers = _intersect(sender.layers, receiver.layers)
    heads = _intersect(sender.heads, receiver.heads)
    if not layers or not heads:
        return None
    return Overlap(layers, heads)


@dataclass(frozen=True)
class RankMapping:
    """Which senders write to which receivers.

    ``writers[r]`` lists the sender indices whose bytes receiver ``r`` waits for; ``readers[s]`` lists
    the receivers sender ``s`` serves. Each receiver's layers x heads are covered exactly once.
    """

    senders: tuple[KVLayout, ...]
    receivers: tuple[KVLayout, ...]
    writers: tuple[tuple[int, ...], ...]
    readers: tuple[tuple[int, ...], ...]

    def overlap(self, sender: int, receiver: int) -> Overlap | None:
        """The overlap of one sender with one receiver."""
        return overlap(self.senders[sender], self.receivers[receiver])


def map_ranks(senders: Sequence[KVLayout], receivers: Sequence[KVLayout]) -> RankMapping:
    """Compute which sender ranks overlap which receiver ranks (TP and PP sizes may differ).

    Raises ``ValueError`` when a receiver would be left with layers or heads nobody writes, or would be
    written twice, since either would corrupt or hang a transfer rather than fail it.
    """
    if not senders or not receivers:
        raise ValueError("map_ranks needs at least one sender and one receiver")
    writers: list[tuple[int, ...]] = []
    readers: list[list[int]] = [[] for _ in senders]
    for r, receiver in enumerate(receivers):
        mine: list[int] = []
        covered = 0
        for s, sender in enumerate(senders):
            shared = overlap(sender, receiver)
            if shared is None:
                continue
            mine.append(s)
            readers[s].append(r)
            covered += shared.area
        needed = receiver.num_layers * receiver.kv_heads
        if covered < needed:
            raise ValueError(
                f"receiver {r} holds layers {receiver.layers.start}-{receiver.layers.stop - 1} and heads "
                f"{receiver.heads.start}-{receiver.heads.stop - 1}, but the senders cover only "
                f"{covered} of its {needed} (layer, head) cells"
            )
        if covered > needed:
            raise ValueError(f"receiver {r} would be written by overlapping senders {mine}")
        writers.append(tuple(mine))
    return RankMapping(tuple(senders), tuple(receivers), tuple(writers), tuple(tuple(x) for x in readers))


@dataclass(frozen=True)
class BlockSegments:
    """The byte runs one block contributes, within the block."""

    runs: np.ndarray
    """``(offset in sender block, offset in receiver block, length)`` rows, merged, as int64."""
    unmerged: int
    """Runs per block before merging: one per (layer, K/V), what a layer-wise mover would post."""


def block_segments(sender: KVLayout, receiver: KVLayout) -> BlockSegments:
    """Byte runs of one block that ``sender`` writes into ``receiver``'s block.

    Runs are already merged where both sides are adjacent: equal layouts give one run of a whole
    block; a head split gives one run per (layer, K/V). Disjoint layouts give no runs.
    """
    shared = overlap(sender, receiver)
    if shared is None:
        return BlockSegments(np.zeros((0, 3), dtype=np.int64), 0)
    runs = []
    length = len(shared.heads) * sender.head_bytes
    for layer in shared.layers:
        for kv in (0, 1):
            src = (layer - sender.first_layer) * sender.layer_bytes + kv * sender.kv_bytes + (shared.heads.start - sender.first_head) * sender.head_bytes
            dst = (
                (layer - receiver.first_layer) * receiver.layer_bytes
                + kv * receiver.kv_bytes
                + (shared.heads.start - receiver.first_head) * receiver.head_bytes
            )
            runs.append((src, dst, length))
    return BlockSegments(coalesce(np.asarray(runs, dtype=np.int64)), len(runs))


def coalesce(runs: np.ndarray) -> np.ndarray:
    """Merge consecutive rows ``(src, dst, length)`` that are adjacent on both sides."""
    if len(runs) <= 1:
        return runs
    src, dst, length = runs[:, 0], runs[:, 1], runs[:, 2]
    ends_src = src[:-1] + length[:-1]
    ends_dst = dst[:-1] + length[:-1]
    breaks = np.flatnonzero((src[1:] != ends_src) | (dst[1:] != ends_dst)) + 1
    starts = np.concatenate(([0], breaks))
    merged = np.empty((len(starts), 3), dtype=np.int64)
    merged[:, 0] = src[starts]
    merged[:, 1] = dst[starts]
    merged[:, 2] = np.add.reduceat(length, starts)
    return merged


@dataclass(frozen=True)
class DescriptorPlan:
    """The byte runs of one request, before and after coalescing."""

    runs: np.ndarray
    """``(src address, dst address, length)`` rows after coalescing, as int64."""
    descriptors_before: int
    """Runs a naive per-block, per-segment transfer would post."""

    @property
    def descriptors(self) -> int:
        """Descriptors after coalescing."""
        return len(self.runs)

    @property
    def nbytes(self) -> int:
        """Bytes moved."""
        return int(self.runs[:, 2].sum()) if len(self.runs) else 0


def plan_descriptors(
    segments: BlockSegments,
    src_blocks: Sequence[int] | np.ndarray,
    dst_blocks: Sequence[int] | np.ndarray,
    *,
    src_base: int,
    src_block_bytes: int,
    dst_base: int,
    dst_block_bytes: int,
) -> DescriptorPlan:
    """Expand per-block ``segments`` over block pairs and coalesce into as few runs as possible.

    Pairs are sorted by source block first, so that runs of adjacent blocks merge whatever order the
    request listed them in.
    """
    if len(src_blocks) != len(dst_blocks):
        raise ValueError(f"{len(src_blocks)} source blocks vs {len(dst_blocks)} destination blocks")
    seg = segments.runs
    if len(seg) == 1 and len(src_blocks) <= _SMALL_REQUEST:
        # The common case (same heads on both sides, a short request) in plain Python: numpy's
        # per-call overhead would dominate the request's latency.
        src_off, dst_off, length = (int(x) for x in seg[0])
        merged: list[list[int]] = []
        for s, d in sorted(zip(map(int, src_blocks), map(int, dst_blocks))):
            a = src_base + s * src_block_bytes + src_off
            b = dst_base + d * dst_block_bytes + dst_off
            if merged and merged[-1][0] + merged[-1][2] == a and merged[-1][1] + merged[-1][2] == b:
                merged[-1][2] += length
            else:
                merged.append([a, b, length])
        runs_small = np.array(merged, dtype=np.int64).reshape(-1, 3)
        return DescriptorPlan(runs=runs_small, descriptors_before=len(src_blocks) * segments.unmerged)
    src = np.asarray(src_blocks, dtype=np.int64)
    dst = np.asarray(dst_blocks, dtype=np.int64)
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    k = len(seg)
    runs = np.empty((len(src) * k, 3), dtype=np.int64)
    runs[:, 0] = (src_base + src[:, None] * src_block_bytes + seg[None, :, 0]).reshape(-1)
    runs[:, 1] = (dst_base + dst[:, None] * dst_block_bytes + seg[None, :, 1]).reshape(-1)
    runs[:, 2] = np.broadcast_to(seg[None, :, 2], (len(src), k)).reshape(-1)
    return DescriptorPlan(runs=coalesce(runs), descriptors_before=len(src) * segments.unmerged)
