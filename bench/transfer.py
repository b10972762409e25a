"""KV block transfer, four ways, side by side in one run.

    python bench/transfer.py [--quick] [--format table|json] [--device cpu|cuda] [--hosts same|netns]

1. torch: ``copy_`` (contiguous) and a per-block ``copy_`` loop / ``index_copy_`` (scattered) inside one
   process: the memory-bandwidth limit of this machine.
2. raw NIXL: two processes, two agents, the payload's descriptor list built once; each repetition
   re-posts the same transfer handle (WRITE) and polls it to completion.
3. kvpolicy: two processes with a :class:`NixlTransceiver` each; each repetition is one request,
   end to end: the decode side's ``receive()`` -> request frame -> coalesced WRITE -> result frame.
4. Mooncake Transfer Engine (optional, :mod:`mooncake_te`): two processes, its TCP transport, the same
   payloads written block for block (``mooncake_gbps``, ``transceiver_vs_mooncake``); reported as
   skipped, with the reason, where it is not installed or cannot load.

Payloads (Llama-3.1-8B cache shape: 32 layers, 8 kv heads, head dim 128, 32 tokens per block, bf16,
4 MiB per block, 128 KiB per block and layer):

- contiguous: 64 MiB (16 adjacent blocks)
- scattered-64: 64 randomly scattered blocks (256 MiB)
- scattered-512: 512 randomly scattered blocks (2 GiB; full run only), and 512 randomly scattered
  128 KiB block-layers (64 MiB, a layer-split pool) in both runs
- one-block: a single 4 MiB block, for per-request overhead

The request path, on 4 KiB blocks with CURVE on (``--format json`` keys): ``request_overhead_us`` (p50
of one request end to end minus the p50 raw NIXL write of the same block, interleaved),
``zmq_rtt_us`` (a bare pyzmq DEALER -> ROUTER round trip between the two ranks, CURVE on, no
transceiver), ``overhead_in_rtts`` (the first over the second), ``rps_1`` / ``rps_8`` / ``rps_64``
(requests per second with that many in flight), and ``idle_cpu_pct``: the CPU of an idle, connected
pair of processes holding one transceiver each, per transceiver (the larger of the two), in % of a core;
``connect_ms`` / ``connect_p90_ms`` / ``connect_in_zmq_rtts``: one ``connect()`` to a sender (hello,
metadata loaded, proof nonce sent as a NIXL notification and echoed, welcome), 20 times, with
metadata the sender loaded before; ``first_connect_ms``: the first connect of a pair (the metadata
is new: the probe's helper process starts and a forked child loads it first).

``--hosts netns`` (root, iproute2) runs 2. and 3. twice more, next to the same-host figures: with UCX
on TCP over loopback in one namespace (what TCP costs on one host), and with the two processes in
two network namespaces joined by a veth pair, UCX on TCP over the veth device: the bytes cross a real
link (its byte counters are reported). Only the namespaces' own addresses (10.231.7.0/24) are used.

Ratios compare figures measured in this run; figures themselves move 15-25% between runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mooncake_te import bench_mooncake

# tests.testbed (network namespaces for --hosts netns) lives in the repository, not in the package;
# spawned ranks inherit this sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# UCX reads these when NIXL loads it; children inherit them. See transports/agent.py for why.
for _key, _value in (("UCX_NET_DEVICES", "lo"), ("UCX_MODULES", "^ib"), ("UCX_CMA_SEG_SIZE", "8M"), ("NIXL_LOG_LEVEL", "WARN")):
    os.environ.setdefault(_key, _value)

MIB = 1 << 20
LLAMA = dict(num_layers=32, kv_heads=8, tokens_per_block=32, head_dim=128, dtype="bfloat16")
LLAMA_LAYER = dict(LLAMA, num_layers=1)
#: 4 KiB blocks (1 layer, K and V, 1 head, 16 tokens, head dim 64, bf16): the request path's cost
#: with next to no payload.
SMALL = dict(num_layers=1, kv_heads=1, tokens_per_block=16, head_dim=64, dtype="bfloat16")
BLOCK_BYTES = {"block": 4 * MIB, "layer": 128 * 1024, "small": 4096}


@dataclass(frozen=True)
class Payload:
    """One payload: which pool (layout) and which blocks move where."""

    name: str
    layout: str  # "block" (4 MiB blocks), "layer" (128 KiB block-layers) or "small" (4 KiB blocks)
    src: tuple[int, ...]
    dst: tuple[int, ...]

    @property
    def block_bytes(self) -> int:
        return BLOCK_BYTES[self.layout]

    @property
    def nbytes(self) -> int:
        return len(self.src) * self.block_bytes

    @property
    def contiguous(self) -> bool:
        """Several blocks, adjacent on both sides: one run, moved as one descriptor."""
        def run(blocks: tuple[int, ...]) -> bool:
            return blocks == tuple(range(blocks[0], blocks[0] + len(blocks)))

        return len(self.src) > 1 and run(self.src) and run(self.dst)


def make_payloads(quick: bool, block_pool: int, layer_pool: int, seed: int = 0) -> list[Payload]:
    import random

    rng = random.Random(seed)
    payloads = [
        Payload("contiguous 64 MiB", "block", tuple(range(16)), tuple(range(16))),
        Payload("scattered 64 x 4 MiB", "block", tuple(rng.sample(range(block_pool), 64)), tuple(rng.sample(range(block_pool), 64))),
    ]
    if not quick:
        payloads.append(
            Payload("scattered 512 x 4 MiB", "block", tuple(rng.sample(range(block_pool), 512)), tuple(rng.sample(range(block_pool), 512)))
        )
    payloads.append(
        Payload("scattered 512 x 128 KiB", "layer", tuple(rng.sample(range(layer_pool), 512)), tuple(rng.sample(range(layer_pool), 512)))
    )
    payloads.append(Payload("one block (4 MiB)", "block", (7,), (9,)))
    return payloads


# ----------------------------------------------------------------------------- torch, in-process ----


def bench_torch(payloads: list[Payload], block_pool: int, layer_pool: int, reps: int, device: str) -> dict[str, dict[str, float]]:
    import torch

    from kvpolicy.transports import BlockPool, KVLayout

    results: dict[str, dict[str, float]] = {}
    for kind, layout, blocks in (("block", LLAMA, block_pool), ("layer", LLAMA_LAYER, layer_pool)):
        src = BlockPool(KVLayout(**layout), blocks, device=device)
        dst = BlockPool(KVLayout(**layout), blocks, device=device)
        src.tensor.view(torch.uint8).fill_(1)
        flat_src = src.tensor.view(blocks, -1)
        flat_dst = dst.tensor.view(blocks, -1)
        for payload in [p for p in payloads if p.layout == kind]:
            sidx = torch.tensor(payload.src, device=flat_src.device)
            didx = torch.tensor(payload.dst, device=flat_src.device)

            def loop() -> None:
                if payload.contiguous:
                    flat_dst[payload.dst[0] : payload.dst[0] + len(payload.dst)].copy_(flat_src[payload.src[0] : payload.src[0] + len(payload.src)])
                else:
                    for s, d in zip(payload.src, payload.dst):
                        flat_dst[d].copy_(flat_src[s])

            def index_copy() -> None:
                flat_dst.index_copy_(0, didx, flat_src.index_select(0, sidx))

            figures = {}
            for label, fn in (("copy", loop), ("index_copy", index_copy)):
                fn()
                times = []
                for _ in range(reps):
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
                figures[label] = payload.nbytes / statistics.median(times) / 1e9
            results[payload.name] = {"gbps": max(figures.values()), **{f"{k}_gbps": v for k, v in figures.items()}}
        del src, dst, flat_src, flat_dst
    return results


# --------------------------------------------------------------------------- the two processes ----


def _pools(block_pool: int, layer_pool: int) -> dict[str, tuple[dict[str, Any], int]]:
    """The bulk benchmark's pools: ``{kind: (layout, number of blocks)}``."""
    return {"block": (LLAMA, block_pool), "layer": (LLAMA_LAYER, layer_pool)}


