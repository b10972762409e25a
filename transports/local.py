"""What every role of a transceiver shares: the local pool and agent, keys, limits, counters.

The roles (:mod:`.peers`, :mod:`.sender`, :mod:`.receiver`) each hold one :class:`LocalSide` and
run only on the service thread (:mod:`.loop`), so none of this needs a lock except where a
caller's thread reads it (``stats`` is read as a snapshot).
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from . import control
from .keys import AllowList, Identity
from .loop import ServiceLoop
from .metadata import Expected, MetadataError, admit, read_metadata
from .pool import BlockPool
from .request import TransferHandle

log = logging.getLogger("kvpolicy.transports")

REMEMBERED = 4096
"""How many ended request ids each side remembers, to answer late frames instead of counting them
as foreign. Bounded: memory does not grow with the number of requests served."""

STAT_NAMES = (
    "dropped_malformed",
    "dropped_unknown_peer",
    "dropped_unknown_request",
    "dropped_unexpected",
    "dropped_not_addressee",
    "dropped_over_budget",
    "dropped_stale_attempt",
    "refused_handshakes",
    "refused_hellos",
    "internal_errors",
    "late_frames",
    "dropped_notifications",
    "releases_expired",
    "quarantined_blocks",
    "refused_proofs",
    "closed_removed_keys",
    "refused_metadata",
    "malformed_metadata",
    "proofs_asked",
    "superseded_hellos",
    "agents_loaded",
    "held_for_reconnect",
    "reconnects",
    "repeated_asks",
    "foreign_proofs",
)

ALLOW_LIST_CHECK_S = 0.1
"""While frames arrive, how often the allow-list folder is looked at for keys taken off it."""

PROOF_PREFIX = b"kvpolicy-proof:"
"""A sender that loaded a receiver's NIXL metadata sends this prefix and a nonce as a NIXL
notification to the agent that metadata describes; the receiver echoes the nonce over its CURVE
connection (``proof``). Only the process owning that agent receives it: a peer that says hello with
another peer's metadata (renamed as its own agent) never learns it, so it is never welcomed."""

IDLE_AGENTS = 16
"""Peer agents whose last use ended that stay loaded in NIXL, most recently used last: a peer that
says hello again with one of them (a reconnect, or hellos alternating between its agents) finds it
loaded. Removing it would not close NIXL's connection to it while it lives (see
:meth:`LocalSide.load_agent`), and loading it again would open another."""

NOTIFICATION_DRAIN_BUSY_S = 0.01
"""How soon NIXL's notification queue is emptied again after a drain that found something (on a
timer, at least as long as that drain took: a flood costs the service thread at most half its time)."""


