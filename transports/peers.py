"""Sender side peers: who may talk to this side, over which socket, with which NIXL state.

Sender side: one ROUTER socket, a CURVE server. Its ZAP handler (in the service loop) lets in only
keys on the allow-list, so a stranger's handshake fails before any frame of it is read: it gets no
welcome and learns nothing. Every frame is then checked against the key that authenticated its
connection (ZMQ's ``User-Id``) and per-key budgets bound frames and remembered hellos. A hello is
taken from its arrival to its welcome (bounded, its metadata read, probed and proved) by
:mod:`.admission`; this module welcomes the proved (:meth:`Remotes.welcome`) and keeps them. The
receiver side's connections to senders are in :mod:`.connections`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, cast

import zmq
from zmq.utils import z85

from . import control
from .addresses import address_with_key, fingerprint
from .admission import Admission, Proving
from .local import Bucket, LocalSide, quietly
from .mapping import BlockSegments

log = logging.getLogger("kvpolicy.transports")

# POLLIN as a plain int (pyzmq's flag enums make ``events & POLLIN`` build a member, as slow as the
# call), EVENTS as its member (``get`` looks an int option up in the enum, a member it passes through).
_EVENTS, _POLLIN = zmq.EVENTS, int(zmq.POLLIN)
_NOBLOCK, _SNDMORE_NOBLOCK = int(zmq.NOBLOCK), int(zmq.SNDMORE | zmq.NOBLOCK)

_MAX_FRAME = 16 << 20
_REFETCH_S = 0.25
_HANDSHAKE_MS = 5000
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"
RESULTS_PER_FRAME = 16
"""Queued results are sent once this many wait for one receiver (and at the end of every read)."""
TURN_S = 100e-6
"""The longest the ROUTER handler reads frames in one turn of the loop; then writes in flight are
polled, due timers run and queued results go out before it reads on (250 us let another key's flood
of single asks double a receiver's p50 in one of three phases of bench/flood.py; 100 us: 1.21-1.28x). Without it a turn was 256
frames of up to 256 messages each: one allowed peer flooding asks within its budget held another
receiver's write completion and result for a whole turn (issue 26)."""


REMEMBERED_RESULTS = 4096
"""Results remembered for asks repeated after a reconnect."""
_HOLD_RETRY_S = 0.02
_HOLD_FRAMES = 4096
"""Frames held at most per receiver while its connection is down."""


@dataclass
class Remote:
    """A receiver that said hello to our ROUTER socket, authenticated by ``key``."""

    identity: bytes
    key: bytes
    key_name: str
    rank: control.RankInfo
    segments: BlockSegments
    prepped: Any = None
    """NIXL's prepared descriptor list of the receiver's whole blocks (made on the first write)."""
    kept: OrderedDict = field(default_factory=OrderedDict)
    """Finished whole-block transfer handles to this receiver, by block lists (see :mod:`.writes`)."""
    writes: int = 0
    """Writes to it (or, for a sender this side reads from, reads from it) in flight."""
    gone: bool = False
    unloaded: bool = False

    @functools.cached_property
    def whole_blocks(self) -> bool:
        """Both sides hold the same layers and heads: a block is one run, block to block."""
        runs = self.segments.runs
        return len(runs) == 1 and int(runs[0, 0]) == 0 and int(runs[0, 1]) == 0 and int(runs[0, 2]) == self.rank.layout.block_bytes


class Remotes:
    """Sender side: the ROUTER socket, its ZAP handler, and the receivers that said hello, with
    their NIXL state. Runs on the service thread."""

    def __init__(self, local: LocalSide, *, host: str, port: int, sender: Any) -> None:
        """``sender``: the sender role, told of asks, cancels, releases and receivers forgotten."""
        self.local = local
        self._on_request, self._on_cancel, self._on_remote_gone = sender.on_request, sender.on_cancel, sender.on_remote_gone
        self._on_release = sender.on_release
        identity = local.identity
        # A context of our own: the ZAP endpoint is per context, and a process may hold several transceivers.
        self.ctx = zmq.Context()
        self.zap = self.ctx.socket(zmq.REP)
        self.zap.setsockopt(zmq.LINGER, 0)
        self.router = self.ctx.socket(zmq.ROUTER)
        # ROUTER_HANDOVER: a receiver whose TCP connection was reset reconnects with its own routing
        # id (see .connections); its session (hello, NIXL state) carries over to the new pipe. Every
        # frame is still checked against the key that authenticated the pipe it came on.
        # ROUTER_MANDATORY: a send to a receiver whose pipe is down (its TCP connection was reset and
        # ZeroMQ is reconnecting) fails instead of vanishing, so the frame is held and sent again once
        # the handed-over pipe is up (:meth:`_send`): a result is not lost to a reset.
        for option, value in (
            (zmq.LINGER, 0),
            (zmq.MAXMSGSIZE, _MAX_FRAME),
            (zmq.HANDSHAKE_IVL, _HANDSHAKE_MS),
            (zmq.ROUTER_HANDOVER, 1),
            (zmq.ROUTER_MANDATORY, 1),
        ):
            self.router.setsockopt(option, value)
        if not local.plaintext:
            self.zap.bind(_ZAP_ENDPOINT)
            self.router.curve_secretkey = identity.secret
            self.router.curve_publickey = identity.public
            self.router.curve_server = True
            self.router.zap_domain = b"kvpolicy"
        if port:
            self.router.bind(f"tcp://{host}:{port}")
        else:
            self.router.bind_to_random_port(f"tcp://{host}")
        self.endpoint: str = cast(bytes, self.router.getsockopt(zmq.LAST_ENDPOINT)).decode()  # (a bytes option)
        self.address = address_with_key(self.endpoint, identity.public)
        self.remotes: dict[bytes, Remote] = {}
        self._frames: dict[bytes, Bucket] = {}
        self.admission = Admission(local, self)
        """Hellos from their arrival to their welcome (:mod:`.admission`)."""
        self._results: OrderedDict[tuple[bytes, str, int], bytes] = OrderedDict()
        """The last results sent, by (key, request id, nonce): an ask repeated after a reconnect gets it again."""
        self._held: dict[bytes, tuple[float, list[bytes]]] = {}
        """Frames for receivers whose pipe is down (a TCP reset), with until when they are kept."""
        self._outbox: dict[bytes, list[bytes]] = {}
        """Encoded results queued per receiver connection this iteration (sent by :meth:`flush`)."""
        self.frames_sent = self.messages_sent = 0
        """Result frames and the messages in them sent to receivers (batching makes the first smaller)."""
        self._alone = False
        """The frame being handled is the first of a wake-up and holds one message: its result
        leaves at once (:meth:`reply`)."""

    def start(self) -> None:
        """Start serving the ZAP handler and the ROUTER (on the service thread)."""
        self.local.loop.register(self.zap, self._on_zap)
        self.local.loop.register(self.router, self._on_router)
        self.local.loop.add_flusher(self.flush)

    # -- authentication ---------------------------------------------------------------------------

    def _on_zap(self) -> None:
        for _ in range(64):
            try:
                frames = self.zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            version, request_id = (frames + [b"", b""])[:2]
            key = None
            if len(frames) == 7 and frames[5] == b"CURVE" and len(frames[6]) == 32:
                key = z85.encode(frames[6])
            # This socket serves receivers: a key that carries the prefill role is a stranger here
            # (one shared peers folder still keeps a compromised sender from saying hello to another).
            name = None if self.local.plaintext else self.local.allowed.name_of(key, role="decode") if key else None
            if name is None:
                self.local.stats["refused_handshakes"] += 1
                log.info("transceiver %s: refused a handshake from %s (key not allowed)", self.local.name, frames[3:4])
                self.zap.send_multipart([version, request_id, b"400", b"key not allowed", b"", b""])
            else:
                assert key is not None  # a name is only found for a key
                self.zap.send_multipart([version, request_id, b"200", b"OK", key, b""])

    # -- sender side: frames on the ROUTER --------------------------------------------------------

    def _on_router(self) -> None:
        self.local.check_allow_list()  # (a key taken off the list loses its session first)
        router, first = self.router, True
        until = time.perf_counter() + TURN_S
        for _ in range(256):  # bounded, so one chatty peer cannot starve the rest of the loop
            try:
                # A ROUTER delivers the peer's identity as the first part of every message.
                identity = router.recv(_NOBLOCK)
                frame = router.recv(_NOBLOCK, copy=False)
            except zmq.Again:
                break
            parts = 2
            while frame.more:  # more parts than a control message has: read them all, then drop
                frame = router.recv(_NOBLOCK, copy=False)
                parts += 1
            # The first frame of a wake-up, if it holds one message, is answered at once (its result
            # leaves before the sender's own bookkeeping); the results of frames that were waiting
            # behind it (load) are batched.
            self._alone = first
            first = False
            try:
                if parts != 2:
                    self.local.drop("malformed", f"{parts} frames")
                else:
                    self._on_router_frame(identity, frame)
            except Exception:
                log.exception("transceiver %s: error handling a frame (dropped)", self.local.name)
                self.local.stats["internal_errors"] += 1
            self._alone = False
            # (the check: half the price of a failed receive)
            if time.perf_counter() >= until or not router.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]  # pyzmq types every option int | bytes; EVENTS is an int
                break
        # The results of what was just read go out now, one frame per receiver, not after the rest
        # of the loop's iteration.
        self.flush()

    def _on_router_frame(self, identity: bytes, frame: zmq.Frame) -> None:
        key = b"plaintext" if self.local.plaintext else frame.get("User-Id").encode()  # type: ignore[union-attr]  # pyzmq types Frame.get int | str; "User-Id" is a str
        bucket = self._frames.get(key)
        if bucket is None:
            bucket = self._frames[key] = Bucket(self.local.limits.frames_per_s, self.local.limits.frame_burst)
        if not bucket.take():
            self.local.stats["dropped_over_budget"] += 1
            return
        try:
            messages = control.decode_many(frame)  # (a Frame is a buffer: no copy)
        except control.ControlMessageError as exc:
            self.local.drop("malformed", str(exc))
            return
        if len(messages) > 1:
            self._alone = False
            if not bucket.take(len(messages) - 1):  # the budget counts messages
                self.local.stats["dropped_over_budget"] += 1
                return
        if not self.local.plaintext and not self.local.allowed.contains(key, role="decode"):
            # Taken off the allow-list since its handshake (seen at the last look at the folder).
            self.local.check_allow_list(now=True)
            self.local.drop("unknown_peer", "a frame from a key no longer on the allow-list")
            return
        for message in messages:
            if isinstance(message, control.Hello):
                self.admission.on_hello(identity, key, message)
                return
            if isinstance(message, control.Proof):
                self.admission.on_proof(identity, key, message)
                return
            remote = self.remotes.get(identity)
            if remote is None or remote.key != key:
                self.local.drop("unknown_peer", f"{message.kind} from a connection that never said hello")
            elif isinstance(message, control.Request):
                self._on_request(remote, message)
            elif isinstance(message, control.Cancel):
                self._on_cancel(remote, message)
            elif isinstance(message, control.Release):
                self._on_release(remote, message)
            else:
                self.local.drop("unexpected", f"{message.kind} sent to a sender")

    def withdraw_keys(self, keys: frozenset[bytes]) -> None:
        """Keys taken off the allow-list (or given another role): forget their receivers now. ZMQ
        cannot close one peer's pipe of a ROUTER, so their connections stay open but dead: every
        frame on them is dropped as from a peer that never said hello, and no new handshake passes."""
        for remote in [r for r in self.remotes.values() if r.key in keys]:
            self.local.stats["closed_removed_keys"] += 1
            log.warning("transceiver %s: key %s (%s) left the allow-list; its receiver is forgotten", self.local.name, fingerprint(remote.key), remote.key_name)
            self.forget(remote)

    def forget_stale(self, identity: bytes, key: bytes, rank: control.RankInfo) -> list[Remote]:
        """What this connection or this agent said before is replaced; beyond the per-key budget,
        the oldest hellos of this key are forgotten with their NIXL state. The forgotten."""
        same_key = [r for r in self.remotes.values() if r.key == key]
        stale = [r for r in same_key if r.identity == identity or r.rank.agent == rank.agent]
        live = [r for r in same_key if r not in stale]
        stale += live[: max(0, len(live) - self.local.limits.remotes_per_peer + 1)]
        for remote in stale:
            self.forget(remote)
        return stale

    def welcome(self, proving: Proving) -> None:
        """A receiver proved its memory (:mod:`.admission`): it becomes a remote, welcomed once no
        write to an earlier hello of its key is in flight."""
        identity, key, rank, segments, stale = proving.identity, proving.key, proving.rank, proving.segments, proving.stale
        key_name = self.local.allowed.name_of(key) or fingerprint(key)
        remote = Remote(identity, key, key_name, rank, segments)
        self.remotes[identity] = remote
        try:
            # Wire up now rather than inside the first request's write (~30 ms on first use).
            self.local.agent.make_connection(rank.agent)
        except Exception as exc:
            log.debug("transceiver %s: early connection to %s failed: %s", self.local.name, rank.name, exc)
        self.welcome_when_clean(remote, stale, time.monotonic() + self.local.timeout_s)

    def welcome_when_clean(self, remote: Remote, stale: list[Remote], deadline: float) -> None:
        """Welcome ``remote`` once no write to an earlier hello of its key (``stale``, forgotten and
        aborted) is in flight: a welcome promises the receiver that nothing this process wrote
        before it can still land, so it may release the blocks it quarantined for this side."""
        if self.remotes.get(remote.identity) is not remote:
            return  # superseded or forgotten meanwhile
        if any(old.writes for old in stale):
            if time.monotonic() < deadline:
                self.local.loop.call_at(time.monotonic() + 0.01, lambda: self.welcome_when_clean(remote, stale, deadline))
            else:
                self.forget(remote)
                self.admission.refuse(remote.key, remote.rank, "writes to its earlier connection did not end in time")
            return
        # With reads allowed, the welcome carries this side's metadata: the receiver reads offers itself.
        welcome = control.Welcome(self.local.rank_info(with_metadata=self.local.reads))
        self._send(remote.identity, [control.encode(welcome)])

    def forget(self, remote: Remote) -> None:
        """Forget a receiver: its asks end now; its NIXL state goes once no write uses it."""
        if self.remotes.get(remote.identity) is remote:
            del self.remotes[remote.identity]
        remote.gone = True
        self._on_remote_gone(remote)
        if not remote.writes:
            self.release(remote)

    def release(self, remote: Remote) -> None:
        """Drop a forgotten receiver's kept handles, prepared list and its use of its NIXL agent."""
        release_remote(self.local, remote)

    def resend_result(self, remote: Remote, ask: tuple[bytes, str, int]) -> bool:
        """Send again the result this side sent for ``ask`` (key, request id, nonce), if it still
        remembers it (the last :data:`REMEMBERED_RESULTS`); False if not."""
        encoded = self._results.get(ask)
        if encoded is None:
            return False
        self._outbox.setdefault(remote.identity, []).append(encoded)
        return True

    def reply(self, remote: Remote, message: control.Message) -> None:
        """Queue one message to a receiver; the loop sends what was queued at the end of this
        iteration, several messages per frame (:meth:`flush`)."""
        parts = self._outbox.setdefault(remote.identity, [])
        encoded = control.encode(message)
        parts.append(encoded)
        if isinstance(message, control.Result):
            self._results[(remote.key, message.request_id, message.nonce)] = encoded
            if len(self._results) > REMEMBERED_RESULTS:
                self._results.popitem(last=False)
        if self._alone:  # the frame held one request: its result leaves now, before the bookkeeping
            self._send(remote.identity, self._outbox.pop(remote.identity))
        elif len(parts) >= RESULTS_PER_FRAME:
            # Results leave in frames of a few: the receiver works on them while this side serves
            # the rest (one frame for everything read in a turn makes the two sides take turns).
            self._send(remote.identity, self._outbox.pop(remote.identity))

    def flush(self) -> None:
        """Send the queued messages; a full or gone peer loses them (their deadlines cover that)."""
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, {}
        for identity, parts in outbox.items():
            self._send(identity, parts)

    def _send(self, identity: bytes, parts: list[bytes]) -> None:
        self.messages_sent += len(parts)
        frames = parts if len(parts) == 1 else list(control.frames(parts))
        if identity in self._held:  # (behind what is held already: order kept)
            self._hold(identity, frames)
            return
        sent, exc = self._send_frames(identity, frames)
        if exc is None:
            return
        if exc.errno == zmq.EHOSTUNREACH and identity in self.remotes:
            self._hold(identity, frames[sent:])  # its pipe is down: a reset, reconnecting
        else:
            log.warning("transceiver %s: could not send %d message(s) to a receiver: %s", self.local.name, len(parts), exc)

    def _send_frames(self, identity: bytes, frames: list[bytes]) -> tuple[int, zmq.ZMQError | None]:
        """Send ``frames`` to ``identity`` until one fails: how many went, and the error."""
        for n, frame in enumerate(frames):
            try:
                self.router.send(identity, _SNDMORE_NOBLOCK)
                self.router.send(frame, _NOBLOCK)
            except zmq.ZMQError as exc:
                return n, exc
            self.frames_sent += 1
        return len(frames), None

    def _hold(self, identity: bytes, frames: list[bytes]) -> None:
        """Keep ``frames`` for a receiver whose pipe is down and try again every 20 ms, until its
        pipe is back (ZeroMQ hands the reconnected one over), it is forgotten, or the transceiver's
        timeout passes (then they are dropped: the receiver's own deadlines cover that)."""
        held = self._held.get(identity)
        if held is None:
            held = self._held[identity] = (time.monotonic() + self.local.timeout_s, [])
            self.local.loop.call_at(time.monotonic() + _HOLD_RETRY_S, lambda: self._retry_held(identity))
        if len(held[1]) + len(frames) > _HOLD_FRAMES:
            log.warning("transceiver %s: more than %d frames held for a receiver whose connection is down; dropped", self.local.name, _HOLD_FRAMES)
            return
        held[1].extend(frames)
        self.local.stats["held_for_reconnect"] += len(frames)

    def _retry_held(self, identity: bytes) -> None:
        deadline, frames = self._held.pop(identity, (0.0, []))
        if not frames:
            return
        if identity not in self.remotes or time.monotonic() >= deadline:
            log.warning("transceiver %s: %d frame(s) for a receiver whose connection did not come back were dropped", self.local.name, len(frames))
            return
        sent, exc = self._send_frames(identity, frames)
        if exc is not None and exc.errno == zmq.EHOSTUNREACH:
            self._held[identity] = (deadline, frames[sent:])
            self.local.loop.call_at(time.monotonic() + _HOLD_RETRY_S, lambda: self._retry_held(identity))
        elif exc is not None:
            log.warning("transceiver %s: could not send %d held frame(s) to a receiver: %s", self.local.name, len(frames) - sent, exc)

    def close(self) -> None:
        """Forget every receiver and close the sockets (after the loop stopped)."""
        for remote in list(self.remotes.values()):
            remote.writes = 0
            self.forget(remote)
        self.admission.close()
        for socket in (self.router, self.zap):
            socket.close(0)


def release_remote(local: LocalSide, remote: Remote) -> None:
    """Release a peer's kept transfer handles and prepared list, and its use of its NIXL agent (once)."""
    while remote.kept:
        quietly(local.name, "a kept transfer handle", remote.kept.popitem()[1].release)
    if remote.prepped is not None:
        quietly(local.name, "a prepared list", local.agent.release_dlist_handle, remote.prepped)
        remote.prepped = None
    if not remote.unloaded:
        remote.unloaded = True
        local.unload_agent(remote.rank.agent)
