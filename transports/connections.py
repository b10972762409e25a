"""Receiver side connections: one DEALER socket per sender, a CURVE client.

A caller's thread may send a request on a DEALER itself (:meth:`Connections.send_now`, no hop to
the service thread), so every use of a DEALER, the service thread's included, holds its
connection's lock, and the service loop watches the socket's ``ZMQ_FD`` rather than the socket
(``zmq_poll`` on a socket would touch it without that lock). That descriptor is edge-triggered: a
send may consume the signal of a frame that arrived meanwhile, so after every send ``EVENTS`` is
read again and a pending frame is handed to the service thread (:meth:`Connections._after_send`).

A sender's address carries its public key (``tcp://KEY@HOST:PORT``); it must be on this side's
allow-list, so a rank record pointing at a rogue sender leads nowhere. A sender that comes back with
the same key replaces its old connection; :meth:`Connections.close_connection` (``disconnect``)
tells the receiver role, which fails what waited on it and releases blocks held for it.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import control
from .addresses import agent_carries_key, fingerprint, split_address
from .layout import KVLayout
from .local import LocalSide, recv_parts
from .mapping import map_ranks, overlap

log = logging.getLogger("kvpolicy.transports")

# POLLIN as a plain int (pyzmq's flag enums make ``events & POLLIN`` build a member, as slow as the
# call), EVENTS as its member (``get`` looks an int option up in the enum, a member it passes through).
_EVENTS, _POLLIN = zmq.EVENTS, int(zmq.POLLIN)

_MAX_FRAME = 16 << 20
_REFETCH_S = 0.25
_PROOF_POLL_S = 0.002
_EARLY_NONCES = 16
"""Nonces kept per connection that came before its sender's challenge (a sender sends the challenge
first, so the honest one rarely waits there; others under its key are bounded by its proof bans)."""
REQUESTS_PER_FRAME = 16
"""Queued requests and cancels are sent once this many wait for one sender (and at every loop turn)."""


@dataclass(frozen=True)
class Peer:
    """A sender this transceiver connected to."""

    name: str
    address: str
    layout: KVLayout
    num_blocks: int
    key_name: str = ""
    """The name of the sender's public key on this side's allow-list."""


@dataclass
class Connection:
    """Receiver side: a DEALER socket to one sender."""

    endpoint: str
    key: bytes
    key_name: str
    socket: zmq.Socket
    future: Future
    timer: Any = None
    peer: Peer | None = None
    outbox: list[tuple[control.Message, bytes]] = field(default_factory=list)
    """Requests and cancels (and their encoding) queued to go (sent by :meth:`Connections.flush`)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held for every use of :attr:`socket` (callers send on it too)."""
    fd: int = -1
    """The socket's ``ZMQ_FD``, which the service loop watches."""
    closed: bool = False
    awaiting_proof: bool = False
    """No welcome yet: the proof nonce this sender's challenge names is echoed on this connection."""
    challenge: str | None = None
    """The digest of the nonce the sender said it is sending (its latest :class:`.control.Challenge`)."""
    early: list[str] = field(default_factory=list)
    """Nonces under this sender's key that came before its challenge (the two travel apart), newest
    last, at most :data:`_EARLY_NONCES`: judged when the challenge comes."""
    monitor: zmq.Socket | None = None
    """ZeroMQ's event socket of :attr:`socket`: a CURVE handshake after the first is a reconnect."""
    handshakes: int = 0


