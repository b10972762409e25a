"""Receiver side: receives, their writers' results, and the fence over blocks of ended attempts.

Each ``receive`` is one attempt with a fresh nonce and an absolute deadline, sent to every writer.
A result counts only for the attempt it names. Blocks handed to a receive stay *reserved* until
every writer said its write is over (any result frame: ``ok``, ``error``, ``cancelled``,
``aborted``) or its connection was torn down (``disconnect``). When the deadline passes first, the
handle ends ``TIMED_OUT`` at once but its blocks stay fenced (``handle.released`` is False): a new
receive into them is refused, so a late write can never land in memory given to a later request.

A receive made while no other is open sends its request from the caller's thread
(:meth:`Receiver.begin`); otherwise the service thread sends it, batched with the others. A receive
whose senders all announced the request reads it instead (:mod:`.reads`): the service thread posts
the READs, their end stands for the writers' results, and its fence waits for them. Either way
the attempt is recorded (and its writers marked pending) under :attr:`Receiver.state` before its
frame can be read by anyone, and every handler of a frame, timer or cancel takes that lock too.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import control
from .connections import Connections
from .local import LocalSide, remember
from .reads import Read, Reads
from .request import RequestState, TransferHandle, next_nonce

log = logging.getLogger("kvpolicy.transports")


def _locked(method: Callable) -> Callable:
    """Run a service-thread handler under :attr:`Receiver.state` (a caller may be starting a receive)."""

    @functools.wraps(method)
    def run(self: Receiver, *args: Any, **kwargs: Any) -> Any:
        with self.state:
            return method(self, *args, **kwargs)

    return run


@dataclass(slots=True)
class Receive:
    """One attempt waiting for its writers' result frames."""

    handle: TransferHandle
    peers: list[str]
    skip_blocks: int
    nonce: int = field(default_factory=next_nonce)
    pending: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    cancelled: bool = False
    timer: Any = None
    reads: bool = False
    """Read from its senders (their announcements), not written by them."""


@dataclass(slots=True)
class Fence:
    """An attempt that ended while writers had not confirmed: its blocks stay reserved."""

    handle: TransferHandle
    pending: set[str]