def wait_for_announcement(tx: Any, request_id: str, timeout_s: float = 2.0) -> bool:
    """Wait (bounded) until the offer of ``request_id`` was announced to ``tx``; True if it had not been yet."""
    if request_id in tx._receiver.reads.offers:
        return False
    deadline = time.monotonic() + timeout_s
    while request_id not in tx._receiver.reads.offers and time.monotonic() < deadline:
        time.sleep(50e-6)
    return True


def _rank(
    role: str,
    conn: Any,
    pool_spec: dict[str, tuple[dict[str, Any], int]],
    device: str,
    payloads: list[Payload],
    placement: dict[str, Any] | None = None,
) -> None:
    """One process: pools, a transceiver per pool, and a raw NIXL agent over the same memory.

    ``placement``: ``netns`` (enter that network namespace first), ``env`` (UCX variables to set or,
    with None, unset before NIXL loads), ``host`` (where the control sockets listen) and ``raw``
    (False: no raw agent, so that an idle process holds only its transceivers)."""
    placement = placement or {}
    if placement.get("netns"):
        from tests.testbed import enter_namespace

        enter_namespace(placement["netns"])
    for key, value in placement.get("env", {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    import numpy as np
    import torch

    from kvpolicy.transports import BlockPool, KVLayout, NixlSettings, NixlTransceiver
    from kvpolicy.transports.agent import create_agent

    pools = {kind: BlockPool(KVLayout(**layout), blocks, device=device) for kind, (layout, blocks) in pool_spec.items()}
    if role == "sender":
        for pool in pools.values():  # cheap, distinct-per-block contents
            pool.tensor.view(pool.num_blocks, -1).view(torch.int16)[:] = torch.arange(pool.num_blocks, dtype=torch.int16)[:, None]
    host = placement.get("host", "127.0.0.1")
    # NIXL's defaults only for what the placement leaves alone (no CMA tuning when UCX runs on TCP).
    env = placement.get("env", {})
    settings = NixlSettings(ucx_env=tuple((k, v) for k, v in NixlSettings().ucx_env if k not in env))
    # CURVE on, as in production: each rank's key pair was made by the parent, both on both allow-lists.
    keys = placement["keys"]
    plaintext = placement.get("plaintext", False)
    # A second transceiver per pool with reads allowed (its own agent over the same memory), measured
    # interleaved with the first: the receiver reads what the sender announced (transports.reads).
    modes = ("writes", "reads") if placement.get("reads", True) and not plaintext else ("writes",)
    by_mode = {
        mode: {
            kind: NixlTransceiver(
                pool, name=f"{role}-{kind}-{mode}", timeout_s=60, host=host, settings=settings,
                identity=keys[role], allowed_peers={r: public for r, (public, _) in keys.items()},
                allow_reads=mode == "reads", allow_roleless_peers=True, _plaintext=plaintext,
            )
            for kind, pool in pools.items()
        }
        for mode in modes
    }
    transceivers = by_mode["writes"]
    raw = create_agent(f"raw-{role}-{os.getpid()}", settings) if placement.get("raw", True) else None
    registrations = [
        raw.register_memory([(p.base_address, p.nbytes, p.device_id, "")], p.memory_type) for p in pools.values()
    ] if raw is not None else []
    conn.send(
        {
            "addresses": {k: t.address for k, t in transceivers.items()},
            "reads_addresses": {k: t.address for k, t in by_mode.get("reads", {}).items()},
            "metadata": raw.get_agent_metadata() if raw is not None else b"",
            "bases": {k: p.base_address for k, p in pools.items()},
        }
    )
    handles: dict[str, Any] = {}
    remote = None
    echo: Echo | None = None
    dealer: Any = None
    try:
        while True:
            op, args = conn.recv()
            if op == "peer":  # sender: learn the receiver's raw agent and build each payload's transfer once
                info = args
                remote = raw.add_remote_agent(info["metadata"])
                for payload in payloads:
                    pool = pools[payload.layout]
                    src = np.asarray(payload.src, dtype=np.uint64) * pool.block_bytes
                    dst = np.asarray(payload.dst, dtype=np.uint64) * pool.block_bytes
                    # a contiguous payload is one descriptor; scattered blocks one each (nothing adjacent)
                    if payload.contiguous:
                        src, dst, length = src[:1], dst[:1], payload.nbytes
                    else:
                        length = pool.block_bytes
                    local = np.stack([src + pool.base_address, np.full(len(src), length, np.uint64), np.zeros(len(src), np.uint64)], 1)
                    far = np.stack([dst + np.uint64(info["bases"][payload.layout]), np.full(len(dst), length, np.uint64), np.zeros(len(dst), np.uint64)], 1)
                    handles[payload.name] = raw.initialize_xfer(
                        "WRITE", raw.get_xfer_descs(local, pool.memory_type), raw.get_xfer_descs(far, pool.memory_type), remote
                    )
                result: Any = None
            elif op == "connect":  # (addresses, mode)
                for kind, address in args[0].items():
                    by_mode[args[1]][kind].connect(address)
                result = None
            elif op == "reconnect":  # (addresses, n): disconnect and connect again n times; seconds each
                addresses, n = args
                times = []
                for kind, address in addresses.items():
                    tx = by_mode["writes"][kind]
                    for _ in range(n):
                        for name in list(tx.peers):
                            tx.disconnect(name)
                        t0 = time.perf_counter()
                        tx.connect(address)
                        times.append(time.perf_counter() - t0)
                result = times
            elif op == "raw":
                handle = handles[args]
                t0 = time.perf_counter()
                state = raw.transfer(handle)
                while state == "PROC":
                    state = raw.check_xfer_state(handle)
                elapsed = time.perf_counter() - t0
                if state != "DONE":
                    raise RuntimeError(f"raw NIXL transfer {state}")
                result = elapsed
            elif op == "offer":  # (payload, request id[, mode])
                payload, request_id, *mode = args
                by_mode[mode[0] if mode else "writes"][payload.layout].send(request_id, payload.src, to=None if plaintext else "receiver")
                result = None
            elif op == "receive":
                payload, request_id, *mode = args
                tx = by_mode[mode[0] if mode else "writes"][payload.layout]
                if mode == ["reads"]:  # timed once the offer's announcement is here, the usual order (see bench_nixl)
                    waited = wait_for_announcement(tx, request_id)
                result = {**tx.receive(request_id, payload.dst).wait().as_dict(), "waited_for_announcement": mode == ["reads"] and waited}
            elif op == "echo":  # sender: a bare CURVE ROUTER echoing every message (zmq_rtt_us)
                echo = Echo(host)
                result = echo.address
            elif op in ("rtt", "rtt_after_idle"):  # receiver: one bare round trip to the sender's echo, timed here
                if op == "rtt_after_idle":  # (echo, seconds): first sleep that long, both sides idle
                    args, idle_s = args
                    time.sleep(idle_s)
                if dealer is None:
                    dealer = dealer_to(*args)
                    dealer.send(b"warm-up")
                    dealer.recv()
                t0 = time.perf_counter()
                dealer.send(b"r" * 128)  # a 4 KiB request frame is ~94 bytes, its result ~134
                dealer.recv()
                result = time.perf_counter() - t0
            elif op == "offer_many":  # sender: offers for ids PREFIX-0 .. PREFIX-(count-1), one block each
                kind, prefix, count, mode = args
                blocks = pools[kind].num_blocks
                for i in range(count):
                    by_mode[mode][kind].send(f"{prefix}-{i}", [i % blocks], to=None if plaintext else "receiver")
                result = None
            elif op == "rps":  # receiver: those requests, `window` in flight at once; requests per second
                kind, prefix, count, window, mode = args
                if mode == "reads":  # (announcements arrive in order: the last one means all)
                    wait_for_announcement(by_mode[mode][kind], f"{prefix}-{count - 1}", 10.0)
                result = requests_per_second(by_mode[mode][kind], prefix, count, window)
            elif op == "cpu":  # CPU seconds of this whole process so far (every thread; ns, not 10 ms ticks)
                result = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
            elif op == "digests":
                kind, blocks = args
                result = pools[kind].digests(blocks)
            elif op == "exit":
                break
            else:
                raise ValueError(op)
            conn.send(result)
    finally:
        if echo is not None:
            echo.close()
        if dealer is not None:
            dealer.close(0)
        for handle in handles.values():
            handle.release()
        for registration in registrations:
            raw.deregister_memory(registration)
        if remote is not None:
            raw.remove_remote_agent(remote)
        for transceiver in transceivers.values():
            transceiver.close()
        conn.send(None)


class Echo:
    """A bare pyzmq ROUTER, a CURVE server as the transceiver's is, echoing every message on a
    thread of its own: the floor a control-message round trip cannot go under."""

    def __init__(self, host: str) -> None:
        import zmq

        self.ctx = zmq.Context()
        public, secret = zmq.curve_keypair()
        self.socket = self.ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.curve_secretkey, self.socket.curve_publickey, self.socket.curve_server = secret, public, True
        port = self.socket.bind_to_random_port(f"tcp://{host}")
        self.address = (f"tcp://{host}:{port}", public)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="echo", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):  # the timeout only bounds how long close() waits
                self.socket.send_multipart(self.socket.recv_multipart())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.socket.close(0)
        self.ctx.term()


def dealer_to(endpoint: str, server_key: bytes) -> Any:
    """A DEALER, a CURVE client with a fresh key pair, connected to an :class:`Echo`."""
    import zmq

    public, secret = zmq.curve_keypair()
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)  # a lost echo fails the benchmark instead of hanging it
    dealer.curve_secretkey, dealer.curve_publickey, dealer.curve_serverkey = secret, public, server_key
    dealer.connect(endpoint)
    return dealer