class Connections:
    """The senders this side connected to. Runs on the service thread, except :attr:`peers` (read
    by callers under :attr:`lock`)."""

    def __init__(self, local: LocalSide, ctx: zmq.Context) -> None:
        self.local = local
        self.ctx = ctx
        self._on_result: Callable = lambda peer, result: None
        self._on_peer_gone: Callable = lambda name, dead=False: None
        self._on_unsent: Callable = lambda name, messages: None
        self._receiver: Any = None
        self.connections: dict[str, Connection] = {}
        self.peers: dict[str, Peer] = {}
        self.lock = threading.Lock()
        self.version = 0
        """Bumped whenever :attr:`peers` changes (callers cache what they derive from it)."""
        self._writers: tuple[int, tuple[str, ...]] | None = None
        self._covered: set[tuple[str, ...]] = set()
        self._by_name: dict[str, Connection] = {}
        self._dirty: list[Connection] = []
        self.frames_sent = self.messages_sent = 0
        """Control frames and the messages in them sent to senders (batching makes the first smaller)."""
        local.loop.add_flusher(self.flush)
        local.on_proof = self._on_proof
        self._polling = False

    def deliver_to(self, receiver: Any) -> None:
        """Where results, offers, welcomes, lost senders and unsent messages go: the receiver role
        (made after this)."""
        self._on_result, self._on_peer_gone, self._on_unsent = receiver.on_result, receiver.on_peer_gone, receiver.on_unsent
        self._receiver = receiver

    def default_writers(self, layout: KVLayout) -> tuple[str, ...]:
        """Every connected sender overlapping ``layout`` (caller's thread; cached per peer set)."""
        cached = self._writers  # one read of a tuple replaced whole: no lock needed to use it
        if cached is not None and cached[0] == self.version and cached[1] in self._covered:
            return cached[1]
        with self.lock:
            cached = self._writers
            if cached is None or cached[0] != self.version:
                names = tuple(p.name for p in self.peers.values() if overlap(p.layout, layout) is not None)
                cached = self._writers = (self.version, names)
        if not cached[1]:
            raise ValueError(f"no connected sender holds any of this pool's layers/heads ({layout})")
        self.check_coverage(cached[1], layout)
        return cached[1]

    def check_coverage(self, names: tuple[str, ...], layout: KVLayout) -> None:
        """Raise ``ValueError`` unless these senders cover ``layout``'s layers and heads exactly once."""
        if names in self._covered:
            return
        with self.lock:
            layouts = [self.peers[n].layout for n in names]
        map_ranks(layouts, [layout])
        if len(self._covered) > 1024:
            self._covered.clear()
        self._covered.add(names)

    def connect(self, address: str, future: Future, deadline: float, expect_name: str | None = None) -> None:
        """Connect to the sender at ``address`` (which carries its public key); ``future`` gets the Peer.
        ``expect_name``: the name the caller looked up; a sender whose key has another name is refused
        before anything is sent (a record of one name pointing at another sender's endpoint)."""
        endpoint, key = split_address(address)
        if key is None:
            raise ValueError(f"address {address!r} lacks the sender's public key: pass the sender's own `address` (tcp://KEY@HOST:PORT)")
        key_name = "plaintext" if self.local.plaintext else self.local.allowed.name_of(key, role="prefill")
        if key_name is None:
            role = self.local.allowed.role_of(key) if self.local.allowed.contains(key) else None
            raise PermissionError(
                f"the sender at {endpoint} has key {fingerprint(key)}, which is not in allowed_peers"
                + (f" as a sender (its key file says role {role!r})" if role else "")
            )
        if expect_name is not None and key_name != expect_name:
            raise PermissionError(
                f"the sender at {endpoint} holds the key named {key_name!r}, not {expect_name!r}: refused before any "
                f"request (a record of {expect_name!r} that points at another sender)"
            )
        conn = self.connections.get(endpoint)
        if conn is not None:
            if conn.peer is not None and conn.key == key:
                future.set_result(conn.peer)
                return
            if conn.peer is not None and not conn.closed:
                # A live session is keyed by (endpoint, key): a record naming this endpoint with another
                # key (another sender's record, or a rogue's) never tears it down; the caller decides.
                raise ConnectionError(
                    f"{endpoint} has a live session with the sender {conn.peer.name!r} (key {fingerprint(conn.key)}); "
                    f"a connect there for key {fingerprint(key)} ({key_name!r}) would end it, so it is refused: "
                    f"disconnect {conn.peer.name!r} first if that sender has really moved"
                )
            self.close_connection(conn)
        if self.local.metadata == "etcd":
            self._publish()
        socket = self.ctx.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        # A routing id of our own (random, never 0 first: ZMQ keeps those) that the sender's ROUTER
        # hands over to the reconnected pipe: after a TCP reset ZeroMQ reconnects (and the CURVE
        # handshake runs again) and the session goes on, instead of arriving as a peer that never
        # said hello. Only the holder of an allowed key can complete that handshake, and the id is
        # never shown to anyone else.
        socket.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
        socket.setsockopt(zmq.MAXMSGSIZE, _MAX_FRAME)
        if not self.local.plaintext:
            socket.curve_secretkey = self.local.identity.secret
            socket.curve_publickey = self.local.identity.public
            socket.curve_serverkey = key
        monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        socket.connect(endpoint)
        conn = Connection(endpoint, key, key_name, socket, future, monitor=monitor)
        conn.fd = socket.getsockopt(zmq.FD)
        self.connections[endpoint] = conn
        self.local.loop.register(conn.fd, functools.partial(self._on_dealer, conn))
        self.local.loop.register(monitor, functools.partial(self._on_monitor, conn))
        conn.timer = self.local.loop.call_at(deadline, lambda: self._connect_expired(conn))
        conn.awaiting_proof = True
        self.local.proofs_wanted += 1
        if not self._polling:
            self._polling = True
            self._poll_proofs()
        if self.local.metadata == "etcd":
            self._republish(conn, time.monotonic() + _REFETCH_S * 2)
        with conn.lock:
            socket.send(control.encode(control.Hello(self.local.rank_info(with_metadata=True))))
            self._after_send(conn)

    def _poll_proofs(self) -> None:
        """While a connection waits for its welcome, read NIXL's notifications every few ms: the
        sender's proof nonce comes that way (see :data:`.local.PROOF_PREFIX`)."""
        if self.local.proofs_wanted <= 0:
            self._polling = False
            return
        self.local.drain_notifications()
        self.local.loop.call_at(time.monotonic() + _PROOF_POLL_S, self._poll_proofs)

    def _on_proof(self, agent: str, nonce: str) -> None:
        """A proof nonce arrived, under an agent name that carries a sender's key (NIXL does not check
        the claimed name): on a connection to that sender still waiting for its welcome, echo it if it
        is the nonce that sender's challenge names, keep it if the challenge has not come yet, and
        never echo any other. Another hello that named this side's agent (an insider with a copy of
        its metadata) gets its nonce sent here too: echoed, it would fail this side's own proof."""
        digest = control.nonce_digest(nonce)
        for conn in list(self.connections.values()):
            if not conn.awaiting_proof or conn.closed or not (self.local.plaintext or agent_carries_key(agent, conn.key)):
                continue
            if conn.challenge is None:
                conn.early.append(nonce)
                del conn.early[:-_EARLY_NONCES]
            elif secrets.compare_digest(digest, conn.challenge):
                self._echo(conn, nonce)
            else:
                self._foreign_proof(conn)

    def _on_challenge(self, conn: Connection, challenge: control.Challenge) -> None:
        """The sender says which nonce it is sending: echo it if it came already."""
        if not conn.awaiting_proof:
            self.local.drop("unexpected", f"a challenge from {conn.endpoint}, which asked for no proof")
            return
        conn.challenge = challenge.digest
        early, conn.early = conn.early, []
        for nonce in early:
            if secrets.compare_digest(control.nonce_digest(nonce), challenge.digest):
                self._echo(conn, nonce)
            else:
                self._foreign_proof(conn)

    def _foreign_proof(self, conn: Connection) -> None:
        self.local.stats["foreign_proofs"] += 1
        log.info(
            "transceiver %s: a proof nonce under the key of %s that its challenge does not name was not echoed "
            "(another hello named this side's agent: a copy of its NIXL metadata?)",
            self.local.name,
            conn.endpoint,
        )

    def _echo(self, conn: Connection, nonce: str) -> None:
        with conn.lock:
            if conn.closed:
                return
            try:
                conn.socket.send(control.encode(control.Proof(nonce)), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                log.warning("transceiver %s: could not send a proof to %s: %s", self.local.name, conn.endpoint, exc)
            self._after_send(conn)

    def _done_waiting(self, conn: Connection) -> None:
        if conn.awaiting_proof:
            conn.awaiting_proof = False
            self.local.proofs_wanted -= 1

    def _publish(self) -> None:
        # Before every hello and until the welcome: a publication made while etcd was away is lost
        # (NIXL only logs it), and the sender reads etcd as soon as the hello arrives.
        try:
            self.local.agent.send_local_metadata()
        except Exception as exc:
            log.warning("transceiver %s: could not publish its metadata to etcd: %s", self.local.name, exc)

    def _republish(self, conn: Connection, when: float) -> None:
        def again() -> None:
            if conn.peer is None and self.connections.get(conn.endpoint) is conn:
                self._publish()
                self._republish(conn, time.monotonic() + _REFETCH_S * 2)

        self.local.loop.call_at(when, again)

    def _connect_expired(self, conn: Connection) -> None:
        if conn.peer is not None:
            return
        if not conn.future.done():
            reason = f"no welcome from the sender at {conn.endpoint} (is this side's key in its allowed_peers?)"
            if self.local.metadata == "etcd":
                reason += " (it may not have found this side's NIXL metadata in etcd)"
            conn.future.set_exception(TimeoutError(reason))
        self.close_connection(conn)

    def _after_send(self, conn: Connection) -> None:
        """(Under ``conn.lock``, after a send.) A send processes the socket's pending commands and
        may so consume the descriptor's signal of a frame that arrived: read it on the service thread."""
        try:
            pending = conn.socket.getsockopt(_EVENTS) & _POLLIN  # type: ignore[operator]  # pyzmq types every option int | bytes; EVENTS is an int
        except zmq.ZMQError:
            return
        if pending:
            try:
                self.local.loop.post(lambda: self._on_dealer(conn))
            except RuntimeError:
                pass  # the loop has stopped: nothing reads this connection any more

    def _on_monitor(self, conn: Connection) -> None:
        """ZeroMQ's events of a connection: a CURVE handshake after the first means ZeroMQ
        reconnected after a reset; what was asked of that sender and not answered may have been lost
        with the old TCP connection (a frame ZeroMQ had handed to it), so the receiver asks again
        (the sender answers a repeated ask once: :meth:`.sender.Sender.on_request`)."""
        if conn.closed or conn.monitor is None:
            return
        for _ in range(64):
            try:
                event = recv_monitor_message(conn.monitor, zmq.NOBLOCK)
            except (zmq.Again, zmq.ZMQError):
                return
            if event.get("event") != zmq.EVENT_HANDSHAKE_SUCCEEDED:
                continue
            conn.handshakes += 1
            if conn.handshakes > 1 and conn.peer is not None and self._receiver is not None:
                self.local.stats["reconnects"] += 1
                self._receiver.on_reconnected(conn.peer.name)

    def _on_dealer(self, conn: Connection) -> None:
        self.local.check_allow_list()  # (a sender taken off the list loses its connection first)
        if conn.closed:
            return
        for _ in range(256):
            with conn.lock:
                if conn.closed:
                    return
                try:
                    frames = recv_parts(conn.socket)
                except zmq.Again:
                    return  # drained: the descriptor signals the next frame
                except zmq.ZMQError:
                    return
            try:
                self._on_dealer_frames(conn, frames)
            except Exception:
                log.exception("transceiver %s: error handling a frame from %s (dropped)", self.local.name, conn.endpoint)
                self.local.stats["internal_errors"] += 1
            if self.connections.get(conn.endpoint) is not conn:
                return
            with conn.lock:
                if conn.closed:
                    return
                try:
                    # Whether another frame waits (asked after this one was handled, off its path):
                    # half the price of a receive that fails, and it re-arms the descriptor if none does.
                    if not conn.socket.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]  # pyzmq types every option int | bytes; EVENTS is an int
                        return
                except zmq.ZMQError:
                    return
        # Bounded, so one chatty sender cannot starve the loop; the descriptor will not signal what
        # is left, so come back for it.
        self.local.loop.post(lambda: self._on_dealer(conn))

    def _on_dealer_frames(self, conn: Connection, frames: list[bytes]) -> None:
        if not self.local.plaintext and not self.local.allowed.contains(conn.key, role="prefill"):
            # Taken off the allow-list since the connection was made: close it, read nothing of it.
            self.local.check_allow_list(now=True)
            if not conn.closed:
                self.withdraw_keys(frozenset((conn.key,)))
            return
        if len(frames) != 1:
            self.local.drop("malformed", f"{len(frames)} frames from {conn.endpoint}")
            return
        try:
            messages = control.decode_many(frames[0])  # (a Frame is a buffer: no copy)
        except control.ControlMessageError as exc:
            self.local.drop("malformed", f"from {conn.endpoint}: {exc}")
            return
        for message in messages:
            if isinstance(message, control.Welcome):
                self._on_welcome(conn, message.rank)
            elif isinstance(message, control.Challenge) and conn.peer is None:
                self._on_challenge(conn, message)
            elif isinstance(message, control.Refused) and conn.peer is None:
                # The sender is busy (see control.Refused): fail this connect now, with its hint,
                # rather than at the connect timeout.
                if not conn.future.done():
                    conn.future.set_exception(
                        ConnectionRefusedError(f"the sender at {conn.endpoint} is busy ({message.reason}); retry in about {message.retry_after_ms} ms")
                    )
                self.close_connection(conn)
                return
            elif conn.peer is None:
                self.local.drop("unknown_peer", f"{message.kind} from {conn.endpoint} before its welcome")
            elif isinstance(message, control.Result):
                self._on_result(conn.peer, message)
            elif isinstance(message, control.Offer):
                self._receiver.on_offer(conn.peer, message)
            elif isinstance(message, control.Cancel):  # a sender withdraws an offer it announced
                self._receiver.on_withdraw(conn.peer, message)
            else:
                self.local.drop("unexpected", f"{message.kind} sent to a receiver")
            if self.connections.get(conn.endpoint) is not conn:
                return  # torn down by a handler: the rest of the frame is moot

    def _on_welcome(self, conn: Connection, rank: control.RankInfo) -> None:
        if conn.peer is not None:
            self.local.drop("unexpected", f"second welcome from {conn.endpoint}")
            return
        self._done_waiting(conn)
        # A sender that came back with the same key (a restart, a new address) replaces the old one.
        for other in [c for c in self.connections.values() if c is not conn and c.key == conn.key and c.peer]:
            self.close_connection(other)
        # The sender's name is its key's name on this side's allow-list, never what it claims: a
        # rank that welcomes as "prefill-0" under another key is called by its own key's name, so it
        # cannot take the requests meant for prefill-0 (one connection per key: see above).
        name = rank.name if self.local.plaintext else conn.key_name
        if name != rank.name:
            log.info("transceiver %s: the sender at %s calls itself %r; its key is %r here", self.local.name, conn.endpoint, rank.name, name)
        with self.lock:
            if name in self.peers:
                name = f"{name}@{conn.endpoint}"
            conn.peer = Peer(name, conn.endpoint, rank.layout, rank.num_blocks, conn.key_name)
            self.peers[name] = conn.peer
            self._by_name[name] = conn
            self.version += 1
        if conn.timer is not None:
            conn.timer.cancel()
        peer = conn.peer

        def ready() -> None:  # (once this side knows whether it reads from the sender: see .reads)
            if not conn.future.done() and not conn.closed:
                conn.future.set_result(peer)

        self._receiver.on_welcome(peer, conn.key, rank, ready)

    def connection_of(self, peer_name: str) -> Connection | None:
        """The live connection to the sender called ``peer_name``."""
        conn = self._by_name.get(peer_name)
        if conn is not None and self.connections.get(conn.endpoint) is conn:
            return conn
        return None

    def send_to(self, peer_name: str, message: control.Message) -> bool:
        """Queue one message to a connected sender (sent, batched, before the loop polls again:
        :meth:`flush`); False if it is gone."""
        conn = self.connection_of(peer_name)
        if conn is None:
            return False
        if not conn.outbox:
            self._dirty.append(conn)
        conn.outbox.append((message, control.encode(message)))
        if len(conn.outbox) >= REQUESTS_PER_FRAME:
            self.flush()  # the sender starts on these while this side queues the rest
        return True

    def send_now(self, peer_name: str, message: control.Message) -> str:
        """Send one message on the caller's thread: ``"sent"``, ``"gone"`` (no live connection) or
        ``"unsent"`` (its socket refused it: a full send queue; nothing left)."""
        conn = self.connection_of(peer_name)
        if conn is None:
            return "gone"
        encoded = control.encode(message)
        with conn.lock:
            if conn.closed or conn.peer is None:
                return "gone"
            try:
                conn.socket.send(encoded, zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                log.warning("transceiver %s: could not send a %s to %s: %s", self.local.name, message.kind, conn.endpoint, exc)
                return "unsent"
            self.frames_sent += 1
            self.messages_sent += 1
            self._after_send(conn)
        return "sent"

    def flush(self) -> None:
        """Send what was queued; a full or gone sender loses it (the requests' deadlines cover that)."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            queued, conn.outbox = conn.outbox, []
            if self.connections.get(conn.endpoint) is not conn or conn.peer is None:
                continue
            parts = [encoded for _, encoded in queued]
            unsent: list[control.Message] = []
            with conn.lock:
                if conn.closed:
                    continue
                for start, end in control.frame_spans(parts):
                    try:
                        conn.socket.send(control.batch(parts[start:end]), zmq.NOBLOCK)
                    except zmq.ZMQError as exc:
                        log.warning("transceiver %s: could not send %d message(s) to %s: %s", self.local.name, len(parts) - start, conn.endpoint, exc)
                        unsent = [message for message, _ in queued[start:]]
                        break
                    self.frames_sent += 1
                    self.messages_sent += end - start
                self._after_send(conn)
            if unsent:
                # Not queued, so never written: the receiver role stops waiting for these at once.
                self._on_unsent(conn.peer.name, unsent)

    def close_connection(self, conn: Connection, *, dead: bool = False) -> None:
        """Tear a connection to a sender down; what waited on it is told (``on_peer_gone``; ``dead``:
        the caller knows the sender's process is gone, so nothing it held stays quarantined)."""
        if self.connections.get(conn.endpoint) is conn:
            del self.connections[conn.endpoint]
        self._done_waiting(conn)
        self.local.loop.unregister(conn.fd)
        if conn.monitor is not None:
            self.local.loop.unregister(conn.monitor)
        with conn.lock:
            conn.closed = True
            if conn.monitor is not None:
                try:
                    conn.socket.disable_monitor()
                except zmq.ZMQError:
                    pass
                conn.monitor.close(0)
            conn.socket.close(0)
        if conn.timer is not None:
            conn.timer.cancel()
        if conn.peer is not None:
            with self.lock:
                self.peers.pop(conn.peer.name, None)
                self.version += 1
            if self._by_name.get(conn.peer.name) is conn:
                del self._by_name[conn.peer.name]
            self._on_peer_gone(conn.peer.name, dead)

    def withdraw_keys(self, keys: frozenset[bytes]) -> None:
        """Keys taken off the allow-list (or given another role): close the connections to them."""
        for conn in [c for c in self.connections.values() if c.key in keys]:
            self.local.stats["closed_removed_keys"] += 1
            log.warning(
                "transceiver %s: key %s (%s) left the allow-list; closing the connection to %s",
                self.local.name,
                fingerprint(conn.key),
                conn.key_name,
                conn.endpoint,
            )
            self.close_connection(conn)

    def close(self) -> None:
        """Close every connection (after the loop stopped)."""
        for conn in list(self.connections.values()):
            try:
                self.close_connection(conn)
            except Exception as exc:
                log.debug("transceiver %s: closing a connection failed: %s", self.local.name, exc)
