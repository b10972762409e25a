"""Sender side: offers, the receivers' asks, and the NIXL writes that serve them.

An offer (``send``) may name the receivers it is for (their key names); an ask from anyone else is
treated exactly like an ask for a request that does not exist, so it learns nothing. Asks for
requests not offered yet wait, within a per-peer budget and their own deadline. A write never starts
after the ask's absolute deadline or the offer's; a write still in flight at the offer's deadline is
aborted and reported as ``aborted``. Every result names the attempt (nonce) it answers.

With reads allowed, an offer is also announced to the named receivers connected now (:mod:`.reads`);
one that ends before they released it keeps its blocks fenced (``released`` False) until they do.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from . import control, reads
from .local import LocalSide, remember
from .offer import Offer
from .mapping import plan_descriptors
from .peers import Remote, Remotes
from .request import RequestState, TransferHandle
from .writes import WritePoster, transfer_error, whole_block_plan

log = logging.getLogger("kvpolicy.transports")


@dataclass(slots=True)
class Ask:
    """One receiver's request frame (one attempt)."""

    remote: Remote
    request: control.Request
    arrived: float
    deadline: float
    timer: Any = None


@dataclass(slots=True)
class Write:
    """One NIXL WRITE in flight."""

    offer: Offer
    ask: Ask
    xfer: Any
    nbytes: int
    descriptors_before: int
    descriptors: int
    posted: float


