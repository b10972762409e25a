"""Reads: receivers that take announced offers with a NIXL READ instead of asking for a write.

A write puts two control messages on a request's critical path (the ask and the result), each a
wake-up chain of four threads in two processes. A sender opened with ``allow_reads`` *announces*
each offer to the receivers it names instead (``offer``: blocks and deadline, at ``send()``) and
puts its NIXL metadata in its welcome. A receive whose senders all announced the request reads the
blocks (any TP/PP split) and tells each sender afterwards (``release``): nothing crosses the network
between ``receive()`` and its completion.

Every announcement gets exactly one release: ``ok`` (read), ``declined`` (nothing read and nothing
will be: the receive asked for a write instead, or the announcement expired, was withdrawn, was
superseded or was over budget), ``cancelled`` (the receive was cancelled or timed out and its read
ended or was aborted) or ``error`` (the read failed). The sender keeps the blocks until then (its
handle may end first, with ``released`` False), or until the receiver disconnects.

Trust: a receiver that loaded a sender's metadata can read (and write) all of that sender's
registered pool, not only the blocks announced to it, as a sender that loaded a receiver's
metadata can already write (and read) all of the receiver's pool. Reads are therefore off unless
the sender allows them, and only receivers whose key is on the sender's allow-list ever get its
metadata.

The sender side is :func:`announce` and :func:`on_release`; the receiver side is :class:`Reads`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from . import control
from .addresses import agent_carries_key
from .local import LocalSide, agent_of_metadata
from .mapping import block_segments, plan_descriptors
from .peers import Remote, Remotes, release_remote
from .request import next_nonce
from .writes import WritePoster, transfer_error, whole_block_plan

if TYPE_CHECKING:
    from .connections import Connections, Peer
    from .offer import Offer

log = logging.getLogger("kvpolicy.transports")

_BLOCKS_PER_PEER = 64
"""Block ids held in announcements not taken yet, per sender, in pools' worth of this side's pool."""


# -- sender side ------------------------------------------------------------------------------------


class Sender(Protocol):
    """What announcing reads needs of a sender (:class:`kvpolicy.transports.sender.Sender`)."""

    local: LocalSide
    offers: dict[str, Offer]
    fenced: dict[tuple[str, int], Offer]
    remotes: Remotes

    def settle(self, offer: Offer) -> None: ...

    def writer_ended(self, offer: Offer, *, ok: bool, reason: str) -> None: ...


def announce(sender: Sender, offer: Offer, asked: set[bytes]) -> None:
    """Announce ``offer`` to every connected receiver it names whose layout is this side's, but
    those (``asked``: their connections) whose ask waits for it already."""
    handle = offer.handle
    offer.token = next_nonce()
    message = control.Offer(handle.request_id, offer.token, handle.block_ids, handle.remaining_ms())
    for remote in sender.remotes.remotes.values():
        if offer.for_key(remote.key) and len(remote.segments.runs) and remote.identity not in asked:
            offer.announced[remote.identity] = remote
            sender.remotes.reply(remote, message)


def on_release(sender: Sender, remote: Remote, release: control.Release) -> None:
    """A receiver's one answer to an offer announced to it."""
    offer = sender.offers.get(release.request_id)
    if offer is None or offer.token != release.token:
        offer = sender.fenced.get((release.request_id, release.token))
    if offer is None or offer.announced.get(remote.identity) is not remote:
        sender.local.drop("unknown_request", f"release of {release.request_id!r}, not announced to this peer")
        return
    del offer.announced[remote.identity]
    if offer.handle.done:  # ended meanwhile: its blocks waited for this release
        unfence(sender, offer)
    elif release.status == "error":
        sender.writer_ended(offer, ok=False, reason=f"the receiver's read failed: {release.reason}")
    elif release.status == "declined" or remote.key in offer.served_by:
        sender.settle(offer)
    elif release.status == "cancelled":
        offer.served_by.add(remote.key)
        offer.cancelled += 1
        sender.settle(offer)
    else:
        offer.served_by.add(remote.key)
        metrics = offer.handle.metrics
        metrics.nbytes += release.nbytes
        metrics.transfer_s = max(metrics.transfer_s, release.transfer_us / 1e6)
        sender.writer_ended(offer, ok=True, reason="")