@dataclass(frozen=True)
class Limits:
    """Budgets that bound what one peer can make this side hold or do. Every one is finite."""

    max_peer_blocks: int = 1 << 18
    """Largest pool a receiver may declare in its hello (the sender prepares one descriptor per block)."""
    remotes_per_peer: int = 4
    """Live hellos kept per peer key; a newer one forgets the oldest (and its NIXL state)."""
    parked_per_peer: int = 1024
    """Asks for requests not offered yet, held per peer key; more are refused at once."""
    park_s: float = 30.0
    """Longest an ask waits for its offer (less if its own deadline is sooner)."""
    frames_per_s: float = 50_000.0
    frame_burst: int = 10_000
    hellos_per_s: float = 5.0
    hello_burst: int = 20
    unproved_per_peer: int = 4
    """Hellos of one key (on different connections) whose metadata is being probed or whose proof of
    memory is still awaited; a hello of the key beyond them is answered ``busy`` with a retry hint
    (no ban: ranks that share a key may connect at once), and a newer hello on the same connection
    supersedes its earlier one. Each has a probe child that sent the nonce and lives until the
    proof ends, connected to the agent the hello's metadata describes (a third party, if the metadata
    is not the peer's own; this side's agent loads it only once proved): this bounds how many such
    connections one key has open at once (as many as the live hellos a key may keep,
    ``remotes_per_peer``)."""
    proof_ban_s: float = 60.0
    """After a failed proof (a wrong echo, none in time, or superseded unproved) a key's hellos are
    refused before their metadata is read: 1 s after the first failure, doubling to at most this.
    A proof that succeeds clears it. So 1,000 unproved hellos from one key make this process's probe
    children connect to about ``log2(proof_ban_s) + elapsed / proof_ban_s`` agents, not 1,000 (and
    its own agent to none)."""
    fetches: int = 8
    """Metadata reads from etcd in flight at once (one per peer key at most)."""
    offers_per_peer: int = 4096
    """Offers a sender may have announced to this receiver and not yet seen taken; more are declined."""
    release_grace_s: float = 5.0
    """(Reads) How long after an announced offer ended the sender still waits for a receiver's
    release before it takes its blocks back (counted in ``releases_expired``): a receiver that never
    releases, or closed its socket, cannot pin a sender's blocks for longer. A receiver stops reading
    at its own deadline, so only one that ignores that (or is stuck for this long) can read blocks
    already given to another request; it holds the metadata of the whole pool anyway."""
    quarantined_per_peer: int = 4096
    """(Receivers) Blocks a sender name may keep quarantined (fenced after a disconnect, since that
    process may still write them): while it holds more, new receives that would ask it are refused,
    with what it holds and how to release it (``disconnect(name, dead=True)`` once it is known to be
    gone). A sender that never answers cannot pin more of this side's pool than this, over any number
    of reconnects of new processes under its name."""
    notification_drain_s: float = 1.0
    """How often NIXL's notification queue is emptied while the service thread is awake anyway (an
    idle side does not wake for it); every 10 ms while something arrives. This protocol sends no
    notification, but any agent holding this side's metadata can, and NIXL keeps every one,
    unbounded, until it is taken."""

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"Limits.{name} must be a finite positive number, got {value!r}")
        if self.max_peer_blocks > control.MAX_POOL_BLOCKS:
            raise ValueError(f"Limits.max_peer_blocks may be at most {control.MAX_POOL_BLOCKS}")


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


