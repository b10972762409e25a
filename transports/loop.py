"""The service loop: one thread that owns the sockets and the NIXL agent, with timers.

Public methods of a transceiver run on the caller's thread and hand work to this loop through
:meth:`ServiceLoop.submit`; everything that touches ZMQ sockets or the agent runs here. Timers sit
in a heap, so a deadline costs nothing until it expires, and the loop sleeps in ``poll`` until the
next timer or frame: an idle transceiver does not wake up (:attr:`ServiceLoop.wakeups` counts the
times ``poll`` returned). Due timers run *before* frames are read, so a request whose deadline passed
is never served because its frame happened to be read first.

Callers hand work over with :meth:`ServiceLoop.post` (or :meth:`~ServiceLoop.submit` when they want a
result): the wake-up pipe is written only when the loop is not already due to drain the queue, so a
burst of requests from a caller costs one wake-up, not one each. Roles queue outgoing control
messages while the loop works and its *flushers* send them before it polls again, several per frame.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import zmq

log = logging.getLogger("kvpolicy.transports")

_MAX_BACKOFF_S = 200e-6


def _nothing() -> None:
    """A command that only wakes the loop."""


_COMPACT_AT = 256
"""Cancelled timers the heap may hold before it is rebuilt without them (once they are half of it)."""

SLOW_CALL_S = 1.0
"""A timer, frame handler or command that holds the service thread this long is logged, with its name:
every deadline and every frame of this side waits behind it."""


def _slow(took: float, where: str, fn: Callable[..., Any], name: str) -> None:
    """Log a call that held the service thread ``took`` seconds (callers test the bound inline: the
    quick path, every callback's, is one subtraction and one comparison)."""
    log.warning(
        "transceiver %s: a %s (%s) held the service thread for %.1f s; deadlines and frames waited behind it",
        name,
        where,
        getattr(fn, "__qualname__", repr(fn)),
        took,
    )


class Timer:
    """A pending call; :meth:`cancel` makes it a no-op (it leaves the heap when it comes due, or when
    cancelled timers are half the heap: a request ended long before its deadline costs nothing)."""

    __slots__ = ("when", "fn", "cancelled", "loop")

    def __init__(self, when: float, fn: Callable[[], Any], loop: ServiceLoop | None = None) -> None:
        self.when = when
        self.fn: Callable[[], Any] | None = fn
        self.cancelled = False
        self.loop = loop

    def cancel(self) -> None:
        """Do not run this timer."""
        if self.cancelled:
            return
        self.cancelled = True
        self.fn = None  # drop references to request state early
        if self.loop is not None:
            self.loop._cancelled += 1  # a hint for compaction (recounted then), so no lock


class ServiceLoop:
    """Poller, wake-up pipe, command queue and timer heap of one transceiver's service thread.

    ``busy()`` says whether NIXL work is in flight (then the loop polls without blocking and calls
    ``progress()``; NIXL gives no wake-up for local completion). ``on_error(where)`` is told about
    an exception a handler raised; the loop itself keeps running.
    """

    def __init__(
        self,
        name: str,
        *,
        busy: Callable[[], bool],
        progress: Callable[[], bool],
        on_error: Callable[[str], None],
    ) -> None:
        self.name = name
        self._busy = busy
        self._progress = progress
        self._on_error = on_error
        self._poller = zmq.Poller()
        self._handlers: dict[Any, Callable[[], None]] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._poller.register(self._wake_r, zmq.POLLIN)
        # deque append/popleft are atomic: callers append, only the service thread pops.
        self._commands: collections.deque[tuple[Callable[[], Any], Future | None]] = collections.deque()
        self._wake_pending = False
        """True while a wake-up byte is on its way: later posts need not write another."""
        self._flushers: list[Callable[[], None]] = []
        self.wakeups = 0
        """How many times the service thread returned from ``poll`` (an idle loop does not)."""
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._timer_lock = threading.Lock()
        """Guards the heap: callers add timers too (:meth:`call_at_from_caller`)."""
        self._sleep_until = 0.0
        """When the loop, asleep in ``poll``, wakes at the latest (inf: never); 0 while it runs."""
        self._anchor = 0.0
        """The latest deadline of a cancelled timer dropped from the heap: with nothing else due the
        loop sleeps until it (one wake-up, then none), so that a caller adding a later deadline,
        the usual case, need not wake it."""
        self._cancelled = 0
        """About how many cancelled timers the heap holds (see :data:`_COMPACT_AT`)."""
        self.stopping = False
        self.abandon = False
        """Set by ``close`` when writes did not end in time: stop without waiting for them."""
        self._thread = threading.Thread(target=self._run, name=f"kvpolicy-transceiver-{name}", daemon=True)
        self._finally: Callable[[], None] | None = None
        self._running = False

    # -- any thread -------------------------------------------------------------------------------

    def start(self, on_exit: Callable[[], None]) -> None:
        """Start the thread; ``on_exit`` runs on it last, whatever made it stop."""
        self._finally = on_exit
        self._running = True
        self._thread.start()

    @property
    def alive(self) -> bool:
        """True while the service thread runs (False from the moment it starts to stop)."""
        return self._running

    def submit(self, fn: Callable[[], Any], future: Future | None = None) -> Future:
        """Run ``fn`` on the service thread; its result or exception goes to the returned future."""
        future = future or Future()
        self._enqueue(fn, future)
        return future

    def post(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the service thread, nobody waiting for its result (an exception is logged
        and counted like a handler's)."""
        self._enqueue(fn, None)

    def _enqueue(self, fn: Callable[[], Any], future: Future | None) -> None:
        if not self._running:
            raise RuntimeError(f"transceiver {self.name} is closed")
        self._commands.append((fn, future))
        # The loop clears the flag *before* draining: a command appended before this check is seen
        # by that drain, and one appended after it finds the flag clear and writes a byte.
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            raise RuntimeError(f"transceiver {self.name} is closed") from None

    def call_at_from_caller(self, when: float, fn: Callable[[], Any]) -> tuple[Timer, bool]:
        """(Any thread.) Add a timer; the second value says whether the loop must be woken
        (:meth:`wake`) to see it in time: a caller may first do what is more urgent."""
        timer = Timer(when, fn, self)
        with self._timer_lock:
            heapq.heappush(self._timers, (when, next(self._seq), timer))
            return timer, when < self._sleep_until

    def wake(self) -> None:
        """(Any thread.) Make the loop look at its timers again."""
        self.post(_nothing)

    def join(self, timeout_s: float) -> bool:
        """Wait for the thread to end; True if it did."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def close_pipe(self) -> None:
        """Release the wake-up pipe (after the thread ended)."""
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1

    # -- service thread ---------------------------------------------------------------------------

    def register(self, socket: Any, handler: Callable[[], None]) -> None:
        """Call ``handler()`` whenever ``socket`` is readable."""
        self._handlers[socket] = handler
        self._poller.register(socket, zmq.POLLIN)

    def unregister(self, socket: Any) -> None:
        """Stop watching ``socket`` (no error if it was not watched)."""
        if self._handlers.pop(socket, None) is not None:
            self._poller.unregister(socket)

    def watch_writes(self, busy: Callable[[], bool], progress: Callable[[], bool]) -> None:
        """Replace the ``busy`` and ``progress`` given at construction (the roles that own writes
        are made after the loop)."""
        self._busy, self._progress = busy, progress

    def add_flusher(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` before every ``poll`` (and once more when the loop stops): roles send the
        control frames they queued since, batched."""
        self._flushers.append(fn)

    def flush(self) -> None:
        """Run the flushers now."""
        for fn in self._flushers:
            self._guard("flush", fn)

    def call_at(self, when: float, fn: Callable[[], Any]) -> Timer:
        """Run ``fn`` on the service thread at ``time.monotonic() >= when``."""
        timer = Timer(when, fn, self)
        with self._timer_lock:
            heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def pending_commands(self) -> list[Future]:
        """Take the commands that will never run (the loop has stopped)."""
        futures: list[Future] = []
        while True:
            try:
                _, future = self._commands.popleft()
            except IndexError:
                return futures
            if future is not None:
                futures.append(future)

    def _run_timers(self, now: float) -> None:
        timers, lock = self._timers, self._timer_lock
        while timers and timers[0][0] <= now:
            with lock:
                if not timers or timers[0][0] > now:
                    return
                _, _, timer = heapq.heappop(timers)
            if timer.cancelled:
                self._cancelled -= 1
            else:
                fn, timer.fn, timer.cancelled = timer.fn, None, True  # out of the heap: not counted
                if fn is not None:  # (None: cancelled by another thread since the test above)
                    self._guard("timer", fn)

    def _timeout_ms(self, now: float) -> int | None:
        """The poll timeout; sets :attr:`_sleep_until` under the timer lock, so that a caller adding
        a timer after this sees when the loop will wake."""
        timers = self._timers
        with self._timer_lock:
            if self._cancelled > _COMPACT_AT and 2 * self._cancelled > len(timers):
                self._compact()
            while timers and timers[0][2].cancelled:
                self._anchor = max(self._anchor, heapq.heappop(timers)[0])
                self._cancelled -= 1
            if timers:
                until = timers[0][0]
            elif self._anchor > now:
                until = self._anchor
            else:
                self._sleep_until = math.inf
                return None
            self._sleep_until = until
        return max(0, int((until - now) * 1000) + 1)

    def _compact(self) -> None:
        """(Under the timer lock.) Drop every cancelled timer: O(heap) once per as many cancels."""
        timers = self._timers
        dropped = [entry[0] for entry in timers if entry[2].cancelled]
        if dropped:
            self._anchor = max(self._anchor, max(dropped))
        timers[:] = [entry for entry in timers if not entry[2].cancelled]
        heapq.heapify(timers)
        self._cancelled = 0

    def _guard(self, where: str, fn: Callable[[], Any]) -> None:
        started = time.perf_counter()
        try:
            fn()
        except Exception:
            log.exception("transceiver %s: error in %s (dropped; the service goes on)", self.name, where)
            self._on_error(where)
        if (took := time.perf_counter() - started) >= SLOW_CALL_S:
            _slow(took, where, fn, self.name)

    def _run_commands(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        self._wake_pending = False
        commands = self._commands
        while True:
            try:
                fn, future = commands.popleft()
            except IndexError:
                return
            if future is None:
                self._guard("command", fn)
                continue
            if future.cancelled():
                continue
            started = time.perf_counter()
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)
            if (took := time.perf_counter() - started) >= SLOW_CALL_S:
                _slow(took, "command", fn, self.name)

    def _run(self) -> None:
        backoff = 0.0
        timers, handlers, poll, wake_r, monotonic = self._timers, self._handlers, self._poller.poll, self._wake_r, time.monotonic
        try:
            while True:
                if timers and timers[0][0] <= monotonic():
                    self._run_timers(monotonic())
                # Frames queued by the last iteration or by timers go out before the loop sleeps.
                self.flush()
                busy = self._busy()
                events = poll(0 if busy else self._timeout_ms(monotonic()))
                self._sleep_until = 0.0
                self.wakeups += 1
                progressed = bool(events)
                for socket, _ in events:  # in registration order: the wake-up pipe first
                    if socket == wake_r:
                        self._run_commands()
                    else:
                        handler = handlers.get(socket)
                        if handler is not None:
                            self._guard("frame handler", handler)
                if busy or self._busy():
                    try:
                        progressed |= self._progress()
                    except Exception:
                        log.exception("transceiver %s: error while progressing writes", self.name)
                        self._on_error("progress")
                    busy = self._busy()
                if self.stopping and (self.abandon or not busy):
                    break
                if busy and not progressed:
                    # Spinning was measured and lost: on 2 cores it starves ZMQ's I/O threads.
                    backoff = min(max(backoff * 2, 10e-6), _MAX_BACKOFF_S)
                    time.sleep(backoff)
                else:
                    backoff = 0.0
        except Exception:  # pragma: no cover - a bug here must not leave callers hanging
            log.exception("transceiver %s: service loop crashed", self.name)
        finally:
            self._running = False
            if self._finally is not None:
                self._finally()
            self.flush()  # what the last step queued (results of requests failed at close)