def withdraw(sender: Sender, offer: Offer) -> None:
    """Withdraw the announcements of ``offer`` (once): a receiver declines one it has not taken."""
    if offer.announced and not offer.withdrawn:
        offer.withdrawn = True
        for remote in offer.announced.values():
            sender.remotes.reply(remote, control.Cancel(offer.handle.request_id, offer.token))


def fence(sender: Sender, offer: Offer) -> bool:
    """An offer ends while receivers may still read it: keep its blocks until they release them,
    and withdraw the announcements not taken yet. False if nothing is pending (release now)."""
    if not offer.announced:
        return False
    sender.fenced[(offer.handle.request_id, offer.token)] = offer
    withdraw(sender, offer)
    grace = sender.local.limits.release_grace_s
    sender.local.loop.call_at(time.monotonic() + grace, lambda: _release_expired(sender, offer))
    return True


def _release_expired(sender: Sender, offer: Offer) -> None:
    """A receiver owed a release for ``release_grace_s`` after the offer ended (it never answered,
    or its socket closed): the blocks come back to the sender, and the count says so."""
    if sender.fenced.get((offer.handle.request_id, offer.token)) is not offer:
        return
    owing = sorted(remote.key_name for remote in offer.announced.values())
    sender.local.stats["releases_expired"] += len(owing)
    log.warning(
        "transceiver %s: no release of %r from %s within %.1f s of its end; its blocks are taken back",
        sender.local.name,
        offer.handle.request_id,
        owing,
        sender.local.limits.release_grace_s,
    )
    offer.announced.clear()
    unfence(sender, offer)


def unfence(sender: Sender, offer: Offer) -> None:
    if not offer.announced and sender.fenced.pop((offer.handle.request_id, offer.token), None) is offer:
        offer.handle._release()


def forget_all(sender: Sender) -> None:
    """The loop has stopped: no receiver can read or release any more; release every fence."""
    for offer in sender.offers.values():
        offer.announced.clear()
    for offer in sender.fenced.values():
        offer.handle._release()
    sender.fenced.clear()


def remote_gone(sender: Sender, remote: Remote) -> None:
    """A receiver was forgotten: it owes no release any more."""
    for offer in [o for o in [*sender.offers.values(), *sender.fenced.values()] if remote.identity in o.announced]:
        del offer.announced[remote.identity]
        if offer.handle.done:
            unfence(sender, offer)
        else:
            sender.settle(offer)


# -- receiver side ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Announced:  # an offer announced to this side, not taken yet
    offer: control.Offer
    peer: str
    deadline: float = 0.0
    """When the offer ends, on this side's monotonic clock (its ``timeout_ms`` from when it arrived)."""
    timer: Any = None


@dataclass(slots=True)
class Read:  # one NIXL READ in flight
    receive: Any
    peer: str
    source: Remote
    offer: control.Offer
    xfer: Any
    nbytes: int
    descriptors_before: int
    descriptors: int
    posted: float