class LocalSide:
    """The local pool, NIXL agent, identity, allowed peers, limits, counters and loop."""

    def __init__(
        self,
        *,
        name: str,
        pool: BlockPool,
        agent: Any,
        agent_name: str,
        identity: Identity,
        allowed: AllowList,
        timeout_s: float,
        limits: Limits,
        metadata: str,
        loop: ServiceLoop,
        log_requests: bool,
        plaintext: bool = False,
        reads: bool = False,
        backends: tuple[str, ...] = ("UCX",),
    ) -> None:
        self.name = name
        self.backends = backends
        """The NIXL backends this side configured: a peer's metadata must offer exactly these."""
        self._workers: dict[int, str] = {}
        """UCX worker uuid -> the proved agent loaded in NIXL with it (in use or idle)."""
        self._own_ucx: bytes | None = None
        """This side's own UCX worker address (a peer's must have its form), read at the first hello."""
        self._own_worker: int | None = None
        """The uuid in it (a peer's metadata naming this side's own worker is refused)."""
        self.pool = pool
        self.layout = pool.layout
        self.agent = agent
        self.agent_name = agent_name
        self.identity = identity
        self.allowed = allowed
        self.timeout_s = timeout_s
        self.limits = limits
        self.metadata = metadata
        self.loop = loop
        self.log_requests = log_requests
        self.plaintext = plaintext
        """Benchmarks only: no CURVE, no allow-list, every peer is one anonymous key."""
        self.reads = reads
        """Receivers named in an offer may read its blocks (the sender's metadata goes in the welcome)."""
        self._agents: dict[str, int] = {}
        self._blobs: dict[str, bytes] = {}
        """The metadata last loaded per agent loaded in NIXL (a re-load of the same is no NIXL call)."""
        self._idle: OrderedDict[str, None] = OrderedDict()
        """Agents loaded in NIXL that no one uses now (at most :data:`IDLE_AGENTS`)."""
        self.stats: dict[str, int] = dict.fromkeys(STAT_NAMES, 0)
        self.probe: Any = None
        """The :class:`~.probe.MetadataProbe` that loads a peer's metadata in a child first."""
        self._allow_list_checked = 0.0
        self._allow_list_timer: Any = None
        self.on_withdrawn: Callable[[frozenset[bytes]], None] = lambda keys: None
        """Told of keys taken off the allow-list (:meth:`check_allow_list`)."""
        self.proofs_wanted = 0
        """Connections waiting for a welcome (and so for a proof nonce among the notifications)."""
        self.on_proof: Callable[[str, str], None] = lambda agent, nonce: None
        """Told of each proof nonce that arrives, with the agent name its sender claims."""
        self._notification_warned = 0.0
        self._next_drain = time.monotonic() + limits.notification_drain_s
        loop.add_flusher(self._drain_when_due)
        self.handle_ended: Callable[[TransferHandle], None] = lambda handle: None
        """Told of every handle that ended (the facade forgets it: memory stays bounded)."""

    def load_agent(self, blob: bytes) -> str:
        """Load a peer's NIXL metadata, or count one more use of an agent already loaded (a peer may
        be both a receiver of this side and a sender to it, and says hello again); the agent name
        NIXL loaded.

        An agent loaded once is not removed and added again while it may come back: NIXL's
        ``remove_remote_agent`` does not close the UCX connection to a peer whose agent lives on
        (UCX keeps a TCP connection the peer also uses open for receiving), and the next add opens
        another: one descriptor per hello, kept until the peer exits. New metadata of a loaded agent
        is loaded over the old (NIXL keeps the connection and updates the memory sections)."""
        name = agent_of_metadata(blob)
        if name is not None and name in self._blobs:
            if self._blobs[name] != blob:
                self.agent.add_remote_agent(blob)
                self.stats["agents_loaded"] += 1
                self._blobs[name] = blob
            self._idle.pop(name, None)
            self._agents[name] = self._agents.get(name, 0) + 1
            return name
        loaded = self.agent.add_remote_agent(blob)
        self.stats["agents_loaded"] += 1  # (metadata given to this side's agent: only proved peers', or chosen ones')
        loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        self._agents[loaded] = self._agents.get(loaded, 0) + 1
        self._blobs[loaded] = blob
        return loaded

    def bind_worker(self, agent: str) -> None:
        """``agent`` proved it owns the memory its metadata describes (or is a sender this side
        authenticated): its UCX worker is its, and a copy of it under another name is refused by
        :meth:`check_metadata` from now on (until NIXL forgets the agent). Only proved agents bind a
        worker: an unproved copy loaded first cannot lock the owner out."""
        worker = _worker_of(self._blobs.get(agent, b""))
        if worker is not None:
            self._workers[worker] = agent

    def check_metadata(self, rank: control.RankInfo, blob: bytes) -> str | None:
        """None when ``blob`` is NIXL metadata NIXL may read: exactly NIXL's format, the agent the
        hello named, this side's backends, and one region, the pool the hello announced
        (:func:`.metadata.admit`); else why not (counted in ``malformed_metadata``). Nothing a peer
        sends reaches NIXL's own parser without passing this."""
        if self._own_ucx is None:
            self._own_ucx = dict(read_metadata(self.agent.get_agent_metadata()).connections).get("UCX", b"")
            self._own_worker = _worker_of_address(self._own_ucx)
        expected = Expected(
            rank.agent, self.backends, rank.memory_type, rank.base_address, rank.num_blocks * rank.layout.block_bytes, rank.device_id, self._own_ucx
        )
        try:
            admit(blob, expected)
        except MetadataError as exc:
            self.stats["malformed_metadata"] += 1
            return f"its NIXL metadata is not what this deployment expects ({exc})"
        # A copy of a loaded agent's worker (or of this side's own) under another agent name is
        # refused before NIXL connects to it: a peer cannot use this side to reach a process it
        # already serves, or itself.
        worker = _worker_of(blob)
        owner = self._workers.get(worker) if worker is not None else None
        if owner is not None and owner != rank.agent:
            self.stats["malformed_metadata"] += 1
            return f"its UCX worker address is that of agent {owner!r}, loaded here already (is that metadata its own?)"
        if worker is not None and worker == self._own_worker:
            self.stats["malformed_metadata"] += 1
            return "its UCX worker address is this side's own (is that metadata its own?)"
        return None

    def agent_loaded(self, blob: bytes) -> bool:
        """Whether exactly this metadata is loaded already (in use or idle): no probe needed."""
        name = agent_of_metadata(blob)
        return name is not None and self._blobs.get(name) == blob

    def unload_agent(self, name: str) -> None:
        """One use of a loaded agent ended; with the last it stays loaded, idle, and NIXL forgets
        it once :data:`IDLE_AGENTS` more recent ones are idle."""
        uses = self._agents.get(name, 0) - 1
        if uses > 0:
            self._agents[name] = uses
            return
        self._agents.pop(name, None)
        if name in self._blobs:
            self._idle[name] = None
        while len(self._idle) > IDLE_AGENTS:
            oldest, _ = self._idle.popitem(last=False)
            worker = _worker_of(self._blobs.pop(oldest))
            if worker is not None and self._workers.get(worker) == oldest:
                del self._workers[worker]
            try:
                self.agent.remove_remote_agent(oldest)
            except Exception as exc:
                log.debug("transceiver %s: removing agent %s failed: %s", self.name, oldest, exc)

    def _drain_when_due(self) -> None:
        if time.monotonic() >= self._next_drain:
            self.drain_notifications()

    def drain_notifications(self) -> None:
        """(Service thread.) Take and drop the NIXL notifications peers sent; while some come, again
        on a timer until none do.

        Completion is a result frame, so every notification is foreign. Its sender's name is what the
        sender claims (NIXL checks nothing), so it is logged, not acted on. NIXL keeps notifications
        until they are taken, with no bound and no way to refuse them: draining frees a trickle and
        counts it (``dropped_notifications``); a flood faster than the drain still grows memory."""
        found = 0
        started = time.monotonic()
        try:
            notifications = self.agent.get_new_notifs()
            found = sum(map(len, notifications.values()))
        except Exception as exc:
            log.debug("transceiver %s: reading NIXL notifications failed: %s", self.name, exc)
        if found and self.proofs_wanted:
            found -= self._take_proofs(notifications)
        if found:
            before = self.stats["dropped_notifications"]
            self.stats["dropped_notifications"] = before + found
            if before == 0 or time.monotonic() >= self._notification_warned + 10.0:
                self._notification_warned = time.monotonic()
                log.warning(
                    "transceiver %s: dropped %d NIXL notification(s) claiming to come from %s (%d in all); this "
                    "protocol sends none: an agent holding this side's metadata is sending them",
                    self.name,
                    found,
                    sorted(notifications)[:4],
                    before + found,
                )
        now = time.monotonic()
        if not found:
            self._next_drain = now + self.limits.notification_drain_s
            return
        self._next_drain = now + max(NOTIFICATION_DRAIN_BUSY_S, now - started)
        if self.loop.alive and not self.loop.stopping:  # (a flood with no frames still gets drained)
            self.loop.call_at(self._next_drain, self.drain_notifications)

    def check_allow_list(self, *, now: bool = False) -> None:
        """(Service thread, when frames arrive.) Look at the allow-list folder at most every
        :data:`ALLOW_LIST_CHECK_S`; keys taken off it (or given another role) lose their sessions
        (:attr:`on_withdrawn`) before any frame of theirs is handled. New handshakes read the folder
        each time. An idle transceiver does not wake up for it: a connection that sends nothing
        gets nothing either."""
        at = time.monotonic()
        if (not now and at < self._allow_list_checked + ALLOW_LIST_CHECK_S) or not self.allowed.watches_directory:
            return
        self._allow_list_checked = at
        withdrawn = self.allowed.refresh()
        if withdrawn:
            self.on_withdrawn(withdrawn)

    def watch_allow_list(self, pending: Callable[[], bool]) -> None:
        """(Service thread.) While ``pending()`` holds (asks parked by receivers, say), look at the
        allow-list every :data:`ALLOW_LIST_CHECK_S` even when no frame arrives: a key taken off it
        loses what it left waiting within that time, not at the next frame of anyone. With nothing
        pending no timer runs (an idle transceiver stays asleep)."""
        if self._allow_list_timer is not None or not self.allowed.watches_directory:
            return

        def look() -> None:
            self._allow_list_timer = None
            self.check_allow_list()
            if pending():
                self.watch_allow_list(pending)

        self._allow_list_timer = self.loop.call_at(time.monotonic() + ALLOW_LIST_CHECK_S, look)

    def _take_proofs(self, notifications: dict[str, list[bytes]]) -> int:
        """Hand the proof nonces among ``notifications`` (see :data:`PROOF_PREFIX`) to
        :attr:`on_proof`, with the agent name their sender claims; how many there were."""
        taken = 0
        for agent, messages in notifications.items():
            for message in messages:
                if len(message) <= len(PROOF_PREFIX) + 32 and message.startswith(PROOF_PREFIX):
                    taken += 1
                    digits = message[len(PROOF_PREFIX) :].decode("ascii", "replace")
                    if control.PROOF_NONCE.fullmatch(digits):
                        self.on_proof(agent, digits)
        return taken

    def drop(self, reason: str, detail: str) -> None:
        """Count a dropped frame under ``dropped_<reason>`` (or ``reason`` itself) and log it."""
        key = reason if reason in self.stats else f"dropped_{reason}"
        self.stats[key] = self.stats.get(key, 0) + 1
        log.warning("transceiver %s: dropped a control frame (%s): %s", self.name, reason, detail)

    def rank_info(self, *, with_metadata: bool) -> control.RankInfo:
        """What this side tells a peer about itself."""
        return control.RankInfo(
            name=self.name,
            agent=self.agent_name,
            metadata=self.agent.get_agent_metadata() if with_metadata and self.metadata == "inline" else b"",
            layout=self.layout,
            base_address=self.pool.base_address,
            num_blocks=self.pool.num_blocks,
            memory_type=self.pool.memory_type,
            device_id=self.pool.device_id,
        )

    def log_request(self, handle: TransferHandle) -> None:
        """One structured log line per ended request, when asked for."""
        if self.log_requests:
            line = {"event": "kv_transfer", "transceiver": self.name, "state": handle.state.value, **handle.metrics.as_dict()}
            if handle.reason:
                line["reason"] = handle.reason
            log.info(json.dumps(line, sort_keys=True))