def requests_per_second(transceiver: Any, prefix: str, count: int, window: int) -> float:
    """Receive requests ``PREFIX-0 .. PREFIX-(count-1)`` (offered already), one block each, keeping
    ``window`` in flight: a new one starts as soon as the oldest ends (they end in order here)."""
    import collections

    free = list(range(transceiver.pool.num_blocks))
    if window > len(free):
        raise ValueError(f"window {window} exceeds the pool's {len(free)} blocks")
    inflight: collections.deque = collections.deque()
    issued = 0
    t0 = time.perf_counter()
    while issued < count or inflight:
        while issued < count and len(inflight) < window:
            block = free.pop()
            inflight.append((transceiver.receive(f"{prefix}-{issued}", [block]), block))
            issued += 1
        handle, block = inflight.popleft()
        handle.wait(60)
        if not handle.wait_released(10):
            raise RuntimeError(f"request {handle.request_id} completed but its block was not released")
        free.append(block)
    return count / (time.perf_counter() - t0)


class Rank:
    """The benchmark's handle on one of the two processes."""

    def __init__(self, role: str, *args: Any, target: Any = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.role = role
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target or _rank, args=(role, child, *args), daemon=True)
        self.process.start()
        self.info = self._recv()

    def _recv(self, timeout: float = 120.0) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError("benchmark rank did not answer")
        return self.conn.recv()

    def __call__(self, op: str, args: Any = None) -> Any:
        self.conn.send((op, args))
        return self._recv()

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self("exit")
            except Exception:
                pass
            self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