class Reads:
    """Receiver side: the senders this side may read from, their announcements, READs in flight.
    Every method runs on the service thread, under the receiver's lock (callers test :attr:`offers`)."""

    def __init__(self, local: LocalSide, connections: Connections, lock: Any) -> None:
        self.local = local
        self.connections = connections
        self.lock = lock
        """The receiver's lock (its timers take it too)."""
        self.offers: dict[str, dict[str, Announced]] = {}
        """Announcements not taken yet: request id -> sender name -> announcement."""
        self._per_peer: Counter[str] = Counter()
        self._probing: dict[str, bool] = {}
        """Senders whose welcome's metadata is being probed (their reads wait for it)."""
        self._deadlines: dict[tuple[str, int], float] = {}
        """Deadlines of offers taken by a receive and about to be read (this side's clock)."""
        self._blocks_per_peer: Counter[str] = Counter()
        self.sources: dict[str, Remote] = {}
        """Senders whose metadata this side loaded (from their welcome), by name."""
        self.inflight: list[Read] = []
        self.done = 0
        """READs that completed (receives served by reads)."""
        self._post = WritePoster(local, "READ")

    def busy(self) -> bool:
        return bool(self.inflight)

    def add_source(self, peer: Peer, key: bytes, rank: control.RankInfo, ready: Callable[[], None] = lambda: None) -> None:
        """A sender's welcome: load its metadata if it carries any (it allows reads) and its layout
        is this side's; otherwise every announcement of it is declined (it writes instead). ``ready``
        is called once that is settled (after a probe of metadata not loaded before)."""
        try:
            self._add_source(peer, key, rank, ready)
        finally:
            if not self._probing.get(peer.name):
                ready()

    def _add_source(self, peer: Peer, key: bytes, rank: control.RankInfo, ready: Callable[[], None]) -> None:
        if not rank.metadata:
            return
        problem, segments = "", block_segments(rank.layout, self.local.layout)
        if not self.local.plaintext and not agent_carries_key(rank.agent, key):
            problem = f"its agent name {rank.agent!r} does not carry its key's fingerprint"
        elif agent_of_metadata(rank.metadata) != rank.agent:
            problem = "its NIXL metadata names another agent"
        elif (malformed := self.local.check_metadata(rank, rank.metadata)) is not None:
            problem = malformed
        elif not len(segments.runs):
            problem = "it holds none of this side's layers and heads"
        elif not self.local.agent_loaded(rank.metadata) and not self.local.probe.cached(rank.metadata)[0]:
            # Not loaded before: loaded first in a probe child (NIXL's parser is not hardened); until
            # it answers, this sender's announcements are declined and receives ask for writes.
            def done(verdict: str | None) -> None:
                try:
                    self.local.loop.submit(lambda: self._probed(peer, key, rank, verdict, ready))
                except RuntimeError:
                    pass  # closed meanwhile

            self._probing[peer.name] = True
            self.local.probe.start(rank.metadata, done)
            return
        else:
            verdict = self.local.probe.cached(rank.metadata)[1]
            if verdict is not None:
                problem = f"its NIXL metadata failed the probe: {verdict}"
                self._log_refused(peer, problem)
                return
            try:
                loaded = self.local.load_agent(rank.metadata)
            except Exception as exc:
                loaded, problem = "", f"NIXL rejected its metadata: {exc}"
            if loaded and loaded != rank.agent:
                self.local.unload_agent(loaded)
                problem = f"NIXL loaded agent {loaded!r}, not {rank.agent!r}"
            elif loaded:
                self.local.bind_worker(loaded)  # (a sender this side authenticated and connected to)
        if problem:
            self._log_refused(peer, problem)
            return
        self.sources[peer.name] = Remote(b"", key, peer.key_name, rank, segments)
        try:
            self.local.agent.make_connection(rank.agent)  # now, not inside the first read
        except Exception as exc:
            log.debug("transceiver %s: early connection to %s failed: %s", self.local.name, peer.name, exc)

    def _log_refused(self, peer: Peer, problem: str) -> None:
        log.warning("transceiver %s: will not read from sender %s: %s", self.local.name, peer.name, problem)

    def _probed(self, peer: Peer, key: bytes, rank: control.RankInfo, verdict: str | None, ready: Callable[[], None]) -> None:
        """(Service thread.) The probe of a sender's metadata answered: go on if the same sender is
        still connected."""
        with self.lock:
            self._probing.pop(peer.name, None)
            conn = self.connections.connection_of(peer.name)
            if conn is None or conn.key != key or conn.peer is not peer:
                return
            if verdict is not None:
                self._log_refused(peer, f"its NIXL metadata failed the probe: {verdict}")
                ready()
                return
            self.add_source(peer, key, rank, ready)

    def on_offer(self, peer: Peer, offer: control.Offer) -> None:
        """An announcement: keep it (bounded, until its deadline) for a receive to take."""
        source = self.sources.get(peer.name)
        # Counted from now on this side's clock (the two hosts' clocks are never compared); the frame's
        # transit makes it end a little later here than at the sender, whose blocks then stay fenced
        # until this side's release or the sender's own grace after its deadline (see the README).
        remaining = offer.timeout_ms / 1000.0
        problem = ""
        if source is None:
            problem = "this receiver does not read from this sender"
        elif len(offer.blocks) > self.local.pool.num_blocks or (offer.blocks and max(offer.blocks) >= source.rank.num_blocks):
            self.local.drop("malformed", f"offer of {offer.request_id!r} from {peer.name}: more blocks than this pool, or beyond the sender's")
            problem = "more blocks than the receiver's pool holds, or block ids beyond the sender's pool"
        elif remaining <= 0:
            problem = "its deadline passed before the receiver read it"
        elif (
            self._per_peer[peer.name] >= self.local.limits.offers_per_peer
            or self._blocks_per_peer[peer.name] + len(offer.blocks) > _BLOCKS_PER_PEER * self.local.pool.num_blocks
        ):
            self.local.stats["dropped_over_budget"] += 1
            problem = "too many offers (or blocks) from this sender waiting to be taken"
        if problem:
            self.release(peer.name, offer, "declined", problem)
            return
        waiting = self.offers.setdefault(offer.request_id, {})
        old = waiting.get(peer.name)
        if old is not None:
            self._forget(old)
            self.release(peer.name, old.offer, "declined", "superseded by a newer offer of the same request")
            waiting = self.offers.setdefault(offer.request_id, {})
        announced = waiting[peer.name] = Announced(offer, peer.name, time.monotonic() + remaining)
        self._per_peer[peer.name] += 1
        self._blocks_per_peer[peer.name] += len(offer.blocks)
        expiry = time.monotonic() + min(remaining, self.local.limits.park_s)
        announced.timer = self.local.loop.call_at(expiry, lambda: self._expired(announced))

    def _forget(self, announced: Announced) -> None:
        waiting = self.offers.get(announced.offer.request_id, {})
        if waiting.get(announced.peer) is announced:
            del waiting[announced.peer]
            if not waiting:
                del self.offers[announced.offer.request_id]
            self._per_peer[announced.peer] -= 1
            self._blocks_per_peer[announced.peer] -= len(announced.offer.blocks)
            if self._per_peer[announced.peer] <= 0:
                del self._per_peer[announced.peer], self._blocks_per_peer[announced.peer]
        if announced.timer is not None:
            announced.timer.cancel()

    def _expired(self, announced: Announced) -> None:
        with self.lock:
            announced.timer = None
            if self.offers.get(announced.offer.request_id, {}).get(announced.peer) is announced:
                self._forget(announced)
                self.release(announced.peer, announced.offer, "declined", "no receive took it in time")

    def withdraw(self, peer: Peer, cancel: control.Cancel) -> None:
        """The sender withdrew an announcement (its offer ended): decline it if not taken."""
        announced = self.offers.get(cancel.request_id, {}).get(peer.name)
        if announced is not None and announced.offer.token == cancel.nonce:
            self._forget(announced)
            self.release(peer.name, announced.offer, "declined", "withdrawn by the sender")
        else:
            self.local.stats["late_frames"] += 1  # taken already: its read's release follows

    def take(self, request_id: str, peers: list[str], blocks: int) -> dict[str, control.Offer] | None:
        """The announcements of ``request_id`` by every one of ``peers`` (taken: no timer declines
        them any more), if each holds ``blocks`` blocks; None otherwise (the receive asks for writes)."""
        waiting = self.offers.get(request_id)
        if not waiting or any(p not in waiting or len(waiting[p].offer.blocks) != blocks for p in peers):
            return None
        taken = {}
        for peer in peers:
            announced = waiting[peer]
            self._forget(announced)
            taken[peer] = announced.offer
            self._deadlines[(peer, announced.offer.token)] = announced.deadline
        return taken

    def decline_all(self, request_id: str, send: Any) -> None:
        """The receive of ``request_id`` asks for writes: decline its announcements (before the ask)."""
        for announced in list(self.offers.get(request_id, {}).values()):
            self._forget(announced)
            send(announced.peer, self._release(announced.offer, "declined", "the receiver asked for a write"))

    def start(self, receive: Any, peer: str, offer: control.Offer) -> str | None:
        """Post the READ of ``offer`` into ``receive``'s blocks: "" if posted, None if there was
        nothing to read, or why it could not start (nothing was read)."""
        deadline = self._deadlines.pop((peer, offer.token), 0.0)
        source = self.sources.get(peer)
        if source is None or source.gone:
            return "the sender is no longer connected"
        if deadline <= time.monotonic():
            return "the sender's offer expired before the read started"
        handle = receive.handle
        remote_blocks = offer.blocks[receive.skip_blocks :]
        if not remote_blocks:
            self.release(peer, offer, "ok")
            return None
        pool = self.local.pool
        whole = source.whole_blocks and source.rank.layout.block_bytes == pool.block_bytes  # (one block, block to block)
        posted = time.perf_counter()  # (a READ over CMA may be done when transfer() returns)
        try:
            plan = (
                whole_block_plan(source, remote_blocks, handle.block_ids)
                if whole
                else plan_descriptors(
                    source.segments,
                    remote_blocks,
                    handle.block_ids,
                    src_base=source.rank.base_address,
                    src_block_bytes=source.rank.layout.block_bytes,
                    dst_base=pool.base_address,
                    dst_block_bytes=pool.block_bytes,
                )
            )
            xfer = self._post.whole_blocks(source, handle.block_ids, remote_blocks) if whole else self._post.runs(source, plan)
            status = self.local.agent.transfer(xfer)
        except Exception as exc:
            return f"NIXL: {exc}"
        if status == "ERR":
            self._post.finished(xfer, ok=False)
            return "NIXL reported an error posting the read"
        source.writes += 1
        self.inflight.append(Read(receive, peer, source, offer, xfer, plan.nbytes, plan.descriptors_before, plan.descriptors, posted))
        return ""

    def progress(self) -> list[tuple[Read, bool, str]]:
        """Poll NIXL for the READs in flight: the finished ones, each released to its sender."""
        finished = []
        for read in list(self.inflight):
            error = transfer_error(self.local.agent, read.xfer, "read")
            if error is None:
                continue
            self._ended(read, "error" if error else "ok", error)
            self._post.finished(read.xfer, ok=not error)
            finished.append((read, not error, error))
        return finished

    def abort(self, receive: Any) -> set[str]:
        """Stop ``receive``'s READs; the senders whose READ is confirmed stopped (the rest end when
        NIXL reports them)."""
        stopped = set()
        for read in [r for r in self.inflight if r.receive is receive]:
            if not self._post.abort(read.xfer):
                continue
            self._ended(read, "cancelled", "the receive ended before the read did")
            stopped.add(read.peer)
        return stopped

    def reading(self, handle: Any, peer: str) -> bool:
        """Whether a READ from ``peer`` into ``handle``'s blocks is in flight."""
        return any(r.receive.handle is handle and r.peer == peer for r in self.inflight)

    def _ended(self, read: Read, status: str, reason: str) -> None:
        self.inflight.remove(read)
        self.done += status == "ok"
        transfer_us = int((time.perf_counter() - read.posted) * 1e6)
        self.release(read.peer, read.offer, status, reason, read.nbytes if status == "ok" else 0, transfer_us)
        source = read.source
        source.writes -= 1
        if source.gone and not source.writes:
            if self.sources.get(read.peer) is source:
                del self.sources[read.peer]
            release_remote(self.local, source)

    def peer_gone(self, name: str) -> None:
        """The connection to sender ``name`` is gone: its announcements go (no release can reach
        it); its metadata goes once no READ of it is in flight."""
        for waiting in list(self.offers.values()):
            if name in waiting:
                self._forget(waiting[name])
        source = self.sources.get(name)
        if source is not None:
            source.gone = True
            if not source.writes:
                del self.sources[name]
                release_remote(self.local, source)

    def _release(self, offer: control.Offer, status: str, reason: str = "", nbytes: int = 0, transfer_us: int = 0) -> control.Release:
        return control.Release(offer.request_id, offer.token, status, reason[: control.MAX_REASON], nbytes, transfer_us)

    def release(self, peer: str, offer: control.Offer, status: str, reason: str = "", nbytes: int = 0, transfer_us: int = 0) -> None:
        """(Service thread.) Queue the release of ``offer`` to its sender."""
        self.connections.send_to(peer, self._release(offer, status, reason, nbytes, transfer_us))

    def close(self) -> None:
        """Release every source's NIXL state and the local prepared list (after the loop stopped)."""
        for source in self.sources.values():
            release_remote(self.local, source)
        self.sources.clear()
        self._post.close()