_METADATA_HEADER = b"nixlSerDes|Agent"


def _worker_of(blob: bytes) -> int | None:
    """The uuid of the UCX worker NIXL metadata describes (None if it has no readable UCX part)."""
    try:
        return _worker_of_address(dict(read_metadata(blob).connections).get("UCX", b""))
    except MetadataError:
        return None


def _worker_of_address(address: bytes) -> int | None:
    from .ucx_wire import UcxWireError, read_worker_address

    try:
        return read_worker_address(address).uuid if address else None
    except UcxWireError:
        return None


def agent_of_metadata(blob: bytes) -> str | None:
    """The agent name NIXL metadata declares (its first field), read without loading it (the whole
    blob is read strictly by :meth:`LocalSide.check_metadata` before NIXL sees it)."""
    start = len(_METADATA_HEADER)
    if not blob.startswith(_METADATA_HEADER) or len(blob) < start + 8:
        return None
    (length,) = struct.unpack_from("<Q", blob, start)
    if length > control.MAX_NAME or len(blob) < start + 8 + length:
        return None
    try:
        return blob[start + 8 : start + 8 + length].decode()
    except UnicodeDecodeError:
        return None


def remember(table: OrderedDict, key: Any, value: Any) -> None:
    """Record ``key`` in a bounded most-recent table."""
    if key in table:
        table.move_to_end(key)
    table[key] = value
    if len(table) > REMEMBERED:
        table.popitem(last=False)


def quietly(name: str, what: str, release: Any, *args: Any) -> None:
    """Give back a NIXL handle or list; one NIXL refuses (a transfer it still holds) is logged, not
    raised: teardown and bookkeeping go on, and the agent frees it with itself."""
    try:
        release(*args)
    except Exception as exc:
        log.debug("transceiver %s: releasing %s failed: %s", name, what, exc)


_NOBLOCK = int(zmq.NOBLOCK)


def recv_parts(socket: Any) -> list[Any]:
    """The next message's parts as ``zmq.Frame`` objects, without blocking (``zmq.Again`` if none):
    ``recv_multipart`` at half its price (it asks ``RCVMORE`` through pyzmq's enums per part). The
    parts of one message arrive together, so reading the rest never waits."""
    parts = [socket.recv(_NOBLOCK, copy=False)]
    while parts[-1].more:
        parts.append(socket.recv(_NOBLOCK, copy=False))
    return parts
