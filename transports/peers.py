"""Sender side peers: who may talk to this side, over which socket, with which NIXL state.

Sender side: one ROUTER socket, a CURVE server. Its ZAP handler (in the service loop) lets in only
keys on the allow-list, so a stranger's handshake fails before any frame of it is read: it gets no
welcome and learns nothing. Every frame is then checked against the key that authenticated its
connection (ZMQ's ``User-Id``), per-key budgets bound frames, hellos and remembered hellos, and a
hello's NIXL metadata is loaded only when its agent name is bound to that key. The receiver side's
connections to senders are in :mod:`.connections`.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import zmq
from zmq.utils import z85

from . import control
from .discovery import EtcdClient, RegistryError, nixl_metadata_key
from .addresses import address_with_key, agent_carries_key, fingerprint
from .local import PROOF_PREFIX, LocalSide, agent_of_metadata, quietly
from .mapping import BlockSegments, block_segments

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


CRASH_BAN_S = 60.0
"""How long a key whose hello's metadata crashed the probe child is refused."""
PROOF_S = 5.0
"""Longest a receiver may take to echo the proof nonce (less if the transceiver's timeout is)."""


REMEMBERED_RESULTS = 4096
"""Results remembered for asks repeated after a reconnect."""
_HOLD_RETRY_S = 0.02
_HOLD_FRAMES = 4096
"""Frames held at most per receiver while its connection is down."""

BUSY_RETRY_MS = 500
"""The retry hint a busy sender gives (a probe takes ~50-700 ms here)."""


@dataclass
class Proving:
    """A hello waiting for the receiver to echo the nonce sent as a NIXL notification to the agent its
    metadata describes: from a probe child (``release`` ends it; the metadata is loaded here only
    after the echo), or, for metadata loaded here already, from this side's own agent."""

    identity: bytes
    key: bytes
    rank: control.RankInfo
    segments: BlockSegments
    stale: list
    nonce: str
    timer: Any = None
    started: float = field(default_factory=time.monotonic)
    blob: bytes = b""
    release: Callable[[], None] | None = None
    """(Sent by a probe child) ends that child; None when this side's agent sent the nonce."""


def _nothing() -> None:
    pass


@dataclass(eq=False)
class _Sending:
    """A hello whose metadata a probe child is loading, to send the proof nonce from there."""

    identity: bytes
    key: bytes
    release: Callable[[], None] = _nothing
    """Ends that child (see :meth:`.probe.MetadataProbe.prove`)."""
    echo: str | None = None
    """The first proof echo that came on its connection before the child's report did (the nonce can
    reach the receiver, and its echo come back, before the report reaches this loop): judged as the
    first echo once the proving starts."""


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


