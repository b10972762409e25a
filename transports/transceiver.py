"""The PYTHON transceiver over NIXL: ZMQ control plane, NIXL WRITE data plane.

Every :class:`NixlTransceiver` can both send and receive. It owns one NIXL agent with its pool
registered once, one ZMQ ROUTER socket that receivers connect to, one DEALER per sender it connected
to, and one service thread. Only the service thread touches ZMQ sockets and the NIXL agent after
start-up; public methods hand it work through a queue and a wake-up pipe, so they are thread-safe.

Flow of one request::

    receiver                                   sender
    connect(address)  -- hello(rank, agent metadata) -->  add_remote_agent
                      <-- welcome(rank) --
    receive(id, dst)  -- request(id, dst, skip) ------->  send(id, src) offered earlier or later
                                                         plan runs, coalesce, one NIXL WRITE
                      <-- result(id, ok, metrics) ----  when NIXL reports the write done

A receiver waits for a result frame from every sender that overlaps it in layers and heads (see
:func:`kvpolicy.transports.map_ranks`). Frames from peers that never said hello, for requests nobody
made, or that fail the schema are dropped and counted in :attr:`NixlTransceiver.stats`.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from . import control
from .agent import NixlSettings, create_agent
from .discovery import EtcdClient, RegistryError, nixl_metadata_key
from .layout import KVLayout
from .mapping import BlockSegments, block_segments, map_ranks, overlap, plan_descriptors
from .pool import BlockPool
from .request import RequestState, TransferHandle

log = logging.getLogger("kvpolicy.transports")

#: How many ended request ids each side remembers, to answer late frames politely instead of
#: counting them as foreign.
_REMEMBERED = 4096
_MAX_FRAME = 16 << 20
#: How often to read etcd again for a receiver's metadata it did not have yet (sender), and half
#: the interval between publications while waiting for a welcome (receiver).
_REFETCH_S = 0.25


@dataclass(frozen=True)
class Peer:
    """A sender this transceiver connected to."""

    name: str
    address: str
    layout: KVLayout
    num_blocks: int


@dataclass
class _Remote:
    """A receiver that said hello to our ROUTER socket."""

    identity: bytes
    rank: control.RankInfo
    segments: BlockSegments
    prepped: Any = None
    """NIXL's prepared descriptor list of the receiver's whole blocks (made on the first write)."""

    @property
    def whole_blocks(self) -> bool:
        """Both sides hold the same layers and heads: a block is one run, block to block."""
        runs = self.segments.runs
        return len(runs) == 1 and int(runs[0, 0]) == 0 and int(runs[0, 1]) == 0 and int(runs[0, 2]) == self.rank.layout.block_bytes


@dataclass
class _Offer:
    """Sender side: blocks offered for one request id."""

    handle: TransferHandle
    receivers: int
    served: int = 0
    cancelled: int = 0
    failed: str = ""
    writes: int = 0
    cancel_requested: bool = False
    served_by: set[bytes] = field(default_factory=set)


@dataclass
class _Ask:
    """Sender side: one receiver's request frame."""

    remote: _Remote
    request: control.Request
    arrived: float
    deadline: float


@dataclass
class _Write:
    """Sender side: one NIXL WRITE in flight."""

    offer: _Offer
    ask: _Ask
    xfer: Any
    nbytes: int
    descriptors_before: int
    descriptors: int
    posted: float


@dataclass
class _Receive:
    """Receiver side: one request waiting for its writers' result frames."""

    handle: TransferHandle
    peers: list[str]
    skip_blocks: int
    pending: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    cancelled: bool = False


@dataclass
class _Connection:
    """Receiver side: a DEALER socket to one sender."""

    address: str
    socket: zmq.Socket
    future: Future
    deadline: float
    peer: Peer | None = None
    republish: float = 0.0