def bench_nixl(
    payloads: list[Payload],
    block_pool: int,
    layer_pool: int,
    reps: int,
    device: str,
    placements: tuple[dict[str, Any], dict[str, Any]] | None = None,
    link_bytes: Any = None,
    floor: tuple[str, ...] = (),
) -> dict[str, dict[str, Any]]:
    """Raw NIXL and the transceiver between two processes. ``placements``: where the sender and the
    receiver run (see :func:`_rank`); ``link_bytes()``: bytes the link has carried so far, read
    around each payload's repetitions to show how much of it crossed the link.

    ``floor``: payloads that also get the floor of any design that tells its receiver over ZMQ: a
    raw write, then one bare round trip (:class:`Echo`) from the receiver right after it, as a
    request's own messages run right after a write (``rtt_after_write_us``); and one after both sides
    slept as long as that write took, with no copy (``rtt_after_idle_us``). Both run several times
    slower than :func:`bench_requests`' back-to-back round trip: threads idle for milliseconds on
    these shared cores start cold, whether or not a copy ran meanwhile."""
    import zmq

    keys = {"sender": zmq.curve_keypair(), "receiver": zmq.curve_keypair()}
    sender_at, receiver_at = ({**p, "keys": keys} for p in (placements or ({}, {})))
    sender = Rank("sender", _pools(block_pool, layer_pool), device, payloads, sender_at)
    receiver = Rank("receiver", _pools(block_pool, layer_pool), device, payloads, receiver_at)
    results: dict[str, dict[str, Any]] = {}
    try:
        sender("peer", receiver.info)
        receiver("connect", (sender.info["addresses"], "writes"))
        reads = bool(sender.info["reads_addresses"])
        if reads:
            receiver("connect", (sender.info["reads_addresses"], "reads"))
        counter = 0
        echo = None
        for payload in payloads:
            raw_times, tx_metrics, read_metrics = [], [], []
            crossed = link_bytes() if link_bytes else 0
            # one warm-up each, then alternate so that all see the same machine state
            for rep in range(reps + 1):
                raw_t = sender("raw", payload.name)
                counter += 1
                request_id = f"bench-{counter}"
                sender("offer", (payload, request_id))
                metrics = receiver("receive", (payload, request_id))
                if reads:  # the same blocks again, read by the receiver's reads transceiver
                    sender("offer", (payload, request_id, "reads"))
                    read_metrics.append(receiver("receive", (payload, request_id, "reads")))
                if rep:
                    raw_times.append(raw_t)
                    tx_metrics.append(metrics)
                elif reads:
                    read_metrics.clear()
            crossed = (link_bytes() - crossed) if link_bytes else 0
            floor_raw, floor_rtt, idle_rtt = [], [], []
            if payload.name in floor:  # after the pairs above, so that the round trip warms nothing of theirs
                echo = echo or sender("echo")
                for rep in range(reps + 1):
                    raw_t = sender("raw", payload.name)
                    rtt_t = receiver("rtt", echo)
                    idle_t = receiver("rtt_after_idle", (echo, raw_t))  # idle as long, no copy
                    if rep:
                        floor_raw.append(raw_t)
                        floor_rtt.append(rtt_t)
                        idle_rtt.append(idle_t)
            identical = receiver("digests", (payload.layout, list(payload.dst))) == sender("digests", (payload.layout, list(payload.src)))
            total = statistics.median(m["total_us"] for m in tx_metrics) / 1e6
            raw_s = statistics.median(raw_times)
            results[payload.name] = {
                "nixl_gbps": payload.nbytes / raw_s / 1e9,
                "nixl_us": raw_s * 1e6,
                "transceiver_gbps": payload.nbytes / total / 1e9,
                "transceiver_us": total * 1e6,
                "transfer_us": statistics.median(m["transfer_us"] for m in tx_metrics),
                "queue_us": statistics.median(m["queue_us"] for m in tx_metrics),
                "descriptors_before": tx_metrics[-1]["descriptors_before"],
                "descriptors": tx_metrics[-1]["descriptors"],
                "bit_identical": identical,
                # payload bytes moved (raw + transceiver, warm-up included) vs bytes the link carried
                "link_vs_payload": crossed / ((3 if reads else 2) * (reps + 1) * payload.nbytes) if link_bytes else None,
            }
            if read_metrics:
                reads_s = statistics.median(m["total_us"] for m in read_metrics) / 1e6
                results[payload.name]["reads_us"] = reads_s * 1e6
                results[payload.name]["reads_vs_nixl"] = raw_s / reads_s
            if floor_rtt:
                rtt_s = statistics.median(floor_rtt)
                results[payload.name]["rtt_after_write_us"] = rtt_s * 1e6
                results[payload.name]["rtt_after_idle_us"] = statistics.median(idle_rtt) * 1e6
                results[payload.name]["floor_vs_nixl"] = statistics.median(floor_raw) / (statistics.median(floor_raw) + rtt_s)
    finally:
        receiver.stop()
        sender.stop()
    return results