class Bucket:
    """A token bucket: ``rate`` per second, at most ``burst`` at once."""

    __slots__ = ("rate", "burst", "tokens", "at")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, float(burst), float(burst), time.monotonic()

    def take(self, n: int = 1) -> bool:
        """Take ``n`` tokens (all or none)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < n:
            return False
        self.tokens -= n
        return True


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
        self._hellos: dict[bytes, Bucket] = {}
        self._fetching: dict[bytes, object] = {}
        self._proving: dict[bytes, Proving] = {}
        """Hellos waiting for their proof echo, by connection."""
        self._probing: dict[bytes, _Sending] = {}
        """Hellos whose metadata a probe child is loading to send the proof nonce, by connection (a
        newer hello on a connection ends the child of the one before). With :attr:`_proving`, at most
        ``Limits.unproved_per_peer`` hellos of a key at once (:meth:`_in_flight`)."""
        self._crashed: dict[bytes, float] = {}
        """Keys whose metadata crashed a probe, until when they are refused."""
        self._unproved: dict[bytes, tuple[int, float]] = {}
        """Keys whose last proof failed: (failures in a row, until when their hellos are refused)."""
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
                self._on_hello(identity, key, message)
                return
            if isinstance(message, control.Proof):
                self._on_proof(identity, key, message)
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

    def _refuse(self, key: bytes, rank: control.RankInfo, why: str) -> None:
        self.local.stats["refused_hellos"] += 1
        log.warning("transceiver %s: refused the hello of %r (key %s): %s", self.local.name, rank.name, fingerprint(key), why)

    def _on_hello(self, identity: bytes, key: bytes, hello: control.Hello) -> None:
        rank, limits = hello.rank, self.local.limits
        bucket = self._hellos.get(key)
        if bucket is None:
            bucket = self._hellos[key] = Bucket(limits.hellos_per_s, limits.hello_burst)
        if not bucket.take():
            return self._busy(identity, key, rank, f"busy: too many hellos of this key (hellos_per_s {limits.hellos_per_s:g}, burst {limits.hello_burst})")
        if rank.num_blocks > limits.max_peer_blocks:
            return self._refuse(key, rank, f"pool of {rank.num_blocks} blocks > max_peer_blocks {limits.max_peer_blocks}")
        if not self.local.plaintext and not agent_carries_key(rank.agent, key):
            # Bound to the key: nobody can name another peer's agent and have us write into its memory.
            return self._refuse(key, rank, f"agent name {rank.agent!r} does not carry its key's fingerprint")
        try:
            segments = block_segments(self.local.layout, rank.layout)
        except ValueError as exc:
            return self._refuse(key, rank, str(exc))
        if rank.metadata:
            self._admit(identity, key, rank, rank.metadata, segments)
        elif not os.environ.get("NIXL_ETCD_ENDPOINTS"):
            self._refuse(key, rank, "no NIXL metadata in the hello and no NIXL_ETCD_ENDPOINTS to read it from")
        elif key in self._fetching:  # (busy: told, with a retry hint, rather than left to its timeout)
            self._busy(identity, key, rank, "busy: a metadata read for this key is already in flight")
        elif len(self._fetching) >= limits.fetches:
            self._busy(identity, key, rank, f"busy: {limits.fetches} metadata reads already in flight")
        else:
            self._start_fetch(identity, key, rank, segments)

    def _start_fetch(self, identity: bytes, key: bytes, rank: control.RankInfo, segments: BlockSegments) -> None:
        """Read the metadata ``rank``'s agent published to etcd on a short-lived thread (one per key).

        NIXL's own fetch watches the key; that watch does not survive an etcd restart and then
        wedges the agent. Reading through the JSON gateway, with a timeout on every call, does not.
        """
        token = object()
        self._fetching[key] = token  # a newer hello of the same key supersedes this read
        deadline = time.monotonic() + self.local.timeout_s
        endpoints = os.environ["NIXL_ETCD_ENDPOINTS"]

        def fetch() -> None:
            blob, error = None, "not published"
            try:
                client: EtcdClient | None = EtcdClient(endpoints, timeout_s=1.0)
            except Exception as exc:  # bad endpoints or etcd settings: refused now, its slot freed
                client, error = None, f"cannot read etcd: {exc}"
            while client is not None and not blob and self._fetching.get(key) is token and time.monotonic() < deadline:
                try:
                    blob = client.get(nixl_metadata_key(rank.agent))
                except RegistryError as exc:
                    error = str(exc)
                if not blob:
                    time.sleep(_REFETCH_S)
            try:
                self.local.loop.submit(lambda: self._on_fetched(identity, key, token, rank, segments, blob, error))
            except RuntimeError:  # closed meanwhile
                pass

        threading.Thread(target=fetch, name=f"kvpolicy-fetch-{fingerprint(key)}", daemon=True).start()

    def _on_fetched(self, identity: bytes, key: bytes, token: object, rank: control.RankInfo, segments: BlockSegments, blob: bytes | None, error: str) -> None:
        if self._fetching.get(key) is not token:
            self.local.stats["superseded_hellos"] += 1
            return
        del self._fetching[key]
        if not blob or len(blob) > control.MAX_METADATA:
            return self._refuse(key, rank, f"its metadata was not found in etcd in time ({error})")
        self._admit(identity, key, rank, blob, segments)

    def _admit(self, identity: bytes, key: bytes, rank: control.RankInfo, blob: bytes, segments: BlockSegments) -> None:
        if agent_of_metadata(blob) != rank.agent:
            return self._refuse(key, rank, "its NIXL metadata names another agent")
        # Nothing a peer sends reaches NIXL's parser (here, in a probe child or in load_agent) unread:
        # the whole blob is read strictly against what this hello announced (:mod:`.metadata`).
        problem = self.local.check_metadata(rank, blob)
        if problem is not None:
            return self._refuse(key, rank, problem)
        banned = self._crashed.get(key, 0.0) - time.monotonic()
        if banned > 0:
            return self._refuse(key, rank, f"its metadata crashed the NIXL parser in a probe; refused for {banned:.0f} s more")
        failures, until = self._unproved.get(key, (0, 0.0))
        if until > time.monotonic():
            # A proof's child connects to the agent a hello's metadata describes, before the proof: a
            # key whose proofs fail waits, so it cannot make this process a deputy against a third party.
            return self._refuse(key, rank, f"its last {failures} proof(s) of memory failed; refused for {until - time.monotonic():.1f} s more")
        in_flight = self._in_flight(key, identity)
        if in_flight >= self.local.limits.unproved_per_peer:
            # Ranks that share a key may connect at once: each waits its turn (a busy answer, no ban),
            # and none ends another's proof. What a key's unproved hellos cost anyone stays bounded.
            return self._busy(identity, key, rank, f"busy: {in_flight} hellos of this key are being proved (unproved_per_peer)")
        earlier = self._probing.pop(identity, None)
        if earlier is not None:  # superseded by this hello: its child ends now (it no longer costs anyone a connection)
            earlier.release()
        if self.local.agent_loaded(blob):
            # Loaded already (only proved peers' metadata is): a receiver back with the same agent,
            # whose worker is bound to it. This side's own agent sends the nonce; no third party.
            return self._admit_loaded(identity, key, rank, blob, segments)
        # Unproved metadata never reaches this side's agent: a short-lived probe child (:mod:`.probe`)
        # loads it (NIXL's parser is not hardened: a hello whose metadata kills the child is refused)
        # and sends the nonce from an agent of its own that carries this side's key; the connection
        # it opens to the agent the metadata describes ends with the child, and the metadata is
        # loaded here only once the receiver echoed the nonce.
        nonce = secrets.token_hex(16)
        self._challenge(identity, nonce)
        token = self._probing[identity] = _Sending(identity, key)

        def sent(verdict: str | None) -> None:
            try:
                self.local.loop.submit(lambda: self._on_sent(identity, key, token, rank, blob, segments, nonce, verdict))
            except RuntimeError:
                pass  # closed meanwhile (closing the probe ends its child)

        # The child's agent carries this side's key (a receiver echoes a nonce only to the sender whose
        # key the claimed agent name carries), under a suffix of its own: never this side's agent.
        agent = f"{self.local.name}-{fingerprint(self.local.identity.public)}-{os.getpid()}-{secrets.token_hex(8)}"
        # (per-key slots: one key's burst cannot crowd out first connects)
        token.release = self.local.probe.prove(blob, sent, agent=agent, message=PROOF_PREFIX + nonce.encode(), linger_s=self._proof_s() + 1.0, owner=key)

    def _challenge(self, identity: bytes, nonce: str) -> None:
        """Tell the hello's connection, before the nonce goes out, which nonce to echo: its digest
        (:class:`.control.Challenge`). A receiver waiting for this welcome may get other nonces under
        agent names that carry this side's key (an insider's hello naming that receiver's agent); it
        echoes only this one, so such a nonce cannot fail its proof."""
        try:
            self.router.send_multipart([identity, control.encode(control.Challenge(control.nonce_digest(nonce)))], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # its queue is full or it is gone: its proof then fails at its deadline, as an unanswered one does

    def _proof_s(self) -> float:
        return min(self.local.timeout_s, PROOF_S)

    def _on_sent(
        self, identity: bytes, key: bytes, token: _Sending, rank: control.RankInfo, blob: bytes, segments: BlockSegments, nonce: str, verdict: str | None
    ) -> None:
        """The probe child sent the nonce to the agent the hello's metadata describes (``verdict``
        None), or could not: the proving starts, or the hello is refused."""
        if self._probing.get(identity) is not token:
            token.release()
            self.local.stats["superseded_hellos"] += 1  # a newer hello on its connection is proved instead
            return
        del self._probing[identity]
        if verdict is not None:
            token.release()
            return self._refuse_verdict(identity, key, rank, verdict)
        stale = self._forget_stale(identity, key, rank)
        self._start_proving(Proving(identity, key, rank, segments, stale, nonce, blob=blob, release=token.release))
        if token.echo is not None:
            self._on_proof(identity, key, control.Proof(token.echo))

    def _busy(self, identity: bytes, key: bytes, rank: control.RankInfo, why: str) -> None:
        """Refuse a hello that cannot be taken now (``why`` starts with ``busy``: the probe's slots,
        its key's hellos in flight or per second, metadata reads). Not a verdict on the peer: it is
        told, with a retry hint, instead of being left to its connect timeout."""
        refused = control.Refused(why[:500], BUSY_RETRY_MS)
        try:
            self.router.send_multipart([identity, control.encode(refused)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # its queue is full or it is gone: it times out as before
        self._refuse(key, rank, why)

    def _refuse_verdict(self, identity: bytes, key: bytes, rank: control.RankInfo, verdict: str) -> None:
        """Refuse a hello whose metadata the probe refused, or could not take now (``busy``)."""
        if verdict.startswith("busy"):
            return self._busy(identity, key, rank, f"{verdict} (the sender's metadata probe)")
        if "crashed" in verdict:
            # An honest peer never sends such metadata, and a crash that did not happen in the
            # child may happen here (it depends on memory layout): the key waits before trying again.
            self._crashed[key] = time.monotonic() + CRASH_BAN_S
            self.local.stats["refused_metadata"] += 1
        return self._refuse(key, rank, f"its NIXL metadata failed the probe: {verdict}")

    def _forget_stale(self, identity: bytes, key: bytes, rank: control.RankInfo) -> list[Remote]:
        """What this connection or this agent said before is replaced; beyond the per-key budget,
        the oldest hellos of this key are forgotten with their NIXL state. The forgotten."""
        same_key = [r for r in self.remotes.values() if r.key == key]
        stale = [r for r in same_key if r.identity == identity or r.rank.agent == rank.agent]
        live = [r for r in same_key if r not in stale]
        stale += live[: max(0, len(live) - self.local.limits.remotes_per_peer + 1)]
        for remote in stale:
            self.forget(remote)
        return stale

    def _admit_loaded(self, identity: bytes, key: bytes, rank: control.RankInfo, blob: bytes, segments: BlockSegments) -> None:
        """A hello whose exact metadata is loaded here already: this side's agent sends the nonce."""
        stale = self._forget_stale(identity, key, rank)
        try:
            loaded = self.local.load_agent(blob)
        except Exception as exc:
            return self._refuse(key, rank, f"NIXL rejected its metadata: {exc}")
        if loaded != rank.agent:
            self.local.unload_agent(loaded)
            return self._refuse(key, rank, f"NIXL loaded agent {loaded!r}, not {rank.agent!r}")
        # Prove the memory: the nonce goes as a NIXL notification to the agent this metadata
        # describes, and only that process can echo it (a peer saying hello with another's metadata,
        # renamed as its own agent, never sees it). Welcomed, and written to, only after the echo.
        # 128 bits from the OS's CSPRNG, fresh for this hello and good for one echo: nothing an
        # insider saw of its own proofs helps it guess another's.
        nonce = secrets.token_hex(16)
        self._challenge(identity, nonce)
        try:
            self.local.agent.send_notif(rank.agent, PROOF_PREFIX + nonce.encode())
        except Exception as exc:
            self.local.unload_agent(loaded)
            return self._refuse(key, rank, f"no NIXL notification reaches its agent: {exc}")
        self._start_proving(Proving(identity, key, rank, segments, stale, nonce))

    def _in_flight(self, key: bytes, identity: bytes) -> int:
        """Hellos of ``key`` on other connections than ``identity`` being probed or proved now."""
        return sum(1 for i, s in self._probing.items() if s.key == key and i != identity) + sum(
            1 for i, p in self._proving.items() if p.key == key and i != identity
        )

    def _start_proving(self, proving: Proving) -> None:
        """The nonce is on its way: wait for its echo. A hello again on the same connection before the
        proof of the last one ends that proving as failed."""
        identity = proving.identity
        earlier = self._proving.get(identity)
        if earlier is not None:  # a hello again on the same connection, before the proof of the last one
            self._failed_proof(earlier, "a newer hello on its connection superseded it before its proof of memory came")
        self.local.stats["proofs_asked"] += 1
        proving.timer = self.local.loop.call_at(time.monotonic() + self._proof_s(), lambda: self._proof_expired(proving))
        self._proving[identity] = proving

    def _drop_proving(self, identity: bytes) -> None:
        old = self._proving.pop(identity, None)
        if old is not None:
            old.timer.cancel()
            if old.release is not None:
                old.release()  # (nothing was loaded here)
            else:
                self.local.unload_agent(old.rank.agent)

    def _failed_proof(self, proving: Proving, why: str) -> None:
        """End ``proving`` as failed: its agent unloaded, the key refused for a while (doubling)."""
        if self._proving.get(proving.identity) is proving:
            self._drop_proving(proving.identity)
        self.local.stats["refused_proofs"] += 1
        failures = self._unproved.get(proving.key, (0, 0.0))[0] + 1
        ban = min(self.local.limits.proof_ban_s, 2.0 ** min(failures - 1, 30))
        self._unproved[proving.key] = (failures, time.monotonic() + ban)
        if len(self._unproved) > 4096:  # bounded: the oldest entries go (keys come from the allow-list)
            self._unproved.pop(next(iter(self._unproved)))
        self._refuse(proving.key, proving.rank, f"{why}; its key's hellos are refused for {ban:g} s")

    def _proof_expired(self, proving: Proving) -> None:
        if self._proving.get(proving.identity) is proving:
            self._failed_proof(proving, "it did not echo the nonce sent to the agent of its NIXL metadata in time (is that metadata its own?)")

    def _on_proof(self, identity: bytes, key: bytes, proof: control.Proof) -> None:
        proving = self._proving.get(identity)
        sending = self._probing.get(identity)
        if (proving is None or proving.key != key) and sending is not None and sending.key == key and sending.echo is None:
            sending.echo = proof.nonce  # (it outran the child's report)
        elif proving is None or proving.key != key:
            self.local.drop("unexpected", "a proof from a connection that was not asked for one")
        elif not secrets.compare_digest(proof.nonce, proving.nonce):
            # The first wrong echo ends the proving (a guess gets one try per hello, and hellos are
            # rate-limited per key) and counts against the key.
            self._failed_proof(proving, "it echoed a wrong proof nonce (is the NIXL metadata of its hello its own?)")
        else:
            del self._proving[identity]
            proving.timer.cancel()
            self._unproved.pop(key, None)
            if proving.release is not None:
                # Proved: its probe child is done, and its metadata may now be loaded here.
                proving.release()
                rank = proving.rank
                try:
                    loaded = self.local.load_agent(proving.blob)
                except Exception as exc:
                    return self._refuse(key, rank, f"NIXL rejected its metadata: {exc}")
                if loaded != rank.agent:
                    self.local.unload_agent(loaded)
                    return self._refuse(key, rank, f"NIXL loaded agent {loaded!r}, not {rank.agent!r}")
            self.local.bind_worker(proving.rank.agent)
            self._welcome(proving)

    def _welcome(self, proving: Proving) -> None:
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
                self._refuse(remote.key, remote.rank, "writes to its earlier connection did not end in time")
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
        self._fetching.clear()
        for sending in self._probing.values():
            sending.release()
        self._probing.clear()
        for identity in list(self._proving):
            self._drop_proving(identity)
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