class Sender:
    """Offers and writes of one transceiver; runs on the service thread."""

    def __init__(self, local: LocalSide) -> None:
        self.local = local
        self.remotes: Remotes  # set by the facade (the two refer to each other)
        self.offers: dict[str, Offer] = {}
        self.parked: dict[str, list[Ask]] = {}
        self._parked_per_key: Counter[bytes] = Counter()
        self.writes: list[Write] = []
        self.ended: OrderedDict[str, tuple[RequestState, str, frozenset[bytes] | None]] = OrderedDict()
        self.fenced: dict[tuple[str, int], Offer] = {}
        """Ended offers whose blocks wait for the releases of receivers they were announced to."""
        self._post = WritePoster(local, "WRITE")

    def busy(self) -> bool:
        """True while a write is in flight."""
        return bool(self.writes)

    # -- offers -----------------------------------------------------------------------------------

    def offer(self, handle: TransferHandle, receivers: int, to: frozenset[bytes] | None) -> None:
        """Offer ``handle``'s blocks; serve the asks already waiting for it."""
        if handle.done:
            return
        offer = Offer(handle, receivers, to)
        handle._state = RequestState.WAITING
        self.offers[handle.request_id] = offer
        offer.timer = self.local.loop.call_at(handle.deadline, lambda: self._offer_expired(offer))
        waiting = self.parked.pop(handle.request_id, [])
        if to is not None and self.local.reads:  # (not to a receiver that asked already: it is written)
            reads.announce(self, offer, {ask.remote.identity for ask in waiting})
        for ask in waiting:
            self._unpark(ask, keep_listed=True)
        for ask in waiting:
            if offer.for_key(ask.remote.key):
                self._start_write(offer, ask)
            else:
                self._park(ask)  # not for this peer: it waits and expires like any unknown id

    def on_release(self, remote: Remote, release: control.Release) -> None:
        """A receiver's one answer to an announced offer (see :func:`.reads.on_release`)."""
        reads.on_release(self, remote, release)

    def cancel(self, request_id: str) -> bool:
        """Cancel an offer; True if it ended now (no write in flight, no read that may be)."""
        offer = self.offers.get(request_id)
        if offer is None or offer.handle.done:
            return False
        offer.cancel_requested = True
        reads.withdraw(self, offer)  # (a receiver that took it reads on: its release ends the offer)
        if offer.writes or offer.announced:
            return False
        self.settle(offer)
        return True

    def _offer_expired(self, offer: Offer) -> None:
        if offer.handle.done:
            return
        if offer.writes:
            self._abort_writes(offer)
        else:
            waited = offer.receivers - offer.served - offer.cancelled
            self._end(offer, RequestState.TIMED_OUT, f"{waited} receiver(s) did not ask in time")

    # -- asks ---------------------------------------------------------------------------------------

    def on_request(self, remote: Remote, request: control.Request, *, again: bool = False) -> None:
        """A receiver's ask (an authenticated frame, schema-checked); ``again``: the second look at
        an ask for a request id that had ended (see below)."""
        # The ask's time left counts from now on this side's monotonic clock: clocks of the two hosts
        # are never compared (the receiver keeps its blocks fenced until this side's result).
        # An ask again (the receiver asks again after a reconnect: it or its result may have been
        # lost with the old TCP connection): the result already sent goes again; one being served
        # or parked is not served twice.
        if self.remotes.resend_result(remote, (remote.key, request.request_id, request.nonce)) or self._asked_already(remote.key, request):
            self.local.stats["repeated_asks"] += 1
            return
        now = time.monotonic()
        ask = Ask(remote, request, time.perf_counter(), now + min(request.timeout_ms / 1000.0, self.local.timeout_s))
        offer = self.offers.get(request.request_id)
        if offer is not None and offer.for_key(remote.key):
            self._start_write(offer, ask)
            return
        ended = self.ended.get(request.request_id)
        if ended is not None and (ended[2] is None or remote.key in ended[2]):
            if not again:
                # A request id may be used again as soon as its last request was seen done, and
                # send() returns before this thread has registered the new offer: commands posted
                # before this ask arrived (that offer among them) run first, then the ask is read again.
                self.local.loop.post(lambda: self._ask_again(remote, request))
                return
            state, reason, _ = ended
            status = "cancelled" if state is RequestState.CANCELLED else "error"
            self._refuse(remote, request, status, f"sender request {state.value}: {reason}")
            return
        if offer is not None or ended is not None:
            self.local.stats["dropped_not_addressee"] += 1
        if self._parked_per_key[remote.key] >= self.local.limits.parked_per_peer:
            self.local.stats["dropped_over_budget"] += 1
            self._refuse(remote, request, "error", "too many asks waiting for offers from this peer")
            return
        # The receiver may ask before prefill has finished: hold the ask, within its deadline.
        ask.deadline = min(ask.deadline, now + self.local.limits.park_s)
        self._park(ask)

    def _ask_again(self, remote: Remote, request: control.Request) -> None:
        if not remote.gone:  # (forgotten meanwhile: its asks went with it)
            self.on_request(remote, request, again=True)

    def _asked_already(self, key: bytes, request: control.Request) -> bool:
        """Whether this very attempt (key, request id, nonce) is parked or being written: a repeat.
        Off the common path: writes are looked through only when the offer was served to that key."""
        if any(a.remote.key == key and a.request.nonce == request.nonce for a in self.parked.get(request.request_id, ())):
            return True
        offer = self.offers.get(request.request_id)
        return (
            offer is not None
            and key in offer.served_by
            and any(w.offer is offer and w.ask.remote.key == key and w.ask.request.nonce == request.nonce for w in self.writes)
        )

    def _park(self, ask: Ask) -> None:
        self.parked.setdefault(ask.request.request_id, []).append(ask)
        self._parked_per_key[ask.remote.key] += 1
        ask.timer = self.local.loop.call_at(ask.deadline, lambda: self._park_expired(ask))
        self.local.watch_allow_list(self._has_parked)  # (a removed key's asks go within 0.1 s)

    def _has_parked(self) -> bool:
        return bool(self.parked)

    def _unpark(self, ask: Ask, *, keep_listed: bool = False) -> None:
        if ask.timer is not None:
            ask.timer.cancel()
            ask.timer = None
        self._parked_per_key[ask.remote.key] -= 1
        if self._parked_per_key[ask.remote.key] <= 0:
            del self._parked_per_key[ask.remote.key]
        if not keep_listed:
            asks = self.parked.get(ask.request.request_id, [])
            if ask in asks:
                asks.remove(ask)
            if not asks:
                self.parked.pop(ask.request.request_id, None)

    def _park_expired(self, ask: Ask) -> None:
        ask.timer = None
        self._unpark(ask)
        self._refuse(ask.remote, ask.request, "error", "the sender never offered this request")

    def _refuse(self, remote: Remote, request: control.Request, status: str, reason: str) -> None:
        self.remotes.reply(remote, control.Result(request.request_id, request.nonce, status, reason))

    def on_cancel(self, remote: Remote, cancel: control.Cancel) -> None:
        """A receiver stops one attempt (or, with nonce 0, all of its attempts) of a request."""
        mine = [a for a in self.parked.get(cancel.request_id, []) if a.remote.key == remote.key and cancel.nonce in (0, a.request.nonce)]
        for ask in mine:
            self._unpark(ask)
            self._refuse(remote, ask.request, "cancelled", "cancelled by the receiver")
        if mine:
            return
        offer = self.offers.get(cancel.request_id)
        if offer is None or not offer.for_key(remote.key):
            self.local.stats["dropped_not_addressee" if offer is not None else "late_frames"] += 1
            return
        if any(w.offer is offer and w.ask.remote.key == remote.key for w in self.writes) or remote.key in offer.served_by:
            self.local.stats["late_frames"] += 1  # a write is in flight (its result follows) or done
            return
        if not cancel.final:
            # One attempt ended (it timed out before its ask was served): the offer stays for a retry
            # of the same request id; the result lets the receiver lift that attempt's fence.
            self.local.stats["late_frames"] += 1
            if cancel.nonce:
                self.remotes.reply(remote, control.Result(cancel.request_id, cancel.nonce, "cancelled", "the attempt ended; nothing written"))
            return
        # The receiver gave up before asking: count it so the offer need not wait for it.
        offer.served_by.add(remote.key)
        offer.cancelled += 1
        if cancel.nonce:
            self.remotes.reply(remote, control.Result(cancel.request_id, cancel.nonce, "cancelled", "cancelled by the receiver"))
        self.settle(offer)

    def on_remote_gone(self, remote: Remote) -> None:
        """A receiver was forgotten: its waiting asks, and the announcements it owed a release, go
        with it, and its writes in flight are aborted (one NIXL does not confirm stays counted in
        ``remote.writes`` until it reports: a new welcome to that key waits for it, see
        :meth:`.peers.Remotes.welcome_when_clean`)."""
        for asks in list(self.parked.values()):
            for ask in [a for a in asks if a.remote is remote]:
                self._unpark(ask)
        for write in [w for w in self.writes if w.ask.remote is remote]:
            if self._post.abort(write.xfer):
                self.writes.remove(write)
                self._complete(write, ok=False, reason="the receiver said hello again or was forgotten; write aborted", status="aborted")
        reads.remote_gone(self, remote)

    # -- writes -------------------------------------------------------------------------------------

    def _start_write(self, offer: Offer, ask: Ask) -> None:
        handle, request, remote = offer.handle, ask.request, ask.remote
        if offer.cancel_requested or handle.done:
            self._refuse(remote, request, "cancelled", "sender cancelled the request")
            return
        now = time.monotonic()
        if now >= ask.deadline or now >= handle.deadline or remote.gone:
            self._refuse(remote, request, "error", "deadline passed before the write started; nothing written")
            return
        if remote.key in offer.served_by:
            self._refuse(remote, request, "error", "this receiver was already served for this request")
            return
        offer.served_by.add(remote.key)
        skip, blocks = request.skip_blocks, request.blocks
        source = handle.block_ids[skip:] if skip else handle.block_ids
        problem = ""
        if len(source) != len(blocks):
            problem = f"receiver asked for {len(blocks)} blocks after skipping {skip}, but the sender holds {len(handle.block_ids)}"
        elif blocks and (max(blocks) >= remote.rank.num_blocks or (len(blocks) > 1 and len(set(blocks)) != len(blocks))):
            problem = f"receiver block ids out of range or repeated (its pool has {remote.rank.num_blocks})"
        elif blocks and not remote.whole_blocks and not len(remote.segments.runs):
            problem = "sender and receiver share no layers/heads"
        if problem:
            self._refuse(remote, request, "error", problem)
            self.writer_ended(offer, ok=False, reason=problem)
            return
        posted = time.perf_counter()
        try:
            plan = (
                whole_block_plan(remote, source, request.blocks)
                if remote.whole_blocks
                else plan_descriptors(
                    remote.segments,
                    source,
                    request.blocks,
                    src_base=self.local.pool.base_address,
                    src_block_bytes=self.local.pool.block_bytes,
                    dst_base=remote.rank.base_address,
                    dst_block_bytes=remote.rank.layout.block_bytes,
                )
            )
            if not plan.descriptors:
                self._complete(Write(offer, ask, None, 0, 0, 0, posted), ok=True, reason="")
                return
            xfer = self._post.whole_blocks(remote, source, request.blocks) if remote.whole_blocks else self._post.runs(remote, plan)
            status = self.local.agent.transfer(xfer)
        except Exception as exc:
            self._complete(Write(offer, ask, None, 0, 0, 0, posted), ok=False, reason=f"NIXL: {exc}")
            return
        write = Write(offer, ask, xfer, plan.nbytes, plan.descriptors_before, plan.descriptors, posted)
        offer.writes += 1
        remote.writes += 1
        handle._state = RequestState.TRANSFERRING
        if status == "DONE":
            self._complete(write, ok=True, reason="")
        elif status == "ERR":
            self._complete(write, ok=False, reason="NIXL reported an error posting the write")
        else:
            self.writes.append(write)

    def progress(self) -> bool:
        """Poll NIXL for the writes in flight; report the finished ones. True if any finished."""
        progressed = False
        for write in list(self.writes):
            error = transfer_error(self.local.agent, write.xfer, "write")
            if error is None:
                continue
            self.writes.remove(write)
            self._complete(write, ok=not error, reason=error)
            progressed = True
        return progressed

    def _complete(self, write: Write, *, ok: bool, reason: str, status: str = "") -> None:
        request, remote = write.ask.request, write.ask.remote
        queue_s = write.posted - write.ask.arrived
        transfer_s = time.perf_counter() - write.posted if write.xfer is not None else 0.0
        # Report first: the receiver waits on this frame (and keeps its blocks fenced until it comes).
        self.remotes.reply(
            remote,
            control.Result(
                request.request_id,
                request.nonce,
                status or ("ok" if ok else "error"),
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
            remote.writes -= 1
            if not status:  # (an aborted write's handle was released by the abort)
                self._post.finished(write.xfer, ok=ok)
            if remote.gone and not remote.writes:
                self.remotes.release(remote)
        metrics = write.offer.handle.metrics
        metrics.nbytes += write.nbytes
        metrics.descriptors_before += write.descriptors_before
        metrics.descriptors += write.descriptors
        metrics.queue_s = max(metrics.queue_s, queue_s)
        metrics.transfer_s = max(metrics.transfer_s, transfer_s)
        self.writer_ended(write.offer, ok=ok, reason=reason)

    def _abort_writes(self, offer: Offer) -> None:
        """Past the deadline with writes in flight: only a confirmed abort (release succeeds) ends a
        write, reported to its receiver as ``aborted``; otherwise it stays until NIXL reports."""
        for write in [w for w in self.writes if w.offer is offer]:
            if not self._post.abort(write.xfer):
                continue
            self.writes.remove(write)
            self._complete(write, ok=False, reason="write timed out and was aborted", status="aborted")
        if not offer.writes and not offer.handle.done:
            self._end(offer, RequestState.TIMED_OUT, "write did not finish in time")

    def writer_ended(self, offer: Offer, *, ok: bool, reason: str) -> None:
        if ok:
            offer.served += 1
            offer.handle.metrics.writers += 1
        elif not offer.failed:
            offer.failed = reason
        self.settle(offer)

    def settle(self, offer: Offer) -> None:
        """End the offer once nothing is in flight and nothing more is expected (or it must stop)."""
        if offer.writes or offer.handle.done or (offer.cancel_requested and offer.announced):
            return
        if offer.failed:
            self._end(offer, RequestState.FAILED, offer.failed)
        elif offer.served + offer.cancelled >= offer.receivers:
            if offer.cancelled:
                self._end(offer, RequestState.CANCELLED, "cancelled by the receiver")
            else:
                self._end(offer, RequestState.COMPLETED)
        elif offer.cancel_requested:
            self._end(offer, RequestState.CANCELLED, "cancelled by the sender")
        elif offer.handle.state is RequestState.TRANSFERRING:
            offer.handle._state = RequestState.WAITING

    def _end(self, offer: Offer, state: RequestState, reason: str = "") -> None:
        request_id = offer.handle.request_id
        if self.offers.get(request_id) is offer:
            del self.offers[request_id]
        self.local.handle_ended(offer.handle)
        if not reads.fence(self, offer):  # (a receiver may still read: its release lifts the fence)
            offer.handle._release()
        offer.handle._finish(state, reason)  # last: whoever sees it done may reuse the request id
        if offer.timer is not None:
            offer.timer.cancel()
        remember(self.ended, request_id, (state, reason, offer.to))
        if self.local.log_requests:
            self.local.log_request(offer.handle)

    # -- shutdown -----------------------------------------------------------------------------------

    def begin_close(self) -> None:
        """Stop: end what has no write in flight; writes in flight end when NIXL reports them."""
        for offer in list(self.offers.values()):
            offer.cancel_requested = True
            if not offer.writes:
                self._end(offer, RequestState.FAILED, "transceiver closed")

    def fail_all(self, reason: str) -> None:
        """End everything still open (the loop has stopped; no receiver can read any more)."""
        reads.forget_all(self)
        for offer in list(self.offers.values()):
            self._end(offer, RequestState.FAILED, reason)
        self.writes.clear()

    def close(self) -> None:
        """Release the local prepared list."""
        self._post.close()
