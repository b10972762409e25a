"""Mooncake Transfer Engine on the transfer benchmark's payloads: the anchor issue 13 keeps kvpolicy
ahead of ("Mooncake Transfer Engine (TCP, same payloads)").

Two processes, as for NIXL: each holds buffers the size of the benchmark's pools and one Mooncake
``TransferEngine`` on its TCP transport, with peer-to-peer handshakes (no metadata server). The
sender writes each payload's blocks into the receiver's with ``transfer_sync_write`` (one run of
adjacent blocks) or ``batch_transfer_sync_write`` (one entry per block), timed around the call; the
receiver's blocks are then compared with the sender's, block by block.

Optional: the ``bench`` extra installs ``mooncake-transfer-engine-non-cuda`` (its CUDA build needs
libcudart), which loads only where ``libibverbs1``, ``librdmacm1`` and ``libnuma1`` are installed
(Debian: ``apt-get install libibverbs1 librdmacm1 libnuma1``; no RDMA device is used). Without
them the benchmark reports Mooncake as skipped, with the reason.

Transports differ on one host: NIXL (UCX) copies with CMA, Mooncake's TCP transport over loopback.
Across two network namespaces (``--hosts netns``) NIXL runs on TCP too; see the README.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from typing import Any


def _rank(role: str, conn: Any, sizes: dict[str, tuple[int, int]], payloads: list[Any], placement: dict[str, Any]) -> None:
    """One process: buffers of ``{kind: (blocks, block bytes)}`` and a Mooncake engine on TCP, in
    ``placement["netns"]`` (entered first) and on ``placement["host"]`` when given."""
    import os

    if placement.get("netns"):
        from tests.testbed import enter_namespace

        enter_namespace(placement["netns"])
    import numpy as np

    os.environ.setdefault("GLOG_minloglevel", "2")  # Mooncake logs every handshake at INFO

    try:
        from mooncake.engine import TransferEngine
    except Exception as exc:  # not installed, or a system library it links is missing
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    engine = TransferEngine()
    host = placement.get("host", "127.0.0.1")
    if engine.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
        conn.send({"error": "TransferEngine.initialize on tcp failed"})
        return
    pools = {kind: np.zeros(blocks * block_bytes, dtype=np.uint8) for kind, (blocks, block_bytes) in sizes.items()}
    if role == "sender":  # distinct contents per block, as the NIXL ranks have
        for kind, pool in pools.items():
            blocks = sizes[kind][0]
            pool.view(np.int16).reshape(blocks, -1)[:] = np.arange(blocks, dtype=np.int16)[:, None]
    for kind, pool in pools.items():
        if engine.register_memory(pool.ctypes.data, pool.nbytes) != 0:
            conn.send({"error": f"TransferEngine.register_memory failed for the {kind} pool"})
            return
    conn.send({"address": f"{host}:{engine.get_rpc_port()}", "bases": {k: p.ctypes.data for k, p in pools.items()}})
    plans: dict[str, tuple[list[int], list[int], list[int]]] = {}
    target = ""
    while True:
        op, args = conn.recv()
        if op == "peer":  # sender: the receiver's address and pool addresses; plan each payload once
            target, bases = args["address"], args["bases"]
            for payload in payloads:
                block_bytes = sizes[payload.layout][1]
                src_base, dst_base = pools[payload.layout].ctypes.data, bases[payload.layout]
                if payload.contiguous:
                    plans[payload.name] = ([src_base + payload.src[0] * block_bytes], [dst_base + payload.dst[0] * block_bytes], [payload.nbytes])
                else:
                    plans[payload.name] = (
                        [src_base + b * block_bytes for b in payload.src],
                        [dst_base + b * block_bytes for b in payload.dst],
                        [block_bytes] * len(payload.src),
                    )
            result: Any = None
        elif op == "write":  # sender: one payload, timed
            src, dst, lengths = plans[args]
            t0 = time.perf_counter()
            if len(src) == 1:
                status = engine.transfer_sync_write(target, src[0], dst[0], lengths[0])
            else:
                status = engine.batch_transfer_sync_write(target, src, dst, lengths)
            result = time.perf_counter() - t0
            if status != 0:
                raise RuntimeError(f"Mooncake write of {args!r} returned {status}")
        elif op == "digests":  # (kind, blocks): a digest per block
            kind, blocks = args
            block_bytes = sizes[kind][1]
            view = memoryview(pools[kind])
            result = [hashlib.blake2b(view[b * block_bytes : (b + 1) * block_bytes], digest_size=16).digest() for b in blocks]
        elif op == "exit":
            conn.send(None)
            return
        else:
            raise ValueError(op)
        conn.send(result)


def bench_mooncake(
    payloads: list[Any],
    pools: dict[str, tuple[int, int]],
    reps: int,
    rank_class: Any,
    placements: tuple[dict[str, Any], dict[str, Any]] = ({}, {}),
) -> dict[str, Any]:
    """Mooncake's time for each payload (median of ``reps`` after one warm-up) and whether every
    block arrived intact; ``{"skipped": reason}`` where Mooncake cannot load or start here.
    ``pools``: ``{kind: (blocks, block bytes)}``; ``rank_class``: the benchmark's process handle;
    ``placements``: the sender's and the receiver's network namespace and address (loopback if none)."""
    try:
        import mooncake.engine  # noqa: F401  (loads its libraries: a missing one is the reason)
    except Exception as exc:
        return {"skipped": f"mooncake.engine does not load: {type(exc).__name__}: {exc}"}
    from importlib.metadata import PackageNotFoundError, version

    release = "unknown"
    for name in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"):
        try:
            release = version(name)
            break
        except PackageNotFoundError:
            continue
    sender = rank_class("sender", pools, payloads, placements[0], target=_rank)
    receiver = rank_class("receiver", pools, payloads, placements[1], target=_rank)
    try:
        for rank in (sender, receiver):
            if "error" in rank.info:
                return {"skipped": f"Mooncake's {rank.role} did not start: {rank.info['error']}"}
        sender("peer", receiver.info)
        results: dict[str, Any] = {}
        for payload in payloads:
            times = [sender("write", payload.name) for _ in range(reps + 1)][1:]
            median = statistics.median(times)
            identical = sender("digests", (payload.layout, list(payload.src))) == receiver("digests", (payload.layout, list(payload.dst)))
            results[payload.name] = {"mooncake_us": median * 1e6, "mooncake_gbps": payload.nbytes / median / 1e9, "bit_identical": identical}
        where = "across " + placements[0]["host"] + " -> " + placements[1]["host"] if placements[0].get("host") else "loopback"
        return {"version": release, "transport": f"tcp ({where})", "payloads": results}
    finally:
        receiver.stop()
        sender.stop()
