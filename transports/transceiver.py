"""The PYTHON transceiver over NIXL: an authenticated ZMQ control plane, NIXL WRITE (or READ) data plane.

:class:`NixlTransceiver` is a thin facade over one module per role: :mod:`.peers` (the ROUTER, its
ZAP handler, receivers that said hello), :mod:`.connections` (DEALERs to senders), :mod:`.sender`
(offers and writes), :mod:`.receiver` (receives, results and the fence over their blocks),
:mod:`.reads` (receivers reading announced offers) and :mod:`.loop` (the service thread, timers).
Only the service thread touches sockets and the NIXL agent after start-up, so public methods are
thread-safe.

Flow of one request::

    receiver                                   sender   (CURVE: both keys on each other's allow-list)
    connect(address)  -- hello(rank, agent metadata) -->  agent name bound to the key? add_remote_agent
                      <-- welcome(rank) --
    receive(id, dst)  -- request(id, nonce, dst, skip, deadline) -->  send(id, src, to=receiver)
                                                         deadline not passed: one NIXL WRITE
                      <-- result(id, nonce, ok, metrics) -- when NIXL reports the write done
    with allow_reads:  <-- offer(id, token, src, deadline) -- at send(); receive(): one NIXL READ
                       -- release(id, token, ok) --> when NIXL reports the read done
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from typing import Any

from .agent import NixlSettings, create_agent, nixl_version
from .connections import Connections, Peer
from .keys import AllowList, Identity, IdentitySpec
from .addresses import address_with_key, check_nixl_etcd, fingerprint, split_address
from .local import Limits, LocalSide
from .loop import ServiceLoop
from .metadata import format_supported
from .peers import Remotes
from .pool import BlockPool
from .probe import MetadataProbe
from .receiver import Receive, Receiver
from .request import TransferHandle
from .sender import Sender

log = logging.getLogger("kvpolicy.transports")

_IN_PROCESS: collections.Counter[bytes] = collections.Counter()
"""Public keys of the transceivers alive in this process (a role-less key of one of them is accepted)."""
_WARNED: set[bytes] = set()


def _roleless_allowed(allowed: bool, name: str, public: bytes) -> bool:
    if allowed or public in _IN_PROCESS:
        return True
    if public not in _WARNED and len(_WARNED) < 1024:
        _WARNED.add(public)
        log.warning(
            "transceiver %s: peer key %s has no role and is not of this process: refused (make it again with "
            "`kvpolicy keys new DIR --name NAME --role prefill|decode`, or pass allow_roleless_peers=True in tests)",
            name,
            fingerprint(public),
        )
    return False


PROBE_TIMEOUT_S = 10.0
"""Shortest time a peer's metadata may take to load in a probe child (a loaded host forks slowly)."""


__all__ = ["Limits", "NixlTransceiver", "Peer"]


