"""Building NIXL WRITEs (and a receiver's READs): by index into descriptor lists prepared once per side (whole blocks), or
from the planned, coalesced runs (any head or layer split).

A whole-block transfer handle that finished cleanly is kept per receiver and block lists (a bounded
LRU, :data:`KEPT_PER_PEER`) and posted again the next time the same blocks go to the same blocks:
making one costs several times the write of a small block. A handle is reused only once NIXL
reported it done, never while it is in flight; one that failed or was aborted is released.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .local import LocalSide, quietly
from .peers import Remote

KEPT_PER_PEER = 256
"""Finished transfer handles kept per receiver for reuse."""
_KEPT_BLOCKS = 64
"""Requests of more blocks are not kept (their handles are rarely asked for twice)."""


class WritePoster:
    """Makes the transfer handle of one write (or, with ``op="READ"``, read); owns the local prepared list."""

    def __init__(self, local: LocalSide, op: str) -> None:
        self.local = local
        self.op = op
        self._local_prepped: Any = None
        self._in_use: dict[int, tuple[Remote, tuple]] = {}
        """Handles in flight that may be kept when they finish: ``id(handle) -> (receiver, key)``."""

    def whole_blocks(self, remote: Remote, source: Sequence[int], destination: Sequence[int]) -> Any:
        """Whole blocks to whole blocks: by index into descriptor lists prepared once per side.
        ``source`` are local blocks, ``destination`` the remote's (a READ moves them the other way)."""
        agent, pool = self.local.agent, self.local.pool
        if self._local_prepped is None:
            self._local_prepped = agent.prep_xfer_dlist(
                "NIXL_INIT_AGENT", block_descriptors(pool.base_address, pool.block_bytes, pool.num_blocks, pool.device_id), pool.memory_type
            )
        if remote.prepped is None:
            rank = remote.rank
            remote.prepped = agent.prep_xfer_dlist(
                rank.agent, block_descriptors(rank.base_address, rank.layout.block_bytes, rank.num_blocks, rank.device_id), rank.memory_type
            )
        key = (tuple(source), tuple(destination)) if len(source) <= _KEPT_BLOCKS else None
        xfer = remote.kept.pop(key, None) if key is not None else None
        if xfer is None:
            xfer = agent.make_prepped_xfer(
                self.op, self._local_prepped, np.asarray(source, dtype=np.int32), remote.prepped, np.asarray(destination, dtype=np.int32)
            )
        if key is not None:
            self._in_use[id(xfer)] = (remote, key)
        return xfer

    def finished(self, xfer: Any, *, ok: bool) -> None:
        """A write is over: keep its handle for the same blocks again (``ok``: NIXL said done), or
        release it."""
        remote, key = self._in_use.pop(id(xfer), (None, None))
        if ok and remote is not None and not remote.gone and key not in remote.kept:
            remote.kept[key] = xfer
            if len(remote.kept) > KEPT_PER_PEER:
                _, xfer = remote.kept.popitem(last=False)
            else:
                return
        release(xfer, self.local.name)

    def abort(self, xfer: Any) -> bool:
        """Stop a transfer in flight: True only if NIXL released it (then nothing more of it moves,
        and its handle is never kept); False while NIXL still holds it (it ends when NIXL reports)."""
        try:
            xfer.release()
        except Exception:
            return False
        self._in_use.pop(id(xfer), None)
        return True

    def runs(self, remote: Remote, plan: Any) -> Any:
        """Any overlap (head or layer splits): the planned, coalesced runs as one descriptor list."""
        agent, runs = self.local.agent, plan.runs
        mine, theirs = (0, 1) if self.op == "WRITE" else (1, 0)  # (the plan's source is a READ's remote)
        local = np.empty((len(runs), 3), dtype=np.uint64)
        local[:, 0], local[:, 1], local[:, 2] = runs[:, mine], runs[:, 2], self.local.pool.device_id
        far = np.empty((len(runs), 3), dtype=np.uint64)
        far[:, 0], far[:, 1], far[:, 2] = runs[:, theirs], runs[:, 2], remote.rank.device_id
        return agent.initialize_xfer(
            self.op, agent.get_xfer_descs(local, self.local.pool.memory_type), agent.get_xfer_descs(far, remote.rank.memory_type), remote.rank.agent
        )

    def close(self) -> None:
        """Release the local prepared list (the remote ones go with their peers)."""
        if self._local_prepped is not None:
            quietly(self.local.name, "the local prepared list", self.local.agent.release_dlist_handle, self._local_prepped)
            self._local_prepped = None


class WholeBlockPlan(NamedTuple):
    """What a whole-block write moves, counted without building its runs (NIXL merges them)."""

    nbytes: int
    descriptors_before: int
    descriptors: int


def whole_block_plan(remote: Remote, source: Sequence[int], destination: Sequence[int]) -> WholeBlockPlan:
    """Bytes and descriptors of whole blocks to whole blocks: pairs adjacent on both sides merge,
    as :func:`~.mapping.plan_descriptors` would count them."""
    n = len(source)
    if n <= 1:
        return WholeBlockPlan(n * remote.rank.layout.block_bytes, n * remote.segments.unmerged, n)
    pairs = sorted(zip(source, destination))
    runs = 1 + sum(1 for (s0, d0), (s1, d1) in zip(pairs, pairs[1:]) if s1 != s0 + 1 or d1 != d0 + 1)
    return WholeBlockPlan(n * remote.rank.layout.block_bytes, n * remote.segments.unmerged, runs)


def transfer_error(agent: Any, xfer: Any, what: str) -> str | None:
    """Where a transfer stands: None while NIXL still moves it, "" once done, else why it failed."""
    try:
        status = agent.check_xfer_state(xfer)
    except Exception as exc:
        return str(exc)
    if status == "PROC":
        return None
    return "" if status == "DONE" else f"NIXL reported an error during the {what}"


def release(xfer: Any, name: str) -> None:
    """Release a transfer handle; a failed transfer may refuse (the agent retries later)."""
    quietly(name, "a finished write", xfer.release)


def block_descriptors(base: int, block_bytes: int, num_blocks: int, device_id: int) -> np.ndarray:
    """One (address, length, device) row per block of a pool (bounds were checked at the hello)."""
    descriptors = np.empty((num_blocks, 3), dtype=np.uint64)
    descriptors[:, 0] = base + np.arange(num_blocks, dtype=np.uint64) * np.uint64(block_bytes)
    descriptors[:, 1] = block_bytes
    descriptors[:, 2] = device_id
    return descriptors