def bench_curve(payloads: list[Payload], reps: int, device: str) -> dict[str, float]:
    """What CURVE costs: two process pairs at once, one with the control plane on CURVE (as always),
    one in plaintext (a private switch, bench only); each repetition runs the raw write, then one
    request on each pair, so all three see the same machine state."""
    import zmq

    pairs = {}
    try:
        for plaintext in (False, True):
            keys = {"sender": zmq.curve_keypair(), "receiver": zmq.curve_keypair()}
            at = {"keys": keys, "plaintext": plaintext, "reads": False}
            sender = Rank("sender", _pools(32, 8), device, payloads, at)
            receiver = Rank("receiver", _pools(32, 8), device, payloads, at)
            pairs[plaintext] = (sender, receiver)
            receiver("connect", (sender.info["addresses"], "writes"))
        pairs[False][0]("peer", pairs[False][1].info)
        times: dict[tuple[str, str], list[float]] = {}
        for payload in payloads:
            for rep in range(reps + 1):
                raw = pairs[False][0]("raw", payload.name)
                for plaintext, (sender, receiver) in pairs.items():
                    request_id = f"curve-{payload.name}-{rep}"
                    sender("offer", (payload, request_id))
                    total = receiver("receive", (payload, request_id))["total_us"] / 1e6
                    if rep:
                        times.setdefault((payload.name, "plaintext" if plaintext else "curve"), []).append(total)
                if rep:
                    times.setdefault((payload.name, "raw"), []).append(raw)
    finally:
        for sender, receiver in pairs.values():
            receiver.stop()
            sender.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    big, one = "contiguous 64 MiB", "one block (4 MiB)"
    return {
        "transceiver_vs_nixl_curve": round(med[(big, "raw")] / med[(big, "curve")], 3),
        "transceiver_vs_nixl_plaintext": round(med[(big, "raw")] / med[(big, "plaintext")], 3),
        "one_block_overhead_us_curve": round((med[(one, "curve")] - med[(one, "raw")]) * 1e6, 1),
        "one_block_overhead_us_plaintext": round((med[(one, "plaintext")] - med[(one, "raw")]) * 1e6, 1),
        # the cost of CURVE itself, without the raw write's noise: plaintext time / CURVE time
        "curve_vs_plaintext_64mib": round(med[(big, "plaintext")] / med[(big, "curve")], 3),
        "curve_vs_plaintext_one_block": round(med[(one, "plaintext")] / med[(one, "curve")], 3),
    }