class Receiver:
    """Receives of one transceiver; runs on the service thread, except :meth:`reserve`."""

    def __init__(self, local: LocalSide, connections: Connections) -> None:
        self.local = local
        self.connections = connections
        self.receives: dict[str, Receive] = {}
        self.fences: dict[tuple[str, int], Fence] = {}
        self.ended: OrderedDict[str, RequestState] = OrderedDict()
        self.quarantined: dict[tuple[str, str], set[tuple[str, int]]] = {}
        """Fences of senders whose connection was torn down while they might still write, by
        (sender name, NIXL agent): see :meth:`on_peer_gone`."""
        self._agents: dict[str, str] = {}
        """Each sender's NIXL agent, from its last welcome."""
        self.lock = threading.Lock()
        self.reserved: set[int] = set()
        """Blocks of open or fenced receives (callers read it under :attr:`lock`)."""
        self.state = threading.RLock()
        """Held for every change of :attr:`receives` and :attr:`fences` (a caller may start one)."""
        self.reads = Reads(local, connections, self.state)
        self.closed = False
        self.direct = 0
        """Requests sent from a caller's thread (the rest went through the service thread)."""

    def reserve(self, blocks: Iterable[int]) -> None:
        """Reserve blocks for a new receive (caller's thread); refused if any is held already."""
        with self.lock:
            if not self.reserved.isdisjoint(blocks):
                busy = sorted(self.reserved.intersection(blocks))
                raise ValueError(
                    f"blocks {busy[:8]} are still held by another receive (open, or ended while a sender may "
                    "still write them); wait for that handle's `released`, or use other blocks"
                )
            self.reserved.update(blocks)

    def _unreserve(self, handle: TransferHandle) -> None:
        with self.lock:
            self.reserved.difference_update(handle.block_ids)
        handle._release()

    def begin(self, receive: Receive) -> None:
        """(Caller's thread.) Start a receive: with no other open, send its request from here;
        otherwise hand it to the service thread, which batches the requests ready together."""
        loop = self.local.loop
        with self.state:
            if self.closed or not loop.alive:
                self._unreserve(receive.handle)
                raise RuntimeError(f"transceiver {self.local.name} is closed")
            if self.receives or receive.handle.request_id in self.reads.offers:  # (reads are posted there)
                try:
                    loop.post(lambda: self.start(receive))
                except RuntimeError:
                    self._unreserve(receive.handle)
                    raise
                return
            self.receives[receive.handle.request_id] = receive
            request = self._request(receive)
            for name in receive.peers:
                sent = self.connections.send_now(name, request)
                if sent == "sent":
                    receive.pending.add(name)  # its result waits for this lock, so it finds this
                elif sent == "gone":
                    receive.errors.append(f"sender {name!r} is no longer connected")
                else:
                    receive.errors.append(f"sender {name!r} could not be reached (its send queue is full)")
            self.direct += 1
            receive.handle._state = RequestState.WAITING
            # The deadline is armed after the frame left (its result waits for this lock, so nothing
            # can end the receive first); the loop is woken for it only if it sleeps past it.
            receive.timer, wake = loop.call_at_from_caller(receive.handle.deadline, lambda: self._expired(receive))
            self._settle(receive)
        if wake and not receive.handle.done:
            try:
                loop.wake()
            except RuntimeError:
                pass  # the loop stopped meanwhile: its exit failed this receive

    def _request(self, receive: Receive) -> control.Request:
        handle = receive.handle
        return control.Request(handle.request_id, receive.nonce, handle.block_ids, receive.skip_blocks, handle.remaining_ms())

    def start(self, receive: Receive) -> None:
        """(Service thread.) Queue the attempt's request to every writer (sent batched)."""
        with self.state:
            handle = receive.handle
            if handle.done:  # cancelled before the service thread got to it
                self._unreserve(handle)
                return
            self.receives[handle.request_id] = receive
            if self.reads.offers and self._start_reads(receive):
                return
            self.reads.decline_all(handle.request_id, self.connections.send_to)  # (sent before the ask)
            request = self._request(receive)
            for name in receive.peers:
                if self.connections.send_to(name, request):
                    receive.pending.add(name)
                else:
                    receive.errors.append(f"sender {name!r} is no longer connected")
            handle._state = RequestState.WAITING
            receive.timer = self.local.loop.call_at(handle.deadline, lambda: self._expired(receive))
            self._settle(receive)

    def on_reconnected(self, name: str) -> None:
        """(Service thread.) ZeroMQ reconnected to sender ``name`` after a reset: ask again for every
        receive still waiting on it (an ask, or its result, may have gone down with the old TCP
        connection); the sender answers a repeated ask once (it repeats a result it sent, and ignores
        an ask it is serving)."""
        with self.state:
            again = [receive for receive in self.receives.values() if name in receive.pending and not receive.reads and not receive.handle.done]
            for receive in again:
                self.connections.send_to(name, self._request(receive))

    def _start_reads(self, receive: Receive) -> bool:
        """Read the request if every sender announced it; False if not (the receive asks instead)."""
        handle = receive.handle
        offers = self.reads.take(handle.request_id, receive.peers, len(handle.block_ids) + receive.skip_blocks)
        if offers is None:
            return False
        receive.reads = True
        for name, offer in offers.items():
            problem = self.reads.start(receive, name, offer)
            if problem:
                receive.errors.append(f"sender {name!r}: {problem}")
                self.reads.release(name, offer, "declined", problem)
            elif problem is not None:
                receive.pending.add(name)
        handle._state = RequestState.TRANSFERRING if receive.pending else RequestState.WAITING
        receive.timer = self.local.loop.call_at(handle.deadline, lambda: self._expired(receive))
        self._settle(receive)
        return True

    def progress_reads(self) -> bool:
        """(Service thread.) Poll the READs in flight; True if any ended."""
        if not self.reads.inflight:
            return False
        with self.state:
            ended = self.reads.progress()
            for read, ok, reason in ended:
                self._read_ended(read, ok, reason)
        return bool(ended)

    def _read_ended(self, read: Read, ok: bool, reason: str) -> None:
        receive: Receive = read.receive  # (typed Any in .reads, which cannot import this module)
        name = read.peer
        request_id = receive.handle.request_id
        if self.receives.get(request_id) is not receive or name not in receive.pending:
            fence = self.fences.get((request_id, receive.nonce))
            if fence is not None and name in fence.pending:
                self._unfence(request_id, receive.nonce, name)
            return
        receive.pending.discard(name)
        metrics = receive.handle.metrics
        metrics.writers += 1
        metrics.nbytes += read.nbytes if ok else 0
        metrics.descriptors_before += read.descriptors_before
        metrics.descriptors += read.descriptors
        metrics.transfer_s = max(metrics.transfer_s, time.perf_counter() - read.posted)
        if not ok:
            receive.errors.append(f"{name}: {reason}")
        self._settle(receive)

    def on_result(self, peer: Any, result: control.Result) -> None:
        """A sender's result frame (authenticated, schema-checked)."""
        with self.state:  # (not @_locked: this is the per-request path, and a wrapper costs a call)
            self._on_result(peer.name, result)

    def _on_result(self, name: str, result: control.Result) -> None:
        receive = self.receives.get(result.request_id)
        if receive is None or receive.nonce != result.nonce or name not in receive.pending:
            fence = self.fences.get((result.request_id, result.nonce))
            if fence is not None and name in fence.pending:
                self.local.stats["late_frames"] += 1
                self._unfence(result.request_id, result.nonce, name)
            elif receive is not None and name in receive.pending:
                self.local.drop("stale_attempt", f"result of another attempt of {result.request_id!r} from {name}")
            elif result.request_id in self.ended:
                self.local.stats["late_frames"] += 1
            else:
                self.local.drop("unknown_request", f"result for {result.request_id!r} from {name}")
            return
        receive.pending.discard(name)
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
                receive.errors.append(f"{name}: {result.reason}")
        elif result.status in ("error", "aborted"):
            receive.errors.append(f"{name}: {result.status}: {result.reason}")
            self._send_cancel(receive)  # our blocks are unusable anyway: ask the others to stop early
        self._settle(receive)

    def _send_cancel(self, receive: Receive, *, final: bool = False) -> None:
        """Stop the attempt's writers (or abort its READs). ``final``: the caller gives the request
        up, so a sender need not wait for this receiver; otherwise only this attempt ends and a retry
        of the request id may still ask."""
        if receive.reads:  # abort the READs; the release of each tells its sender, once it ended
            receive.pending.difference_update(self.reads.abort(receive))
            return
        cancel = control.Cancel(receive.handle.request_id, receive.nonce, int(final))
        for name in receive.pending:
            self.connections.send_to(name, cancel)

    def _settle(self, receive: Receive) -> None:
        if receive.pending:
            return
        if receive.errors and not receive.cancelled:
            self._end(receive, RequestState.FAILED, "; ".join(receive.errors))
        elif receive.cancelled or receive.handle.state is RequestState.CANCELLING:
            self._end(receive, RequestState.CANCELLED, "; ".join(receive.errors) or "cancelled")
        else:
            self._end(receive, RequestState.COMPLETED)

    def _end(self, receive: Receive, state: RequestState, reason: str = "") -> None:
        handle = receive.handle
        if self.receives.get(handle.request_id) is receive:
            del self.receives[handle.request_id]
        if receive.pending:
            self.fences[(handle.request_id, receive.nonce)] = Fence(handle, set(receive.pending))
        else:
            self._unreserve(handle)
        self.local.handle_ended(handle)
        # Done last: a caller who sees it may at once reuse the request id and, once released, the blocks.
        handle._finish(state, reason)
        if receive.timer is not None:
            receive.timer.cancel()
        remember(self.ended, handle.request_id, state)
        if self.local.log_requests:
            self.local.log_request(handle)

    def _unfence(self, request_id: str, nonce: int, name: str) -> None:
        fence = self.fences[(request_id, nonce)]
        fence.pending.discard(name)
        if not fence.pending:
            del self.fences[(request_id, nonce)]
            self._unreserve(fence.handle)

    @_locked
    def _expired(self, receive: Receive) -> None:
        receive.timer = None
        if receive.handle.done:
            return
        self._send_cancel(receive)
        missing = sorted(receive.pending)
        if receive.handle.state is RequestState.CANCELLING:
            self._end(receive, RequestState.CANCELLED, f"cancelled; no confirmation from {missing} in time")
        elif receive.reads:
            self._end(receive, RequestState.TIMED_OUT, f"the read did not end in time ({f'still in flight from {missing}' if missing else 'aborted'})")
        else:
            self._end(receive, RequestState.TIMED_OUT, f"no result frame from {missing} in time")

    @_locked
    def cancel(self, request_id: str) -> bool:
        """Cancel a receive; True if it ended now (nothing was pending)."""
        receive = self.receives.get(request_id)
        if receive is None:
            return False
        handle = receive.handle
        if handle.done or handle.state is RequestState.CANCELLING:
            return False
        if not receive.pending:
            self._end(receive, RequestState.CANCELLED, "cancelled by the receiver")
            return True
        handle._state = RequestState.CANCELLING
        self._send_cancel(receive, final=True)
        if not receive.pending:  # (reads stopped at once)
            self._settle(receive)
        return not receive.pending

    @_locked
    def on_unsent(self, name: str, messages: list[control.Message]) -> None:
        """Requests that could not be handed to ``name``'s socket (its queue is full): no write of
        them can come, so those attempts stop waiting for it (and fence nothing for it)."""
        for message in messages:
            if not isinstance(message, control.Request):
                continue
            receive = self.receives.get(message.request_id)
            if receive is not None and receive.nonce == message.nonce and name in receive.pending:
                receive.pending.discard(name)
                receive.errors.append(f"sender {name!r} could not be reached (its send queue is full)")
                self._settle(receive)

    @_locked
    def on_peer_gone(self, name: str, dead: bool = False) -> None:
        """The connection to ``name`` was torn down. Its waiting receives fail now. Blocks it may
        still write are *quarantined*, not released: a sender that is cut off but alive can write
        when the link comes back, whatever its clock says. They are released by its results, by a
        welcome from the same sender process (it welcomes only once no earlier write of its own to
        this side is in flight), or at once if ``dead`` (the caller knows the process is gone).
        A READ of it in flight ends here, when NIXL reports it."""
        reading = self.reads.reading
        agent = self._agents.get(name, "")
        for receive in list(self.receives.values()):
            if name not in receive.pending or reading(receive.handle, name):
                continue
            receive.errors.append(f"sender {name!r} was disconnected")
            if dead:
                receive.pending.discard(name)
                self._settle(receive)
            else:
                self._send_cancel(receive)  # (the others stop early; this one fences what it holds)
                self._end(receive, RequestState.FAILED, "; ".join(receive.errors))
        newly = 0
        for fence_key in [k for k, f in self.fences.items() if name in f.pending and not reading(f.handle, name)]:
            if dead:
                self._unfence(*fence_key, name)
            else:
                held = self.quarantined.setdefault((name, agent), set())
                if fence_key not in held:
                    held.add(fence_key)
                    newly += len(self.fences[fence_key].handle.block_ids)
        if newly:
            # The operator's signal: who holds what, and the one call that releases it.
            self.local.stats["quarantined_blocks"] += newly
            log.warning(
                "transceiver %s: sender %r (agent %s) was disconnected with writes in flight: %d blocks stay "
                "quarantined (%d in all under that name) until its results come, its process welcomes this "
                "side again, or disconnect(%r, dead=True) once it is known to be gone",
                self.local.name,
                name,
                agent or "?",
                newly,
                self.quarantined_blocks(name),
                name,
            )
        if dead:  # and what earlier processes under this name left
            for agent_of_old in [a for n, a in self.quarantined if n == name]:
                self._lift_quarantine(name, agent_of_old)
        self.reads.peer_gone(name)

    def quarantined_blocks(self, name: str | None = None) -> int:
        """Blocks held in quarantine for sender ``name`` (every process of that name), or for all."""
        total = 0
        for (sender, _agent), fence_keys in self.quarantined.items():
            if name is None or sender == name:
                total += sum(len(self.fences[k].handle.block_ids) for k in fence_keys if k in self.fences)
        return total

    def quarantined_over_bound(self, names: Iterable[str]) -> dict[str, int]:
        """(Caller's thread.) Blocks each of ``names`` keeps quarantined beyond
        ``Limits.quarantined_per_peer``, read under :attr:`state` (the service thread changes it)."""
        bound = self.local.limits.quarantined_per_peer
        with self.state:
            held = {name: self.quarantined_blocks(name) for name in names}
        return {name: blocks for name, blocks in held.items() if blocks > bound}

    def quarantine_by_sender(self) -> dict[str, int]:
        """Sender name -> blocks it keeps quarantined (what an operator may release)."""
        names = {sender for sender, _agent in self.quarantined}
        return {name: blocks for name in sorted(names) if (blocks := self.quarantined_blocks(name))}

    def _lift_quarantine(self, name: str, agent: str) -> None:
        """The same sender process welcomed this side again: none of its earlier writes is in flight."""
        for fence_key in self.quarantined.pop((name, agent), ()):
            fence = self.fences.get(fence_key)
            if fence is not None and name in fence.pending:
                self._unfence(*fence_key, name)

    @_locked
    def on_offer(self, peer: Any, offer: control.Offer) -> None:
        """A sender announced an offer (:mod:`.reads`); one for a receive already asking is declined."""
        if offer.request_id in self.receives:
            self.reads.release(peer.name, offer, "declined", "the receiver had asked for a write already")
        else:
            self.reads.on_offer(peer, offer)

    @_locked
    def on_withdraw(self, peer: Any, cancel: control.Cancel) -> None:
        """A sender withdrew an announcement."""
        self.reads.withdraw(peer, cancel)

    @_locked
    def on_welcome(self, peer: Any, key: bytes, rank: control.RankInfo, ready: Callable[[], None]) -> None:
        """A sender welcomed this side: lift what its process left quarantined; read from it if it
        allows reads (``ready`` is called once that is settled: its metadata may be probed first)."""
        self._agents[peer.name] = rank.agent
        self._lift_quarantine(peer.name, rank.agent)
        self.reads.add_source(peer, key, rank, ready)

    @_locked
    def begin_close(self) -> None:
        """Fail every open receive."""
        self.closed = True
        for receive in list(self.receives.values()):
            self._send_cancel(receive, final=True)
            self._end(receive, RequestState.FAILED, "transceiver closed")

    @_locked
    def fail_all(self, reason: str) -> None:
        """End everything (the loop has stopped; no connection is left to write)."""
        self.closed = True
        for receive in list(self.receives.values()):
            receive.pending.clear()
            self._end(receive, RequestState.FAILED, reason)
        for fence in self.fences.values():
            self._unreserve(fence.handle)
        self.fences.clear()
        self.quarantined.clear()