class NixlTransceiver:
    """KV-cache transceiver for the PYTHON runtime on NIXL.

    Args:
        pool: the block pool to send from and receive into; registered with NIXL once, here.
        allowed_peers: the public keys this side talks to (required): a directory of ``NAME.key``
            files, a ``{name: key}`` mapping or a list of keys (see :class:`~.keys.AllowList`).
        identity: this side's key pair: a ``NAME.key_secret`` file (``kvpolicy keys new``), an
            :class:`~.keys.Identity`, or None for a fresh one in memory (give peers :attr:`public_key`).
        timeout_s: default deadline of every request; finite and positive.
        name: name for logs and the NIXL agent.
        host / port: where the control socket listens; port 0 picks a free one.
        settings: NIXL agent settings. limits: per-peer budgets (:class:`Limits`).
        log_requests: one structured (JSON) log line per finished request, at INFO.
        metadata: ``"inline"`` (default): NIXL metadata travels in the (encrypted) hello.
            ``"etcd"``: NIXL publishes it to the etcd of ``NIXL_ETCD_ENDPOINTS``; the sender reads it
            there, and loads it only if its agent name is bound to the authenticated key. NIXL's own
            etcd client has no TLS and no users, so anyone who reaches that etcd could read remote
            keys: this mode is refused unless every endpoint is a loopback address (tests).
        allow_reads: receivers named in ``send(to=...)`` read the blocks themselves (NIXL READ), so
            no control message is on a request's path. They get this side's NIXL metadata, and with
            it access to the whole pool: allow it only for receivers trusted that far (:mod:`.reads`).
        allow_roleless_peers: accept peer keys without a role (``--role any``) from other processes.
            By default such a key is accepted only from a transceiver of this process (single-process
            tests and tools): across processes a role-less key could act as both sides (issue 38,
            item 8). For multi-process tests and benchmarks only; give real keys a role.
        _plaintext: for bench/transfer.py only, to measure what CURVE costs: no authentication, no
            encryption, no per-receiver binding. Never use it on a network.
    """

    runtime = "PYTHON"
    backend = "NIXL"

    def __init__(
        self,
        pool: BlockPool,
        *,
        allowed_peers: Any = None,
        identity: IdentitySpec = None,
        timeout_s: float = 60.0,
        name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        settings: NixlSettings | None = None,
        log_requests: bool = False,
        metadata: str = "inline",
        limits: Limits | None = None,
        allow_reads: bool = False,
        allow_roleless_peers: bool = False,
        _plaintext: bool = False,
    ) -> None:
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a BlockPool, got {type(pool).__name__}")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise ValueError(f"timeout_s must be a finite positive number of seconds, got {timeout_s!r}")
        if metadata not in ("inline", "etcd"):
            raise ValueError(f"metadata must be 'inline' or 'etcd', got {metadata!r}")
        if metadata == "etcd":
            check_nixl_etcd(os.environ.get("NIXL_ETCD_ENDPOINTS", ""))
            if allow_reads:
                raise ValueError("allow_reads needs metadata='inline' (the welcome carries the metadata a reader loads)")
        # Peers' metadata is read strictly before NIXL sees it (:mod:`.metadata`): only in a format
        # this kvpolicy reads, i.e. with a NIXL release whose format it was checked against.
        unreadable = format_supported(nixl_version())
        if unreadable is not None:
            raise RuntimeError(unreadable)
        allowed = AllowList(allowed_peers)
        me = Identity.load(identity)
        allowed.roleless = functools.partial(_roleless_allowed, bool(allow_roleless_peers), name or "kv")
        self.pool = pool
        self.layout = pool.layout
        self.timeout_s = float(timeout_s)
        self.name = name or "kv"
        self.metadata = metadata
        self.settings = settings or NixlSettings()
        self._public = me.public
        self.public_key: str = me.public.decode()
        """This side's public key (z85): what peers put on their allow-lists."""
        self._closed = False
        self._released = False
        self._lock = threading.Lock()
        self._handles: dict[tuple[str, str], TransferHandle] = {}

        agent_name = f"{self.name}-{me.fingerprint}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        agent = create_agent(agent_name, self.settings)
        self._registration = agent.register_memory([(pool.base_address, pool.nbytes, pool.device_id, "")], pool.memory_type)
        self._registrations = 1
        self._agent_name = agent_name
        loop = ServiceLoop(self.name, busy=lambda: False, progress=lambda: False, on_error=self._on_error)
        self._local = local = LocalSide(
            name=self.name,
            pool=pool,
            agent=agent,
            agent_name=agent_name,
            identity=me,
            allowed=allowed,
            timeout_s=self.timeout_s,
            limits=limits or Limits(),
            metadata=metadata,
            loop=loop,
            log_requests=log_requests,
            plaintext=bool(_plaintext),
            reads=bool(allow_reads),
            backends=tuple(self.settings.backends),
        )
        local.handle_ended = self._forget_handle
        # (its helper process starts with the first hello; a probe may take as long as a request)
        local.probe = MetadataProbe(self.settings, timeout_s=max(PROBE_TIMEOUT_S, self.timeout_s))
        local.on_withdrawn = self._withdraw_keys
        self.stats: dict[str, int] = local.stats
        """Counters of frames dropped (by reason), refused handshakes and hellos, late frames."""
        self._loop = loop
        try:
            if metadata == "etcd":
                agent.send_local_metadata()  # after registering: the metadata must describe the pool
            self._sender = sender = Sender(local)
            sender.remotes = self._remotes = Remotes(local, host=host, port=port, sender=sender)
            self._connections = Connections(local, self._remotes.ctx)
            self._receiver = receiver = Receiver(local, self._connections)
            self._connections.deliver_to(receiver)
            loop.watch_writes(lambda: sender.busy() or receiver.reads.busy(), lambda: sender.progress() | receiver.progress_reads())
        except BaseException:
            agent.deregister_memory(self._registration)
            self._registrations = 0
            raise
        self.address: str = self._remotes.address
        """Where senders are reached, with their public key: pass it to a receiver's :meth:`connect`."""
        _IN_PROCESS[me.public] += 1  # (close() takes it back)
        loop.start(on_exit=self._on_loop_exit)
        loop.submit(self._remotes.start).result(10.0)

    def _withdraw_keys(self, withdrawn: frozenset[bytes]) -> None:
        """(Service thread.) Keys removed from the allow-list folder, or given another role, lose
        their sessions: see :meth:`.local.LocalSide.check_allow_list`."""
        self._remotes.withdraw_keys(withdrawn)
        self._connections.withdraw_keys(withdrawn)

    # ---------------------------------------------------------------- public API (any thread) ----

    @property
    def peers(self) -> dict[str, Peer]:
        """Senders this transceiver is connected to, by name."""
        with self._connections.lock:
            return dict(self._connections.peers)

    @property
    def registrations(self) -> int:
        """Live NIXL memory registrations of this transceiver: 1 while open, 0 after :meth:`close`."""
        return self._registrations

    def rank_record(self) -> dict[str, Any]:
        """What a registry publishes about this transceiver (JSON-able): its control address (with
        its public key), NIXL agent name, pool layout and size. Never NIXL metadata."""
        return {
            "name": self.name,
            "address": self.address,
            "key": self.public_key,
            "public_key": self.public_key,  # what an etcd rank record keeps (besides the address)
            "agent": self._agent_name,
            "layout": self.layout.to_wire(),
            "num_blocks": self.pool.num_blocks,
            "memory_type": self.pool.memory_type,
            "metadata": self.metadata,
        }

    def connect(self, address: str, *, timeout_s: float | None = None, name: str | None = None) -> Peer:
        """Connect to the sender at ``address`` (its :attr:`address`, which carries its key; the key
        must be on this side's allow-list) and exchange rank info. ``TimeoutError`` if no welcome
        comes within ``timeout_s`` (a sender that does not allow this side's key never answers).
        ``name``: the sender expected there (the name it was looked up by); ``PermissionError``
        before any request if the key at ``address`` has another name. A live session with another
        key at the same endpoint is never torn down by a connect: ``ConnectionError`` names both."""
        timeout = self._timeout(timeout_s)
        future: Future = Future()
        deadline = time.monotonic() + timeout

        def run() -> None:
            try:
                self._connections.connect(address, future, deadline, expect_name=name)
            except Exception as exc:
                future.set_exception(exc)

        self._loop.submit(run)
        done, _ = futures_wait([future], timeout + 5.0)
        if not done:
            # The service thread ends a connect at its deadline; it did not within 5 s more (busy or
            # stalled): still no welcome, said as such, not a bare TimeoutError.
            raise TimeoutError(
                f"no welcome from the sender at {address} within {timeout:g} s, and this side's service thread did not "
                "end the attempt 5 s after its deadline (is this process overloaded?)"
            )
        return future.result()

    def connect_by_name(self, registry: Any, name: str, *, timeout_s: float | None = None) -> Peer:
        """Look ``name`` up in ``registry`` (an :class:`~kvpolicy.transports.discovery.EtcdRegistry`)
        bound to this side's allow-list (a record of ``name`` is followed only if it carries the key
        ``allowed_peers`` names ``name``), then :meth:`connect` expecting that name."""
        timeout = self._timeout(timeout_s)
        record = registry.lookup(name, timeout_s=timeout, allowed=self._local.allowed)  # this side's list, whatever the registry's
        endpoint, carried = split_address(record.address)
        address = record.address if carried is not None else address_with_key(endpoint, record.public_key.encode())
        return self.connect(address, timeout_s=timeout, name=name)

    def quarantined(self) -> dict[str, int]:
        """Sender name -> blocks of this pool it keeps quarantined: fenced after a disconnect because
        its process may still write them. They come back with its results, when that process
        welcomes this side again, or by ``disconnect(name, dead=True)``; a warning names each."""
        return self._loop.submit(self._receiver.quarantine_by_sender).result(10.0)

    def disconnect(self, peer: Peer | str, *, dead: bool = False) -> bool:
        """Tear down the connection to a sender (a :class:`Peer` or its name) and forget receivers
        whose key has that name. Requests waiting on it fail at once. Blocks it may still write stay
        fenced (*quarantined*: a sender cut off by a partition may be alive and write when the link
        returns) until its results come, or the same sender process welcomes this side again after
        :meth:`connect`; pass ``dead=True`` only when its process is known to be gone (killed, host
        down) to release them now. True if there was one."""
        name = peer.name if isinstance(peer, Peer) else peer

        def run() -> bool:
            found = False
            conn = self._connections.connection_of(name)
            if conn is not None:
                self._connections.close_connection(conn, dead=dead)
                found = True
            elif dead:
                self._receiver.on_peer_gone(name, dead=True)  # (gone before: release its quarantine)
            for remote in [r for r in self._remotes.remotes.values() if r.key_name == name]:
                self._remotes.forget(remote)
                found = True
            return found

        return self._loop.submit(run).result(10.0)

    def send(
        self,
        request_id: str,
        block_ids: Sequence[int],
        *,
        receivers: int | None = None,
        to: str | Iterable[str] | None = None,
        timeout_s: float | None = None,
    ) -> TransferHandle:
        """Offer the blocks of ``request_id`` to the receivers named in ``to`` (key names on the
        allow-list, or keys): only they may ask for, or cancel, it. Without ``to``, any
        ``receivers`` allowed peers may (default 1). The handle completes once every receiver's
        blocks were written and reported; the source blocks must stay untouched until then."""
        keys = None
        if to is not None:
            names = [to] if isinstance(to, str) else list(to)
            keys = frozenset(self._key_of(n) for n in names)
            if receivers is None:
                receivers = len(keys)
        receivers = 1 if receivers is None else receivers
        if isinstance(receivers, bool) or not isinstance(receivers, int) or receivers < 1:
            raise ValueError(f"receivers must be a positive int, got {receivers!r}")
        handle = self._new_handle(request_id, "sender", block_ids, timeout_s)
        self._submit_or_forget(handle, lambda: self._sender.offer(handle, receivers, keys))
        return handle

    def _key_of(self, name: str) -> bytes:
        key = self._local.allowed.key_of(name) if isinstance(name, str) else None
        if key is None:
            raise ValueError(f"receiver {name!r} is not a key name or key on this side's allowed_peers")
        return key

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

        ``skip_blocks``: leading blocks of the request this side already holds (a prefix hit).
        ``peers``: the senders to ask; by default every connected sender overlapping this pool.
        Blocks still held by another receive are refused (see :attr:`TransferHandle.released`).
        """
        if isinstance(skip_blocks, bool) or not isinstance(skip_blocks, int) or skip_blocks < 0:
            raise ValueError(f"skip_blocks must be a non-negative int, got {skip_blocks!r}")
        if peers is None:
            names = self._connections.default_writers(self.layout)
        else:
            connected = self.peers
            asked = []
            for p in peers:
                key = p.name if isinstance(p, Peer) else p
                if key not in connected:
                    raise ValueError(f"not connected to a sender named {key!r}; connect() first")
                asked.append(key)
            names = tuple(asked)
            self._connections.check_coverage(names, self.layout)
        # (An empty quarantine, the usual case, costs one truth test on this path.)
        for name, held in (self._receiver.quarantined_over_bound(names) if self._receiver.quarantined else {}).items():
            raise ValueError(
                f"sender {name!r} keeps {held} blocks quarantined (over Limits.quarantined_per_peer = "
                f"{self._local.limits.quarantined_per_peer}): its earlier processes may still write them; ask another "
                f"sender, or call disconnect({name!r}, dead=True) once they are known to be gone"
            )
        handle = self._new_handle(request_id, "receiver", block_ids, timeout_s)
        try:
            self._receiver.reserve(handle.block_ids)
        except ValueError:
            self._forget_handle(handle)
            raise
        try:
            self._receiver.begin(Receive(handle, list(names), skip_blocks))
        except RuntimeError:
            self._forget_handle(handle)
            raise
        return handle

    def cancel(self, request_id: str, *, role: str | None = None) -> bool:
        """Cancel a request on this side. True when it is cancelled now; False if it already ended,
        or if a write (or read) may be in flight: then it ends (``CANCELLED`` or ``COMPLETED``) once safe."""
        roles = [role] if role else ["sender", "receiver"]

        def run() -> bool:
            done = False
            if "sender" in roles:
                done = self._sender.cancel(request_id) or done
            if "receiver" in roles:
                done = self._receiver.cancel(request_id) or done
            return done

        return self._loop.submit(run).result(10.0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Fail what is still open, wait (up to ``timeout_s``) for writes in flight, then release
        the registration and the sockets. Idempotent; releases them even after an internal error."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _IN_PROCESS[self._public] -= 1
        if _IN_PROCESS[self._public] <= 0:
            _IN_PROCESS.pop(self._public, None)
        try:
            self._loop.submit(self._begin_close)
        except RuntimeError:
            pass  # the loop already stopped
        if not self._loop.join(timeout_s):
            log.error("transceiver %s: writes did not end within %.1fs; closing anyway", self.name, timeout_s)
            self._loop.abandon = True
            self._loop.join(5.0)
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

    def _new_handle(self, request_id: str, role: str, block_ids: Sequence[int], timeout_s: float | None) -> TransferHandle:
        if not isinstance(request_id, str) or not request_id or len(request_id) > 256:
            raise ValueError(f"request_id must be a non-empty str of at most 256 characters, got {request_id!r}")
        blocks = tuple(self.pool.check_blocks(block_ids))
        handle = TransferHandle(request_id, role, blocks, time.monotonic() + self._timeout(timeout_s))
        with self._lock:
            if self._closed:
                raise RuntimeError(f"transceiver {self.name} is closed")
            if (role, request_id) in self._handles:
                raise ValueError(f"request {request_id!r} is already open as {role} on this transceiver")
            self._handles[(role, request_id)] = handle
        return handle

    def _submit_or_forget(self, handle: TransferHandle, fn: Any) -> None:
        try:
            self._loop.post(fn)
        except RuntimeError:
            self._forget_handle(handle)
            raise

    def _forget_handle(self, handle: TransferHandle) -> None:
        """An ended handle leaves the table (the caller keeps its own reference)."""
        with self._lock:
            if self._handles.get((handle.role, handle.request_id)) is handle:
                del self._handles[(handle.role, handle.request_id)]

    def _on_error(self, where: str) -> None:
        self.stats["internal_errors"] += 1

    def _begin_close(self) -> None:
        self._sender.begin_close()
        self._receiver.begin_close()
        self._loop.stopping = True

    def _on_loop_exit(self) -> None:
        for step in (lambda: self._sender.fail_all("transceiver closed"), lambda: self._receiver.fail_all("transceiver closed")):
            try:
                step()
            except Exception:
                log.exception("transceiver %s: failing open requests at exit", self.name)
        for future in self._loop.pending_commands():
            future.set_exception(RuntimeError(f"transceiver {self.name} is closed"))

    def _release_resources(self) -> None:
        """Every step runs even if an earlier one failed: sockets, NIXL state, registration, pipe."""
        with self._lock:
            if self._released:
                return
            self._released = True
        agent = self._local.agent
        steps = [
            self._connections.close,
            self._receiver.reads.close,
            self._remotes.close,
            self._sender.close,
            lambda: self._remotes.ctx.destroy(0),
            self._local.probe.close,
        ]
        if self.metadata == "etcd":
            steps.append(agent.invalidate_local_metadata)  # etcd may be gone: the entry is then stale, not harmful
        steps += [lambda: agent.deregister_memory(self._registration), self._loop.close_pipe]
        for step in steps:
            try:
                step()
            except Exception as exc:
                log.warning("transceiver %s: a clean-up step failed: %s", self.name, exc)
        self._registrations = 0
        self._local.agent = None