# ------------------------------------------------------------------------------ request path ----


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_requests(quick: bool, device: str) -> dict[str, Any]:
    """The request path on 4 KiB blocks, CURVE on: a pair of ranks with one small pool each.

    Interleaved, so that all three see the same machine state: a raw NIXL write of one block, a
    bare zmq round trip (:class:`Echo`), one request end to end (the receiver's ``receive()`` to
    its completion). Then requests per second with 1, 8 and 64 in flight (median of 3 runs each).
    Every figure is timed inside the rank that sees it, never across the parent's pipes."""
    import zmq

    keys = {"sender": zmq.curve_keypair(), "receiver": zmq.curve_keypair()}
    spec = {"small": (SMALL, 256)}
    one = Payload("one 4 KiB block", "small", (7,), (9,))
    sender = Rank("sender", spec, device, [one], {"keys": keys})
    receiver = Rank("receiver", spec, device, [one], {"keys": keys})
    try:
        sender("peer", receiver.info)
        receiver("connect", (sender.info["addresses"], "writes"))
        receiver("connect", (sender.info["reads_addresses"], "reads"))
        echo = sender("echo")
        warm, n = 20, (150 if quick else 500)
        raw, rtt, request, read = [], [], [], []
        for rep in range(warm + n):
            raw_t = sender("raw", one.name)
            rtt_t = receiver("rtt", echo)
            sender("offer", (one, f"one-{rep}"))
            total = receiver("receive", (one, f"one-{rep}"))["total_us"]
            sender("offer", (one, f"one-{rep}", "reads"))  # the same request, read (allow_reads)
            read_total = receiver("receive", (one, f"one-{rep}", "reads"))["total_us"]
            if rep >= warm:
                raw.append(raw_t * 1e6)
                rtt.append(rtt_t * 1e6)
                request.append(total)
                read.append(read_total)
        rps: dict[tuple[str, int], float] = {}
        count = 150 if quick else 400
        for window in (1, 8, 64):
            for mode in ("writes", "reads"):
                runs = []
                for run in range(3):
                    prefix = f"rps{window}-{run}"
                    sender("offer_many", ("small", prefix, count * (1 + window // 8), mode))
                    runs.append(receiver("rps", ("small", prefix, count * (1 + window // 8), window, mode)))
                rps[(mode, window)] = statistics.median(runs)
    finally:
        receiver.stop()
        sender.stop()
    raw_us, rtt_us, request_us, read_us = (statistics.median(v) for v in (raw, rtt, request, read))
    overhead = request_us - raw_us
    return {
        # the same, read by the receiver from a sender with allow_reads (interleaved with the above)
        "reads_request_overhead_us": round(read_us - raw_us, 1),
        "reads_overhead_in_rtts": round((read_us - raw_us) / rtt_us, 2),
        "reads_rps_1": round(rps[("reads", 1)]),
        "reads_rps_64": round(rps[("reads", 64)]),
        "request_overhead_us": round(overhead, 1),
        "request_p50_us": round(request_us, 1),
        "request_p99_us": round(_percentile(request, 0.99), 1),
        "raw_write_4k_us": round(raw_us, 1),
        "zmq_rtt_us": round(rtt_us, 1),
        "zmq_rtt_p99_us": round(_percentile(rtt, 0.99), 1),
        "overhead_in_rtts": round(overhead / rtt_us, 2),
        "rps_1": round(rps[("writes", 1)]),
        "rps_8": round(rps[("writes", 8)]),
        "rps_64": round(rps[("writes", 64)]),
        "rps_64_vs_1": round(rps[("writes", 64)] / rps[("writes", 1)], 2),
        "request_samples": n,
    }


def bench_idle(seconds: float, device: str) -> dict[str, float]:
    """CPU an idle, connected transceiver pair burns: two processes with one transceiver each and
    nothing else (no raw agent), after one request; each process's own CPU clock (all its threads)
    over ``seconds`` of wall time, in % of one core."""
    import zmq

    keys = {"sender": zmq.curve_keypair(), "receiver": zmq.curve_keypair()}
    spec = {"small": (SMALL, 16)}
    one = Payload("one 4 KiB block", "small", (1,), (2,))
    at = {"keys": keys, "raw": False, "reads": False}
    sender = Rank("sender", spec, device, [one], at)
    receiver = Rank("receiver", spec, device, [one], at)
    try:
        started = time.perf_counter()
        receiver("connect", (sender.info["addresses"], "writes"))  # the first: the metadata is probed in a child
        first_connect = time.perf_counter() - started
        sender("offer", (one, "idle-warm-up"))
        receiver("receive", (one, "idle-warm-up"))
        time.sleep(1.0)  # let whatever the request started settle
        before = (sender("cpu"), receiver("cpu"), time.perf_counter())
        time.sleep(seconds)
        after = (sender("cpu"), receiver("cpu"), time.perf_counter())
        # What a connect costs: hello, the sender loading the receiver's NIXL metadata, the proof
        # nonce (a NIXL notification) and its echo, the welcome.
        connects = receiver("reconnect", (sender.info["addresses"], 20))
    finally:
        receiver.stop()
        sender.stop()
    wall = after[2] - before[2]
    each = {role: round((after[i] - before[i]) / wall * 100, 3) for i, role in enumerate(("sender", "receiver"))}
    return {
        "idle_cpu_pct": max(each.values()), "idle_cpu_pct_each": each, "idle_seconds": round(wall, 1),
        "connect_ms": round(statistics.median(connects) * 1e3, 2), "connect_p90_ms": round(_percentile(connects, 0.9) * 1e3, 2),
        "first_connect_ms": round(first_connect * 1e3, 1),
    }


# ------------------------------------------------------------------------------- two hosts ----


def bench_hosts(payloads: list[Payload], block_pool: int, layer_pool: int, reps: int, device: str) -> dict[str, dict[str, dict[str, Any]]]:
    """The two-process figures again, twice: UCX over TCP on loopback (one namespace), and across two
    network namespaces joined by a veth link (UCX over TCP on the veth device); Mooncake across the
    same link (``mooncake_netns``), so that both move bytes over TCP."""
    from tests.testbed import HostPair

    tcp_lo = {"env": {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_CMA_SEG_SIZE": None}}
    results = {"tcp_lo": bench_nixl(payloads, block_pool, layer_pool, reps, device, (tcp_lo, tcp_lo))}
    with HostPair() as pair:
        placements = tuple(
            {"netns": host.netns, "env": pair.ucx_env(host), "host": host.address} for host in (pair.prefill, pair.decode)
        )
        results["netns"] = bench_nixl(
            payloads, block_pool, layer_pool, reps, device, placements, link_bytes=lambda: pair.link_bytes(pair.prefill)[1]
        )
        results["mooncake_netns"] = bench_mooncake(
            payloads, _mooncake_pools(block_pool, layer_pool), reps, Rank, tuple({"netns": p["netns"], "host": p["host"]} for p in placements)
        )
    return results


def _mooncake_pools(block_pool: int, layer_pool: int) -> dict[str, tuple[int, int]]:
    """The bench's pools for Mooncake: ``{kind: (blocks, block bytes)}``."""
    return {"block": (block_pool, BLOCK_BYTES["block"]), "layer": (layer_pool, BLOCK_BYTES["layer"])}


def across_summary(rows: list[dict[str, Any]], across: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per payload: the transceiver's GB/s on one host (CMA), over TCP on loopback, across the veth."""
    table = []
    for row in rows:
        lo, ns = across["tcp_lo"][row["payload"]], across["netns"][row["payload"]]
        table.append(
            {
                "payload": row["payload"],
                "same_host_gbps": round(row["transceiver_gbps"], 3),
                "tcp_lo_gbps": round(lo["transceiver_gbps"], 3),
                "tcp_lo_nixl_gbps": round(lo["nixl_gbps"], 3),
                "netns_gbps": round(ns["transceiver_gbps"], 3),
                "netns_nixl_gbps": round(ns["nixl_gbps"], 3),
                "netns_vs_same_host": round(ns["transceiver_gbps"] / row["transceiver_gbps"], 3),
                "netns_vs_tcp_lo": round(ns["transceiver_gbps"] / lo["transceiver_gbps"], 3),
                # across the link, written and read, each against raw NIXL there (same run)
                "netns_vs_nixl": round(ns["transceiver_gbps"] / ns["nixl_gbps"], 3),
                "netns_reads_vs_nixl": round(ns["reads_vs_nixl"], 3),
                "netns_us": round(ns["transceiver_us"], 1),
                "link_vs_payload": round(ns["link_vs_payload"], 3),
                "bit_identical": lo["bit_identical"] and ns["bit_identical"],
            }
        )
        # both over TCP: kvpolicy (UCX) and Mooncake on loopback, and across the veth
        if "mooncake_gbps" in row:
            table[-1]["tcp_lo_vs_mooncake"] = round(lo["transceiver_gbps"] / row["mooncake_gbps"], 2)
        far = across.get("mooncake_netns", {}).get("payloads", {}).get(row["payload"])
        if far is not None:
            table[-1]["netns_mooncake_gbps"] = round(far["mooncake_gbps"], 3)
            table[-1]["netns_vs_mooncake"] = round(ns["transceiver_gbps"] / far["mooncake_gbps"], 2)
            table[-1]["bit_identical"] = table[-1]["bit_identical"] and far["bit_identical"]
    far = across.get("mooncake_netns", {})
    return {
        "payloads": table,
        "mooncake": {k: v for k, v in far.items() if k != "payloads"},
        "bit_identical": all(r["bit_identical"] for r in table),
        # Every payload byte crossed the link (TCP/IP headers make the link carry a little more).
        "crossed_link": all(r["link_vs_payload"] >= 1.0 for r in table),
    }


def print_hosts(hosts: dict[str, Any]) -> None:
    print("\nAcross two hosts (network namespaces + veth, UCX over TCP), kvpolicy transceiver GB/s\n")
    header = (
        f"{'payload':<26}{'same host':>10}{'TCP lo':>8}{'veth':>8}{'veth/same':>11}{'veth/TCP lo':>13}"
        f"{'veth kv/NIXL':>14}{'read/NIXL':>11}{'link/payload':>14}  bits"
    )
    print(header)
    print("-" * len(header))
    for r in hosts["payloads"]:
        print(
            f"{r['payload']:<26}{r['same_host_gbps']:>10.2f}{r['tcp_lo_gbps']:>8.2f}{r['netns_gbps']:>8.2f}"
            f"{r['netns_vs_same_host']:>11.2f}{r['netns_vs_tcp_lo']:>13.2f}{r['netns_vs_nixl']:>14.2f}"
            f"{r['netns_reads_vs_nixl']:>11.2f}{r['link_vs_payload']:>14.2f}  "
            f"{'ok' if r['bit_identical'] else 'MISMATCH'}"
        )
    print(f"every payload byte crossed the veth link: {'yes' if hosts['crossed_link'] else 'NO'}")
    if "skipped" in hosts["mooncake"]:
        print(f"Mooncake across the link: skipped ({hosts['mooncake']['skipped']})")
    else:  # both over TCP here
        print(
            "kvpolicy / Mooncake, both over TCP: "
            + ", ".join(
                f"{r['payload']}: {r.get('tcp_lo_vs_mooncake', float('nan')):.1f}x on loopback, {r['netns_vs_mooncake']:.1f}x across the veth"
                for r in hosts["payloads"]
            )
        )


# ------------------------------------------------------------------------------------- report ----


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and payloads (< 1 minute)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the pools live")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per payload (default 5 quick, 15 full)")
    parser.add_argument(
        "--hosts",
        choices=("same", "netns"),
        default="same",
        help="netns: also run across two network namespaces joined by a veth link (needs root)",
    )
    args = parser.parse_args(argv)
    if args.hosts == "netns":
        from tests.testbed import netns_unavailable

        why = netns_unavailable()
        if why:
            print(f"--hosts netns: cannot create network namespaces here: {why}", file=sys.stderr)
            return 2
    reps = args.reps or (5 if args.quick else 15)
    # Pools: the quick run holds 160 x 4 MiB + 1024 x 128 KiB per side (0.8 GiB); the full run
    # 576 x 4 MiB + 1024 x 128 KiB (2.4 GiB) per side: both sides together stay under 8 GiB.
    block_pool, layer_pool = (160, 1024) if args.quick else (576, 1024)
    payloads = make_payloads(args.quick, block_pool, layer_pool)

    started = time.perf_counter()
    torch_results = bench_torch(payloads, block_pool, layer_pool, reps, args.device)
    nixl_results = bench_nixl(payloads, block_pool, layer_pool, reps, args.device, floor=("contiguous 64 MiB",))
    curve = bench_curve([p for p in payloads if p.name in ("contiguous 64 MiB", "one block (4 MiB)")], reps, args.device)
    requests = bench_requests(args.quick, args.device)
    idle = bench_idle(5.0 if args.quick else 10.0, args.device)
    mooncake = bench_mooncake(payloads, _mooncake_pools(block_pool, layer_pool), reps, Rank)
    across = bench_hosts(payloads, block_pool, layer_pool, reps, args.device) if args.hosts == "netns" else None
    rows = []
    for payload in payloads:
        row = {"payload": payload.name, "bytes": payload.nbytes, "torch_gbps": torch_results[payload.name]["gbps"], **nixl_results[payload.name]}
        row["transceiver_vs_nixl"] = row["transceiver_gbps"] / row["nixl_gbps"]
        if "payloads" in mooncake:
            measured = mooncake["payloads"][payload.name]
            row["mooncake_gbps"] = measured["mooncake_gbps"]
            row["transceiver_vs_mooncake"] = row["transceiver_gbps"] / measured["mooncake_gbps"]
            row["bit_identical"] = row["bit_identical"] and measured["bit_identical"]
        rows.append(row)
    by_name = {r["payload"]: r for r in rows}
    contiguous = by_name["contiguous 64 MiB"]
    scattered = by_name["scattered 64 x 4 MiB"]
    one = by_name["one block (4 MiB)"]
    bulk = [r for r in rows if r is not one]
    summary = {
        "device": args.device,
        "quick": args.quick,
        "reps": reps,
        "torch_gbps": round(contiguous["torch_gbps"], 3),
        "nixl_gbps": round(contiguous["nixl_gbps"], 3),
        "transceiver_gbps": round(contiguous["transceiver_gbps"], 3),
        "scattered_gbps": round(scattered["transceiver_gbps"], 3),
        "transceiver_vs_nixl": round(contiguous["transceiver_vs_nixl"], 3),
        # the floor on 64 MiB: the raw write plus one bare round trip right after it (see bench_nixl)
        "rtt_after_write_us": round(contiguous["rtt_after_write_us"], 1),
        "rtt_after_idle_us": round(contiguous["rtt_after_idle_us"], 1),
        "floor_vs_nixl": round(contiguous["floor_vs_nixl"], 3),
        "overhead_64mib_in_rtts_after_write": round((contiguous["transceiver_us"] - contiguous["nixl_us"]) / contiguous["rtt_after_write_us"], 2),
        "transceiver_vs_nixl_min": round(min(r["transceiver_vs_nixl"] for r in bulk), 3),
        "scattered_vs_contiguous": round(scattered["transceiver_gbps"] / contiguous["transceiver_gbps"], 3),
        "scattered_512_vs_contiguous": round(
            min(r["transceiver_gbps"] for r in bulk if r["payload"].startswith("scattered 512")) / contiguous["transceiver_gbps"], 3
        ),
        "one_block_overhead_us": round(one["transceiver_us"] - one["nixl_us"], 1),
        # the same payloads read by the receiver (a sender with allow_reads), interleaved with the above
        "reads_vs_nixl": round(contiguous["reads_vs_nixl"], 3),
        "reads_vs_nixl_min": round(min(r["reads_vs_nixl"] for r in bulk), 3),
        "reads_one_block_overhead_us": round(one["reads_us"] - one["nixl_us"], 1),
        "bit_identical": all(r["bit_identical"] for r in rows),
        "seconds": round(time.perf_counter() - started, 1),
        "payloads": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
    }
    summary["curve"] = curve
    summary["mooncake"] = {k: v for k, v in mooncake.items() if k != "payloads"}
    if "payloads" in mooncake:
        summary["mooncake_gbps"] = round(contiguous["mooncake_gbps"], 3)
        summary["transceiver_vs_mooncake"] = round(contiguous["transceiver_vs_mooncake"], 2)
        summary["transceiver_vs_mooncake_min"] = round(min(r["transceiver_vs_mooncake"] for r in rows), 2)
    summary.update(requests)
    summary.update(idle)
    summary["connect_in_zmq_rtts"] = round(summary["connect_ms"] * 1e3 / summary["zmq_rtt_us"], 1)
    summary["targets"] = {
        "transceiver_within_10pct_of_nixl": summary["transceiver_vs_nixl_min"] >= 0.9,
        "scattered_at_least_80pct_of_contiguous": summary["scattered_vs_contiguous"] >= 0.8,
        "one_block_overhead_under_300us": summary["one_block_overhead_us"] < 300,
        "request_overhead_at_most_2_zmq_rtts": summary["overhead_in_rtts"] <= 2,
        "transceiver_64mib_at_least_90pct_of_nixl": summary["transceiver_vs_nixl"] >= 0.9,
        "rps_64_at_least_5000": summary["rps_64"] >= 5000,
        "rps_64_at_least_4x_rps_1": summary["rps_64_vs_1"] >= 4,
        "idle_cpu_at_most_half_a_pct": summary["idle_cpu_pct"] <= 0.5,
        # the same targets for the read path (a sender with allow_reads)
        "reads_within_10pct_of_nixl": summary["reads_vs_nixl_min"] >= 0.9,
        "reads_one_block_overhead_under_300us": summary["reads_one_block_overhead_us"] < 300,
        "reads_request_overhead_at_most_2_zmq_rtts": summary["reads_overhead_in_rtts"] <= 2,
    }
    if "payloads" in mooncake:  # every payload, one block included
        summary["targets"]["ahead_of_mooncake"] = summary["transceiver_vs_mooncake_min"] > 1
    if across is not None:
        summary["hosts"] = across_summary(rows, across)
        summary["bit_identical"] = summary["bit_identical"] and summary["hosts"]["bit_identical"]
        summary["seconds"] = round(time.perf_counter() - started, 1)
    if args.format == "json":
        print(json.dumps(summary))
    else:
        print(f"KV transfer, {args.device}, median of {reps} (GB/s = 10^9 B/s; ratios are within this run)\n")
        header = f"{'payload':<26}{'torch':>8}{'NIXL':>8}{'kvpolicy':>10}{'kv/NIXL':>9}{'reads/NIXL':>11}{'descs':>12}{'NIXL us':>10}{'kv us':>10}  bits"
        print(header)
        print("-" * len(header))
        for r in rows:
            descs = f"{r['descriptors_before']}->{r['descriptors']}"
            print(
                f"{r['payload']:<26}{r['torch_gbps']:>8.2f}{r['nixl_gbps']:>8.2f}{r['transceiver_gbps']:>10.2f}"
                f"{r['transceiver_vs_nixl']:>9.2f}{r['reads_vs_nixl']:>11.2f}{descs:>12}{r['nixl_us']:>10.0f}{r['transceiver_us']:>10.0f}  "
                f"{'ok' if r['bit_identical'] else 'MISMATCH'}"
            )
        print()
        print(f"scattered / contiguous (kvpolicy):  {summary['scattered_vs_contiguous']:.2f}  (512 blocks: {summary['scattered_512_vs_contiguous']:.2f})")
        print(f"kvpolicy / NIXL, worst payload:     {summary['transceiver_vs_nixl_min']:.2f}")
        print(f"one-block request overhead:         {summary['one_block_overhead_us']:.0f} us ({summary['reads_one_block_overhead_us']:.0f} us read)")
        print(f"reads (allow_reads) / NIXL:         {summary['reads_vs_nixl']:.2f} on 64 MiB, {summary['reads_vs_nixl_min']:.2f} worst payload")
        print(
            f"64 MiB floor (raw write + one bare round trip right after it, {summary['rtt_after_write_us']:.0f} us; "
            f"{summary['rtt_after_idle_us']:.0f} us after as long idle, {summary['zmq_rtt_us']:.0f} us back to back): "
            f"kv/NIXL {summary['floor_vs_nixl']:.2f}; kvpolicy's overhead = {summary['overhead_64mib_in_rtts_after_write']:.2f} such round trips"
        )
        print(
            f"CURVE on / plaintext control plane (interleaved): 64 MiB kv/NIXL {curve['transceiver_vs_nixl_curve']:.2f} / "
            f"{curve['transceiver_vs_nixl_plaintext']:.2f}; one-block overhead {curve['one_block_overhead_us_curve']:.0f} / "
            f"{curve['one_block_overhead_us_plaintext']:.0f} us; plaintext time / CURVE time: "
            f"{curve['curve_vs_plaintext_64mib']:.2f} (64 MiB), {curve['curve_vs_plaintext_one_block']:.2f} (one block)"
        )
        print(
            f"request path, 4 KiB, CURVE on: one request p50 {summary['request_p50_us']:.0f} us (p99 "
            f"{summary['request_p99_us']:.0f}), raw NIXL write {summary['raw_write_4k_us']:.0f} us, bare zmq round "
            f"trip {summary['zmq_rtt_us']:.0f} us: overhead {summary['request_overhead_us']:.0f} us = "
            f"{summary['overhead_in_rtts']:.2f} round trips"
        )
        print(
            f"requests/s, 4 KiB: {summary['rps_1']:,} (1 in flight), {summary['rps_8']:,} (8), {summary['rps_64']:,} (64): "
            f"x{summary['rps_64_vs_1']:.2f}; idle CPU per transceiver {summary['idle_cpu_pct']:.2f}% of a core "
            f"(sender {summary['idle_cpu_pct_each']['sender']:.2f}, receiver {summary['idle_cpu_pct_each']['receiver']:.2f})"
        )
        print(
            f"connect (hello, metadata loaded, proof nonce echoed, welcome): {summary['connect_ms']:.2f} ms p50, "
            f"{summary['connect_p90_ms']:.2f} ms p90 = {summary['connect_in_zmq_rtts']:.1f} zmq round trips; the first "
            f"(new metadata: the probe's helper starts, a child loads it) {summary['first_connect_ms']:.0f} ms"
        )
        print(
            f"read by the receiver (allow_reads), same run: overhead {summary['reads_request_overhead_us']:.0f} us = "
            f"{summary['reads_overhead_in_rtts']:.2f} round trips; requests/s {summary['reads_rps_1']:,} (1), {summary['reads_rps_64']:,} (64)"
        )
        if "payloads" in mooncake:
            print(
                f"Mooncake Transfer Engine {mooncake['version']} ({mooncake['transport']}; NIXL copies with CMA here): "
                f"{summary['mooncake_gbps']:.2f} GB/s on 64 MiB; kvpolicy / Mooncake "
                + ", ".join(f"{r['transceiver_vs_mooncake']:.1f}x ({r['payload']})" for r in rows)
            )
        else:
            print(f"Mooncake Transfer Engine: skipped ({mooncake['skipped']})")
        for target, met in summary["targets"].items():
            print(f"  {'met' if met else 'MISSED':<7}{target}")
        if across is not None:
            print_hosts(summary["hosts"])
        print(f"\n({summary['seconds']} s)")
    return 0 if summary["bit_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