class NixlTransceiver:
    """KV-cache transceiver for the PYTHON runtime on NIXL.

    Args:
        pool: the block pool to send from and receive into; registered with NIXL once, here.
        timeout_s: default deadline of every request. Finite and positive: a transfer that can wait
            forever is how disaggregated serving hangs.
        name: name for logs and the NIXL agent (made unique per process).
        host / port: where the control socket listens; port 0 picks a free one.
        settings: NIXL agent settings (progress-thread delay, UCX environment).
        log_requests: emit one structured (JSON) log line per finished request on the
            ``kvpolicy.transports`` logger at INFO.
        metadata: how a sender learns this side's NIXL agent metadata. ``"inline"`` (default): inside
            the hello frame. ``"etcd"``: NIXL's own etcd support publishes it to the etcd named by
            ``NIXL_ETCD_ENDPOINTS`` (which must be set; again on every connect, in case etcd was
            away), the hello carries only the agent name, and the sender reads NIXL's entry from
            etcd, retrying until its timeout. NIXL's entries carry no lease: a killed process leaves
            a stale one behind (harmless: agent names are unique per process).
    """

    runtime = "PYTHON"
    backend = "NIXL"

    def __init__(
        self,
        pool: BlockPool,
        *,
        timeout_s: float = 60.0,
        name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        settings: NixlSettings | None = None,
        log_requests: bool = False,
        metadata: str = "inline",
    ) -> None:
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a BlockPool, got {type(pool).__name__}")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise ValueError(f"timeout_s must be a finite positive number of seconds, got {timeout_s!r}")
        if metadata not in ("inline", "etcd"):
            raise ValueError(f"metadata must be 'inline' or 'etcd', got {metadata!r}")
        if metadata == "etcd" and not os.environ.get("NIXL_ETCD_ENDPOINTS"):
            raise ValueError("metadata='etcd' needs NIXL_ETCD_ENDPOINTS (etcd client URLs) in the environment")
        self.metadata = metadata
        self.pool = pool
        self.layout = pool.layout
        self.timeout_s = float(timeout_s)
        self.name = name or "kv"
        self.settings = settings or NixlSettings()
        self.log_requests = log_requests
        self.stats: dict[str, int] = {
            "dropped_malformed": 0,
            "dropped_unknown_peer": 0,
            "dropped_unknown_request": 0,
            "dropped_unexpected": 0,
            "late_frames": 0,
        }
        """Counters of frames dropped (by reason) and of legitimate frames that arrived too late."""

        self._agent_name = f"{self.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._agent = create_agent(self._agent_name, self.settings)
        self._registration = self._agent.register_memory(
            [(pool.base_address, pool.nbytes, pool.device_id, "")], pool.memory_type
        )
        self._registrations = 1
        self._local_prepped: Any = None
        """NIXL's prepared descriptor list of this pool's blocks (made on the first whole-block write)."""
        if metadata == "etcd":
            # After registering: the published metadata must describe the pool.
            self._agent.send_local_metadata()

        self._zmq = zmq.Context.instance()
        self._router = self._zmq.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.MAXMSGSIZE, _MAX_FRAME)
        if port:
            self._router.bind(f"tcp://{host}:{port}")
        else:
            self._router.bind_to_random_port(f"tcp://{host}")
        self.address: str = self._router.getsockopt(zmq.LAST_ENDPOINT).decode()
        """Where senders are reached: pass it to a receiver's :meth:`connect`."""

        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)

        # Service-thread state.
        self._remotes: dict[bytes, _Remote] = {}
        self._fetching: dict[bytes, object] = {}
        self._offers: dict[str, _Offer] = {}
        self._parked: dict[str, list[_Ask]] = {}
        self._writes: list[_Write] = []
        self._receives: dict[str, _Receive] = {}
        self._connections: dict[str, _Connection] = {}
        self._ended_offers: OrderedDict[str, tuple[RequestState, str]] = OrderedDict()
        self._ended_receives: OrderedDict[str, RequestState] = OrderedDict()
        self._closing = False

        # Shared with callers (read-only for them).
        self._peers: dict[str, Peer] = {}
        self._writers_cache: tuple[str, ...] | None = None
        self._covered: set[tuple[str, ...]] = set()
        self._handles: dict[tuple[str, str], TransferHandle] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"kvpolicy-transceiver-{self.name}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- public API (any thread) ----

    @property
    def peers(self) -> dict[str, Peer]:
        """Senders this transceiver is connected to, by name."""
        with self._lock:
            return dict(self._peers)

    @property
    def registrations(self) -> int:
        """Live NIXL memory registrations of this transceiver: 1 while open, 0 after :meth:`close`."""
        return self._registrations

    def rank_record(self) -> dict[str, Any]:
        """What a registry publishes about this transceiver (JSON-able): where its control socket
        listens, its NIXL agent name, pool layout and size. Agent metadata is not included: it goes
        in the hello frame or, with ``metadata="etcd"``, through NIXL's own etcd entry."""
        return {
            "name": self.name,
            "address": self.address,
            "agent": self._agent_name,
            "layout": self.layout.to_wire(),
            "num_blocks": self.pool.num_blocks,
            "memory_type": self.pool.memory_type,
            "metadata": self.metadata,
        }

    def connect(self, address: str, *, timeout_s: float | None = None) -> Peer:
        """Connect to the sender listening at ``address`` and exchange rank info.

        Raises ``TimeoutError`` if it does not answer within ``timeout_s`` (default: the transceiver
        timeout).
        """
        timeout = self._timeout(timeout_s)
        future: Future = Future()
        self._submit(lambda: self._start_connect(address, future, time.monotonic() + timeout))
        return future.result(timeout + 5.0)

    def send(
        self,
        request_id: str,
        block_ids: Sequence[int],
        *,
        receivers: int = 1,
        timeout_s: float | None = None,
    ) -> TransferHandle:
        """Offer the blocks of ``request_id`` for ``receivers`` receivers to fetch.

        The handle completes once every receiver's blocks were written and reported; it times out if
        they do not all ask within ``timeout_s``. The source blocks must stay untouched until then.
        """
        if not isinstance(receivers, int) or receivers < 1:
            raise ValueError(f"receivers must be a positive int, got {receivers!r}")
        handle = self._new_handle(request_id, "sender", block_ids, timeout_s)
        self._submit(lambda: self._start_offer(handle, receivers))
        return handle

    def receive(
        self,
        request_id: str,
        block_ids: Sequence[int],
        *,
        peers: Iterable[Peer | str] | None = None,
        skip_blocks: int = 0,
        timeout_s: float | None = None,
    ) -> TransferHandle:
        """Ask senders to write the blocks of ``request_id`` into ``block_ids`` of this pool.

        ``skip_blocks``: how many leading blocks of the request this side already holds (a prefix
        hit); the sender writes its blocks ``[skip_blocks:]`` into ``block_ids`` in order.
        ``peers``: the senders to ask; by default every connected sender that overlaps this pool in
        layers and heads. Together they must cover this pool's layers and heads exactly once.
        """
        if not isinstance(skip_blocks, int) or skip_blocks < 0:
            raise ValueError(f"skip_blocks must be a non-negative int, got {skip_blocks!r}")
        if peers is None:
            names = self._default_writers()
        else:
            connected = self.peers
            names = []
            for p in peers:
                key = p.name if isinstance(p, Peer) else p
                if key not in connected:
                    raise ValueError(f"not connected to a sender named {key!r}; connect() first")
                names.append(key)
            self._check_coverage(tuple(names))
        handle = self._new_handle(request_id, "receiver", block_ids, timeout_s)
        receive = _Receive(handle, list(names), skip_blocks)
        self._submit(lambda: self._start_receive(receive))
        return handle

    def _default_writers(self) -> tuple[str, ...]:
        """Every connected sender overlapping this pool; cached until the set of peers changes."""
        with self._lock:
            cached = self._writers_cache
            if cached is None:
                cached = tuple(p.name for p in self._peers.values() if overlap(p.layout, self.layout) is not None)
                self._writers_cache = cached
        if not cached:
            raise ValueError(f"no connected sender holds any of this pool's layers/heads ({self.layout})")
        self._check_coverage(cached)
        return cached

    def _check_coverage(self, names: tuple[str, ...]) -> None:
        """Raise ``ValueError`` unless these senders cover this pool's layers and heads exactly once."""
        if names in self._covered:
            return
        with self._lock:
            layouts = [self._peers[n].layout for n in names]
        map_ranks(layouts, [self.layout])
        self._covered.add(names)

    def cancel(self, request_id: str, *, role: str | None = None) -> bool:
        """Cancel a request on this side.

        Returns True when the request is cancelled now and its pages are released. Returns False if
        it already ended, or if a write may be in flight: then the cancel is recorded, the pages
        stay reserved, and the handle ends (``CANCELLED`` or ``COMPLETED``) once it is safe.
        """
        roles = [role] if role else ["sender", "receiver"]
        future: Future = Future()

        def run() -> bool:
            result = False
            for r in roles:
                if r == "sender" and request_id in self._offers:
                    result = self._cancel_offer(self._offers[request_id]) or result
                elif r == "receiver" and request_id in self._receives:
                    result = self._cancel_receive(self._receives[request_id]) or result
            return result

        self._submit(run, future)
        return future.result(10.0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Fail what is still open, wait for in-flight writes, release the pool's registration."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._submit(self._begin_close)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("transceiver %s: service thread did not stop within %.1fs", self.name, timeout_s)
            return
        self._release_resources()

    def __enter__(self) -> NixlTransceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NixlTransceiver({self.name!r}, {self.address}, {self.pool!r})"

    # --------------------------------------------------------------------------- internals ----

    def _timeout(self, timeout_s: float | None) -> float:
        if timeout_s is None:
            return self.timeout_s
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise ValueError(f"timeout_s must be a finite positive number of seconds, got {timeout_s!r}")
        return float(timeout_s)

    def _new_handle(
        self, request_id: str, role: str, block_ids: Sequence[int], timeout_s: float | None
    ) -> TransferHandle:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        blocks = tuple(self.pool.check_blocks(block_ids))
        deadline = time.monotonic() + self._timeout(timeout_s)
        handle = TransferHandle(request_id, role, blocks, deadline)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"transceiver {self.name} is closed")
            existing = self._handles.get((role, request_id))
            if existing is not None and not existing.done:
                raise ValueError(f"request {request_id!r} is already open as {role} on this transceiver")
            self._handles[(role, request_id)] = handle
        return handle

    def _submit(self, fn: Callable[[], Any], future: Future | None = None) -> None:
        if not self._thread.is_alive():
            raise RuntimeError(f"transceiver {self.name} is closed")
        self._commands.put((fn, future or Future()))
        os.write(self._wake_w, b"\0")

    # ---------------------------------------------------------------- service thread ----

    def _serve(self) -> None:
        last_sweep = 0.0
        idle_sleep = 0.0
        try:
            while True:
                # Block in poll unless a write is in flight (NIXL has no wake-up for local
                # completion). Spinning between frames was measured and lost: on 2 cores it starves
                # ZMQ's I/O threads.
                events = dict(self._poller.poll(0 if self._writes else 5))
                progressed = bool(events)
                if self._wake_r in events:
                    self._drain_wake()
                    self._run_commands()
                if self._router in events:
                    self._drain(self._router, self._on_router_frame)
                for conn in list(self._connections.values()):
                    if conn.socket in events:
                        self._drain(conn.socket, lambda frames, c=conn: self._on_sender_frame(c, frames))
                if self._writes:
                    progressed |= self._progress_writes()
                now = time.monotonic()
                if now - last_sweep > 0.002:
                    self._sweep_deadlines(now)
                    last_sweep = now
                if self._closing and not self._writes:
                    break
                if self._writes and not progressed:
                    # NIXL gives no wake-up for local completion; back off from a spin to 200 us.
                    idle_sleep = min(max(idle_sleep * 2, 10e-6), 200e-6)
                    time.sleep(idle_sleep)
                else:
                    idle_sleep = 0.0
        except Exception:  # pragma: no cover - a bug here must not leave callers hanging
            log.exception("transceiver %s: service thread crashed", self.name)
        finally:
            self._fail_everything("transceiver closed")

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _run_commands(self) -> bool:
        ran = False
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return ran
            ran = True
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)

    def _drain(self, socket: zmq.Socket, handler: Callable[[list[bytes]], None]) -> None:
        for _ in range(256):  # bounded, so one chatty peer cannot starve the rest of the loop
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            handler(frames)

    def _drop(self, reason: str, detail: str) -> None:
        self.stats[f"dropped_{reason}"] += 1
        log.warning("transceiver %s: dropped a control frame (%s): %s", self.name, reason, detail)

    # -- frames on the ROUTER: we are the sender ------------------------------------------------

    def _on_router_frame(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            self._drop("malformed", f"{len(frames)} frames")
            return
        identity, frame = frames
        try:
            message = control.decode(frame)
        except control.ControlMessageError as exc:
            self._drop("malformed", str(exc))
            return
        if isinstance(message, control.Hello):
            self._on_hello(identity, message)
            return
        remote = self._remotes.get(identity)
        if remote is None:
            self._drop("unknown_peer", f"{message.kind} from a peer that never said hello")
        elif isinstance(message, control.Request):
            self._on_ask(remote, message)
        elif isinstance(message, control.Cancel):
            self._on_remote_cancel(remote, message.request_id)
        else:
            self._drop("unexpected", f"{message.kind} sent to a sender")

    def _on_hello(self, identity: bytes, hello: control.Hello) -> None:
        rank = hello.rank
        try:
            segments = block_segments(self.layout, rank.layout)
            if identity in self._remotes:
                self._forget_remote(self._remotes.pop(identity))
            if rank.metadata:
                self._agent.add_remote_agent(rank.metadata)
            else:
                # The receiver published its metadata to etcd: read it there (in the background);
                # the welcome waits until it has arrived, or is never sent.
                self._start_fetch(identity, hello)
                return
        except Exception as exc:
            self._drop("malformed", f"hello from {rank.name!r} rejected: {exc}")
            return
        self._welcome(identity, rank, segments)

    def _start_fetch(self, identity: bytes, hello: control.Hello) -> None:
        """Read the NIXL metadata that ``hello``'s agent published to etcd, retrying until the
        transceiver timeout, on a short-lived thread; the service thread gets it as a command.

        NIXL 1.5.1's own fetch (``fetch_remote_metadata``) also watches the key; that watch does not
        survive an etcd restart and then wedges the agent's communication thread, so that even
        closing the agent hangs. Reading the same key through the JSON gateway, with a timeout on
        every call, has no such state.
        """
        token = object()
        self._fetching[identity] = token
        agent = hello.rank.agent
        key = nixl_metadata_key(agent)
        deadline = time.monotonic() + self.timeout_s
        endpoints = os.environ["NIXL_ETCD_ENDPOINTS"]

        def fetch() -> None:
            client = EtcdClient(endpoints, timeout_s=1.0)
            blob, error = None, "not published"
            while not blob and not self._closed and time.monotonic() < deadline:
                try:
                    blob = client.get(key)
                except RegistryError as exc:
                    error = str(exc)
                if not blob:
                    time.sleep(_REFETCH_S)
            try:
                self._submit(lambda: self._on_fetched(identity, token, hello, blob, error))
            except RuntimeError:  # closed meanwhile
                pass

        threading.Thread(target=fetch, name=f"kvpolicy-fetch-{agent}", daemon=True).start()

    def _on_fetched(self, identity: bytes, token: object, hello: control.Hello, blob: bytes | None, error: str) -> None:
        if self._fetching.get(identity) is not token:
            return  # superseded by a newer hello from the same peer
        del self._fetching[identity]
        rank = hello.rank
        if not blob:
            log.warning("transceiver %s: metadata of agent %s not found in etcd in time: %s", self.name, rank.agent, error)
            return
        try:
            self._agent.add_remote_agent(blob)
        except Exception as exc:
            self._drop("malformed", f"etcd metadata of {rank.name!r} rejected: {exc}")
            return
        self._welcome(identity, rank, block_segments(self.layout, rank.layout))

    def _welcome(self, identity: bytes, rank: control.RankInfo, segments: BlockSegments) -> None:
        self._remotes[identity] = _Remote(identity, rank, segments)
        try:
            # Wire up now rather than inside the first request's write (~30 ms on first use).
            self._agent.make_connection(rank.agent)
        except Exception as exc:
            log.debug("transceiver %s: early connection to %s failed: %s", self.name, rank.name, exc)
        self._router.send_multipart([identity, control.encode(control.Welcome(self._rank_info(with_metadata=False)))])
        # Pending asks from this identity (a reconnect) refer to the old registration: keep them;
        # they are re-planned against the new rank when their offer arrives.

    def _rank_info(self, *, with_metadata: bool) -> control.RankInfo:
        return control.RankInfo(
            name=self.name,
            agent=self._agent_name,
            metadata=self._agent.get_agent_metadata() if with_metadata and self.metadata == "inline" else b"",
            layout=self.layout,
            base_address=self.pool.base_address,
            num_blocks=self.pool.num_blocks,
            memory_type=self.pool.memory_type,
            device_id=self.pool.device_id,
        )

    def _start_offer(self, handle: TransferHandle, receivers: int) -> None:
        offer = _Offer(handle, receivers)
        handle._state = RequestState.WAITING
        self._offers[handle.request_id] = offer
        for ask in self._parked.pop(handle.request_id, []):
            self._start_write(offer, ask)

    def _on_ask(self, remote: _Remote, request: control.Request) -> None:
        now = time.perf_counter()
        timeout = min(request.timeout_ms / 1000.0, self.timeout_s)
        ask = _Ask(remote, request, now, time.monotonic() + timeout)
        offer = self._offers.get(request.request_id)
        if offer is not None:
            self._start_write(offer, ask)
            return
        ended = self._ended_offers.get(request.request_id)
        if ended is not None:
            state, reason = ended
            status = "cancelled" if state is RequestState.CANCELLED else "error"
            self._reply(remote, control.Result(request.request_id, status, f"sender request {state.value}: {reason}"))
            return
        # The receiver may ask before prefill has finished; hold the ask until its own deadline.
        self._parked.setdefault(request.request_id, []).append(ask)

    def _start_write(self, offer: _Offer, ask: _Ask) -> None:
        handle, request, remote = offer.handle, ask.request, ask.remote
        if offer.cancel_requested or handle.done:
            self._reply(remote, control.Result(request.request_id, "cancelled", "sender cancelled the request"))
            return
        if remote.identity in offer.served_by:
            self._reply(remote, control.Result(request.request_id, "error", "duplicate request from this receiver"))
            return
        offer.served_by.add(remote.identity)
        source = handle.block_ids[request.skip_blocks :] if request.skip_blocks <= len(handle.block_ids) else ()
        problem = ""
        if len(source) != len(request.blocks):
            problem = (
                f"receiver asked for {len(request.blocks)} blocks after skipping {request.skip_blocks}, "
                f"but the sender holds {len(handle.block_ids)}"
            )
        elif any(b >= remote.rank.num_blocks for b in request.blocks) or len(set(request.blocks)) != len(request.blocks):
            problem = f"receiver block ids out of range or repeated (its pool has {remote.rank.num_blocks})"
        elif request.blocks and not len(remote.segments.runs):
            problem = "sender and receiver share no layers/heads"
        if problem:
            self._reply(remote, control.Result(request.request_id, "error", problem))
            self._writer_ended(offer, ok=False, reason=problem)
            return
        plan = plan_descriptors(
            remote.segments,
            source,
            request.blocks,
            src_base=self.pool.base_address,
            src_block_bytes=self.pool.block_bytes,
            dst_base=remote.rank.base_address,
            dst_block_bytes=remote.rank.layout.block_bytes,
        )
        posted = time.perf_counter()
        if not plan.descriptors:
            self._complete_write(_Write(offer, ask, None, 0, 0, 0, posted), ok=True, reason="")
            return
        try:
            if remote.whole_blocks:
                xfer = self._prepped_write(remote, source, request.blocks)
            else:
                xfer = self._listed_write(remote, plan)
            status = self._agent.transfer(xfer)
        except Exception as exc:
            self._complete_write(_Write(offer, ask, None, 0, 0, 0, posted), ok=False, reason=f"NIXL: {exc}")
            return
        write = _Write(offer, ask, xfer, plan.nbytes, plan.descriptors_before, plan.descriptors, posted)
        offer.writes += 1
        handle._state = RequestState.TRANSFERRING
        if status == "DONE":
            self._complete_write(write, ok=True, reason="")
        elif status == "ERR":
            self._complete_write(write, ok=False, reason="NIXL reported an error posting the write")
        else:
            self._writes.append(write)

    def _prepped_write(self, remote: _Remote, source: Sequence[int], destination: Sequence[int]) -> Any:
        """Whole blocks to whole blocks: by index into descriptor lists prepared once per side
        (NIXL merges runs adjacent on both sides), instead of building and checking lists per request."""
        if self._local_prepped is None:
            self._local_prepped = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", self._block_descriptors(
                self.pool.base_address, self.pool.block_bytes, self.pool.num_blocks, self.pool.device_id
            ), self.pool.memory_type)
        if remote.prepped is None:
            rank = remote.rank
            remote.prepped = self._agent.prep_xfer_dlist(rank.agent, self._block_descriptors(
                rank.base_address, rank.layout.block_bytes, rank.num_blocks, rank.device_id
            ), rank.memory_type)
        return self._agent.make_prepped_xfer(
            "WRITE",
            self._local_prepped,
            np.asarray(source, dtype=np.int32),
            remote.prepped,
            np.asarray(destination, dtype=np.int32),
        )

    @staticmethod
    def _block_descriptors(base: int, block_bytes: int, num_blocks: int, device_id: int) -> np.ndarray:
        descriptors = np.empty((num_blocks, 3), dtype=np.uint64)
        descriptors[:, 0] = base + np.arange(num_blocks, dtype=np.uint64) * np.uint64(block_bytes)
        descriptors[:, 1] = block_bytes
        descriptors[:, 2] = device_id
        return descriptors

    def _listed_write(self, remote: _Remote, plan: Any) -> Any:
        """Any overlap (head or layer splits): the planned, coalesced runs as one descriptor list."""
        runs = plan.runs
        local = np.empty((len(runs), 3), dtype=np.uint64)
        local[:, 0], local[:, 1], local[:, 2] = runs[:, 0], runs[:, 2], self.pool.device_id
        remote_descs = np.empty((len(runs), 3), dtype=np.uint64)
        remote_descs[:, 0], remote_descs[:, 1], remote_descs[:, 2] = runs[:, 1], runs[:, 2], remote.rank.device_id
        return self._agent.initialize_xfer(
            "WRITE",
            self._agent.get_xfer_descs(local, self.pool.memory_type),
            self._agent.get_xfer_descs(remote_descs, remote.rank.memory_type),
            remote.rank.agent,
        )

    def _forget_remote(self, remote: _Remote) -> None:
        """Drop a receiver's prepared list and NIXL's record of its agent."""
        if remote.prepped is not None:
            try:
                self._agent.release_dlist_handle(remote.prepped)
            except Exception as exc:
                log.debug("transceiver %s: releasing the prepared list of %s failed: %s", self.name, remote.rank.name, exc)
            remote.prepped = None
        try:
            self._agent.remove_remote_agent(remote.rank.agent)
        except Exception as exc:
            log.debug("transceiver %s: removing agent %s failed: %s", self.name, remote.rank.agent, exc)

    def _progress_writes(self) -> bool:
        progressed = False
        for write in list(self._writes):
            try:
                status = self._agent.check_xfer_state(write.xfer)
            except Exception as exc:
                status, error = "ERR", str(exc)
            else:
                error = "NIXL reported an error during the write"
            if status == "PROC":
                continue
            self._writes.remove(write)
            self._complete_write(write, ok=status == "DONE", reason="" if status == "DONE" else error)
            progressed = True
        return progressed

    def _complete_write(self, write: _Write, *, ok: bool, reason: str) -> None:
        done = time.perf_counter()
        request = write.ask.request
        queue_s = write.posted - write.ask.arrived
        transfer_s = done - write.posted if write.xfer is not None else 0.0
        # Report first: the receiver is waiting on this frame; releasing the handle can wait.
        self._reply(
            write.ask.remote,
            control.Result(
                request.request_id,
                "ok" if ok else "error",
                reason,
                write.nbytes,
                write.descriptors_before,
                write.descriptors,
                int(queue_s * 1e6),
                int(transfer_s * 1e6),
            ),
        )
        if write.xfer is not None:
            write.offer.writes -= 1
            try:
                write.xfer.release()
            except Exception as exc:  # a failed transfer may refuse release; the agent retries later
                log.debug("transceiver %s: release of a finished write failed: %s", self.name, exc)
        metrics = write.offer.handle.metrics
        metrics.nbytes += write.nbytes
        metrics.descriptors_before += write.descriptors_before
        metrics.descriptors += write.descriptors
        metrics.queue_s = max(metrics.queue_s, queue_s)
        metrics.transfer_s = max(metrics.transfer_s, transfer_s)
        self._writer_ended(write.offer, ok=ok, reason=reason)

    def _writer_ended(self, offer: _Offer, *, ok: bool, reason: str) -> None:
        if ok:
            offer.served += 1
            offer.handle.metrics.writers += 1
        elif not offer.failed:
            offer.failed = reason
        self._settle_offer(offer)

    def _settle_offer(self, offer: _Offer) -> None:
        """End the offer once nothing is in flight and nothing more is expected (or it must stop)."""
        if offer.writes:
            return
        handle = offer.handle
        if offer.failed:
            self._end_offer(offer, RequestState.FAILED, offer.failed)
        elif offer.served + offer.cancelled >= offer.receivers:
            if offer.cancelled:
                self._end_offer(offer, RequestState.CANCELLED, "cancelled by the receiver")
            else:
                self._end_offer(offer, RequestState.COMPLETED)
        elif offer.cancel_requested:
            self._end_offer(offer, RequestState.CANCELLED, "cancelled by the sender")
        elif handle.state is RequestState.TRANSFERRING:
            handle._state = RequestState.WAITING

    def _end_offer(self, offer: _Offer, state: RequestState, reason: str = "") -> None:
        request_id = offer.handle.request_id
        self._offers.pop(request_id, None)
        self._remember(self._ended_offers, request_id, (state, reason))
        offer.handle._finish(state, reason)
        self._log_request(offer.handle)

    def _cancel_offer(self, offer: _Offer) -> bool:
        if offer.handle.done:
            return False
        offer.cancel_requested = True
        if offer.writes:
            return False
        self._settle_offer(offer)
        return True

    def _on_remote_cancel(self, remote: _Remote, request_id: str) -> None:
        parked = self._parked.get(request_id, [])
        mine = [a for a in parked if a.remote is remote]
        if mine:
            self._parked[request_id] = [a for a in parked if a.remote is not remote]
            if not self._parked[request_id]:
                del self._parked[request_id]
            self._reply(remote, control.Result(request_id, "cancelled", "cancelled by the receiver"))
            return
        offer = self._offers.get(request_id)
        if offer is not None and remote.identity not in offer.served_by:
            # The receiver gave up before asking: count it so the offer need not wait for it.
            offer.served_by.add(remote.identity)
            offer.cancelled += 1
            self._reply(remote, control.Result(request_id, "cancelled", "cancelled by the receiver"))
            self._settle_offer(offer)
            return
        # Its write is in flight (the result follows) or already reported: nothing to stop.
        self.stats["late_frames"] += 1

    def _reply(self, remote: _Remote, result: control.Result) -> None:
        try:
            self._router.send_multipart([remote.identity, control.encode(result)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.warning("transceiver %s: could not send result of %s: %s", self.name, result.request_id, exc)

    # -- receiver side ---------------------------------------------------------------------------

    def _start_connect(self, address: str, future: Future, deadline: float) -> None:
        if address in self._connections:
            conn = self._connections[address]
            if conn.peer is not None:
                future.set_result(conn.peer)
                return
            self._close_connection(conn)
        if self.metadata == "etcd":
            # Publish again before every hello: a publication made while etcd was unreachable was
            # lost (NIXL only logs it), and the sender reads etcd as soon as the hello arrives.
            try:
                self._agent.send_local_metadata()
            except Exception as exc:
                log.warning("transceiver %s: could not publish its metadata to etcd: %s", self.name, exc)
        socket = self._zmq.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, _MAX_FRAME)
        socket.connect(address)
        conn = _Connection(address, socket, future, deadline, republish=time.monotonic() + _REFETCH_S * 2)
        self._connections[address] = conn
        self._poller.register(socket, zmq.POLLIN)
        socket.send(control.encode(control.Hello(self._rank_info(with_metadata=True))))

    def _close_connection(self, conn: _Connection) -> None:
        self._poller.unregister(conn.socket)
        conn.socket.close(0)
        self._connections.pop(conn.address, None)
        if conn.peer is not None:
            with self._lock:
                self._peers.pop(conn.peer.name, None)
                self._writers_cache = None
                self._covered = {names for names in self._covered if conn.peer.name not in names}

    def _on_sender_frame(self, conn: _Connection, frames: list[bytes]) -> None:
        if len(frames) != 1:
            self._drop("malformed", f"{len(frames)} frames from {conn.address}")
            return
        try:
            message = control.decode(frames[0])
        except control.ControlMessageError as exc:
            self._drop("malformed", f"from {conn.address}: {exc}")
            return
        if isinstance(message, control.Welcome):
            if conn.peer is not None:
                self._drop("unexpected", f"second welcome from {conn.address}")
                return
            rank = message.rank
            name = rank.name
            with self._lock:
                if name in self._peers:
                    name = f"{rank.name}@{conn.address}"
                conn.peer = Peer(name, conn.address, rank.layout, rank.num_blocks)
                self._peers[name] = conn.peer
                self._writers_cache = None
            if not conn.future.done():
                conn.future.set_result(conn.peer)
            return
        if conn.peer is None:
            self._drop("unknown_peer", f"{message.kind} from {conn.address} before its welcome")
        elif isinstance(message, control.Result):
            self._on_result(conn.peer, message)
        elif isinstance(message, control.Cancel):
            self._on_result(conn.peer, control.Result(message.request_id, "cancelled", "cancelled by the sender"))
        else:
            self._drop("unexpected", f"{message.kind} sent to a receiver")

    def _start_receive(self, receive: _Receive) -> None:
        handle = receive.handle
        if handle.done:  # cancelled before the service thread got to it
            return
        self._receives[handle.request_id] = receive
        timeout_ms = max(1, int((handle.deadline - time.monotonic()) * 1000))
        request = control.encode(control.Request(handle.request_id, handle.block_ids, receive.skip_blocks, timeout_ms))
        for name in receive.peers:
            conn = self._connection_of(name)
            if conn is None:
                receive.errors.append(f"sender {name!r} is no longer connected")
                continue
            conn.socket.send(request, zmq.NOBLOCK)
            receive.pending.add(name)
        handle._state = RequestState.WAITING
        self._settle_receive(receive)

    def _connection_of(self, peer_name: str) -> _Connection | None:
        for conn in self._connections.values():
            if conn.peer is not None and conn.peer.name == peer_name:
                return conn
        return None

    def _on_result(self, peer: Peer, result: control.Result) -> None:
        receive = self._receives.get(result.request_id)
        if receive is None or peer.name not in receive.pending:
            if result.request_id in self._ended_receives:
                self.stats["late_frames"] += 1
            else:
                self._drop("unknown_request", f"result for {result.request_id!r} from {peer.name}")
            return
        receive.pending.discard(peer.name)
        metrics = receive.handle.metrics
        metrics.writers += 1
        metrics.nbytes += result.nbytes
        metrics.descriptors_before += result.descriptors_before
        metrics.descriptors += result.descriptors
        metrics.queue_s = max(metrics.queue_s, result.queue_us / 1e6)
        metrics.transfer_s = max(metrics.transfer_s, result.transfer_us / 1e6)
        if result.status == "cancelled":
            receive.cancelled = True
            if result.reason and not receive.errors:
                receive.errors.append(f"{peer.name}: {result.reason}")
        elif result.status == "error":
            receive.errors.append(f"{peer.name}: {result.reason}")
            # Our pages are unusable anyway: ask the other writers to stop early.
            self._send_cancel(receive)
        self._settle_receive(receive)

    def _send_cancel(self, receive: _Receive) -> None:
        frame = control.encode(control.Cancel(receive.handle.request_id))
        for name in receive.pending:
            conn = self._connection_of(name)
            if conn is not None:
                try:
                    conn.socket.send(frame, zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass

    def _settle_receive(self, receive: _Receive) -> None:
        if receive.pending:
            return
        handle = receive.handle
        if receive.errors and not receive.cancelled:
            self._end_receive(receive, RequestState.FAILED, "; ".join(receive.errors))
        elif receive.cancelled or handle.state is RequestState.CANCELLING:
            self._end_receive(receive, RequestState.CANCELLED, "; ".join(receive.errors) or "cancelled")
        else:
            self._end_receive(receive, RequestState.COMPLETED)

    def _end_receive(self, receive: _Receive, state: RequestState, reason: str = "") -> None:
        request_id = receive.handle.request_id
        self._receives.pop(request_id, None)
        self._remember(self._ended_receives, request_id, state)
        receive.handle._finish(state, reason)
        self._log_request(receive.handle)

    def _cancel_receive(self, receive: _Receive) -> bool:
        handle = receive.handle
        if handle.done or handle.state is RequestState.CANCELLING:
            return False
        if not receive.pending:
            self._end_receive(receive, RequestState.CANCELLED, "cancelled by the receiver")
            return True
        handle._state = RequestState.CANCELLING
        self._send_cancel(receive)
        return False

    # -- deadlines, shutdown ---------------------------------------------------------------------

    def _sweep_deadlines(self, now: float) -> None:
        for offer in list(self._offers.values()):
            if now < offer.handle.deadline:
                continue
            if offer.writes:
                self._abort_writes(offer)
            else:
                waited = offer.receivers - offer.served - offer.cancelled
                self._end_offer(offer, RequestState.TIMED_OUT, f"{waited} receiver(s) did not ask in time")
        for request_id, asks in list(self._parked.items()):
            live = [a for a in asks if now < a.deadline]
            for ask in asks:
                if now >= ask.deadline:
                    self._reply(ask.remote, control.Result(request_id, "error", "the sender never offered this request"))
            if live:
                self._parked[request_id] = live
            else:
                del self._parked[request_id]
        for receive in list(self._receives.values()):
            if now >= receive.handle.deadline:
                missing = sorted(receive.pending)
                self._send_cancel(receive)
                self._end_receive(receive, RequestState.TIMED_OUT, f"no result frame from {missing} in time")
        for conn in list(self._connections.values()):
            if conn.peer is None and now >= conn.deadline:
                if not conn.future.done():
                    reason = f"no answer from a sender at {conn.address}"
                    if self.metadata == "etcd":
                        reason += " (it may not have found this side's NIXL metadata in etcd)"
                    conn.future.set_exception(TimeoutError(reason))
                self._close_connection(conn)
            elif conn.peer is None and self.metadata == "etcd" and now >= conn.republish:
                # Until the welcome: publish again, in case etcd was away (NIXL's etcd client may
                # fail the first puts after an outage while it reconnects).
                conn.republish = now + _REFETCH_S * 2
                try:
                    self._agent.send_local_metadata()
                except Exception as exc:
                    log.debug("transceiver %s: publishing metadata failed: %s", self.name, exc)

    def _abort_writes(self, offer: _Offer) -> None:
        """Past the deadline with writes in flight: ask NIXL to abort them; only a confirmed abort
        (release succeeds) frees the pages, otherwise they stay reserved until NIXL reports."""
        for write in [w for w in self._writes if w.offer is offer]:
            try:
                write.xfer.release()
            except Exception:
                continue
            self._writes.remove(write)
            write.xfer = None
            offer.writes -= 1
            self._writer_ended(offer, ok=False, reason="write timed out and was aborted")
        if not offer.writes and not offer.handle.done:
            self._end_offer(offer, RequestState.TIMED_OUT, "write did not finish in time")

    def _begin_close(self) -> None:
        self._closing = True
        for offer in list(self._offers.values()):
            offer.cancel_requested = True
            if not offer.writes:
                self._end_offer(offer, RequestState.FAILED, "transceiver closed")
        for receive in list(self._receives.values()):
            self._send_cancel(receive)
            self._end_receive(receive, RequestState.FAILED, "transceiver closed")

    def _fail_everything(self, reason: str) -> None:
        for offer in list(self._offers.values()):
            self._end_offer(offer, RequestState.FAILED, reason)
        for receive in list(self._receives.values()):
            self._end_receive(receive, RequestState.FAILED, reason)
        for conn in list(self._connections.values()):
            if not conn.future.done():
                conn.future.set_exception(RuntimeError(reason))
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                break
            future.set_exception(RuntimeError(reason))

    def _release_resources(self) -> None:
        for conn in list(self._connections.values()):
            self._close_connection(conn)
        for remote in self._remotes.values():
            self._forget_remote(remote)
        self._remotes.clear()
        if self._local_prepped is not None:
            try:
                self._agent.release_dlist_handle(self._local_prepped)
            except Exception as exc:
                log.debug("transceiver %s: releasing the local prepared list failed: %s", self.name, exc)
            self._local_prepped = None
        self._router.close(0)
        if self.metadata == "etcd":
            try:
                self._agent.invalidate_local_metadata()
            except Exception as exc:  # etcd may be gone; the entry is then stale, not harmful
                log.warning("transceiver %s: could not withdraw its etcd metadata: %s", self.name, exc)
        if self._registrations:
            self._agent.deregister_memory(self._registration)
            self._registrations = 0
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._agent = None

    def _remember(self, table: OrderedDict, key: str, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > _REMEMBERED:
            table.popitem(last=False)

    def _log_request(self, handle: TransferHandle) -> None:
        if self.log_requests:
            line = {"event": "kv_transfer", "transceiver": self.name, "state": handle.state.value, **handle.metrics.as_dict()}
            if handle.reason:
                line["reason"] = handle.reason
            log.info(json.dumps(line, sort_keys=True))

