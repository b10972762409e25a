"""The lifecycle of one transfer request, its metrics, and how it fails."""

from __future__ import annotations

import enum
import hashlib
import itertools
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any


class RequestState(enum.Enum):
    """Where a request is. Terminal states never change again.

    Sender side: ``WAITING`` (blocks offered, no receiver has asked yet) -> ``TRANSFERRING`` (a NIXL
    write is in flight) -> a terminal state. Receiver side: ``PENDING`` (not yet sent) ->
    ``WAITING`` (asked, waiting for every writer's result frame) -> a terminal state. ``CANCELLING``:
    cancel was asked while a write may be in flight; the pages stay reserved until it is safe.
    """

    PENDING = "pending"
    WAITING = "waiting"
    TRANSFERRING = "transferring"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True once the request has ended and its pages are released."""
        return self in (RequestState.COMPLETED, RequestState.FAILED, RequestState.TIMED_OUT, RequestState.CANCELLED)


# Nonces and offer tokens must differ between attempts, and must not be guessable: a peer that learns
# one (its own) must not be able to name another's (issue 38: a process-wide counter let an insider
# compute the next proof nonce). A keyed hash of a counter (BLAKE2b under a random 32-byte key made at
# import) gives that without a system call per request (os.urandom was ~40% of a caller's time at 64
# in flight); 53 bits, what the control schema accepts. The proof of memory does not use these: it
# takes 128 bits of os.urandom per hello (peers.py).
_NONCE_KEY = secrets.token_bytes(32)
_nonces = itertools.count(1)


def next_nonce() -> int:
    """A fresh, unpredictable nonce in 1 .. 2**53 - 1 (what the control schema accepts)."""
    digest = hashlib.blake2b(next(_nonces).to_bytes(8, "little"), key=_NONCE_KEY, digest_size=8).digest()
    return int.from_bytes(digest, "little") % ((1 << 53) - 1) + 1


class TransferError(RuntimeError):
    """A request that ended without its blocks: failed, timed out or cancelled.

    Only this request is affected; the transceiver keeps serving the others.
    """

    def __init__(self, request_id: str, state: RequestState, reason: str) -> None:
        super().__init__(f"request {request_id!r} {state.value}: {reason}")
        self.request_id = request_id
        self.state = state
        self.reason = reason


@dataclass
class TransferMetrics:
    """What one request cost. Times are seconds; a receiver sums the writers' bytes and descriptors."""

    request_id: str
    role: str
    """``"sender"`` or ``"receiver"``."""
    nbytes: int = 0
    descriptors_before: int = 0
    """Descriptors a layer-wise, block-by-block mover would have posted."""
    descriptors: int = 0
    """Descriptors actually posted, after coalescing adjacent runs."""
    writers: int = 0
    """Result frames the request waited for (receiver) or receivers served (sender)."""
    queue_s: float = 0.0
    """Sender: from the receiver's ask arriving to the write being posted (longest writer)."""
    transfer_s: float = 0.0
    """From posting the write to NIXL reporting it done (longest writer)."""
    total_s: float = 0.0
    """From the request being made on this side to its end."""

    @property
    def gbps(self) -> float:
        """Payload throughput over the request's total time, in GB/s (10^9 bytes)."""
        return self.nbytes / self.total_s / 1e9 if self.total_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain-data form, for structured logs and benchmarks."""
        return {
            "request_id": self.request_id,
            "role": self.role,
            "bytes": self.nbytes,
            "descriptors_before": self.descriptors_before,
            "descriptors": self.descriptors,
            "writers": self.writers,
            "queue_us": round(self.queue_s * 1e6, 1),
            "transfer_us": round(self.transfer_s * 1e6, 1),
            "total_us": round(self.total_s * 1e6, 1),
            "gbps": round(self.gbps, 3),
        }


class _Flag:
    """A one-way event: set once, waited on by any number of threads. A plain lock held until
    :meth:`set`, so that a handle costs one lock, not the two conditions of two ``threading.Event``."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        try:
            self._lock.release()
        except RuntimeError:  # set twice at once: the other call released it
            pass

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        # Each waiter takes the released lock and hands it on at once, so all of them pass.
        if self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            self._lock.release()
            return True
        return self._set


@dataclass
class TransferHandle:
    """A caller's view of one request on one side. Updated by the transceiver's service thread."""

    request_id: str
    role: str
    block_ids: tuple[int, ...]
    deadline: float
    """``time.monotonic()`` value after which the request times out."""
    _state: RequestState = RequestState.PENDING
    reason: str = ""
    metrics: TransferMetrics = field(init=False)
    _done: _Flag = field(default_factory=_Flag, repr=False)
    _released: _Flag = field(default_factory=_Flag, repr=False)
    _created: float = field(default_factory=time.perf_counter, repr=False)

    def __post_init__(self) -> None:
        self.metrics = TransferMetrics(self.request_id, self.role)

    @property
    def state(self) -> RequestState:
        """The current state."""
        return self._state

    def remaining_ms(self) -> int:
        """Time left before the deadline, in whole ms (at least 1): what travels to the peer, which
        counts it on its own monotonic clock (no wall clock is compared across hosts)."""
        return max(1, int((self.deadline - time.monotonic()) * 1000))

    @property
    def done(self) -> bool:
        """True once the request has reached a terminal state (its pages are released)."""
        return self._done._set

    @property
    def released(self) -> bool:
        """True once no write of this request can reach its blocks any more: they may be reused.

        A receive that timed out is ``done`` at its deadline but stays unreleased until every sender
        confirmed that its write is over (or was disconnected); until then the transceiver refuses
        other receives into these blocks, and the caller must not reuse them either.
        """
        return self._released.is_set()

    def wait_released(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until :attr:`released`; return it."""
        return self._released.wait(timeout)

    def wait(self, timeout: float | None = None) -> TransferMetrics:
        """Block until the request ends; return its metrics or raise :class:`TransferError`.

        ``timeout`` defaults to the time left before the request's own deadline plus a margin for
        the service thread to record it; a wait never blocks forever.
        """
        if timeout is None:
            timeout = max(0.0, self.deadline - time.monotonic()) + 5.0
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id!r} still {self._state.value} after waiting {timeout:.3f}s")
        if self._state is not RequestState.COMPLETED:
            raise TransferError(self.request_id, self._state, self.reason)
        return self.metrics

    def _finish(self, state: RequestState, reason: str = "") -> None:
        if self._done._set:
            return
        self._state = state
        self.reason = reason
        self.metrics.total_s = time.perf_counter() - self._created
        self._done.set()

    def _release(self) -> None:
        self._released.set()
