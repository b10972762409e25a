"""One metadata probe as its parent keeps it (:class:`Probe`, with a proof's :class:`Proof`), the
request that hands it to a helper or child (:func:`encode_request`), and what became of that child
(:class:`ProbeOutcome`: the verdict a caller gets, and whether it is remembered).

Kept apart from :mod:`.probe`, which admits and answers probes, so that :mod:`.probe_helper` (which
hands them to a helper process) depends on the probe and its outcome and not on
:class:`.probe.MetadataProbe`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from .probe_wire import CANNOT_RUN, CLOSED, OK, PROBE, PROVE, REJECTED, RELEASED, REQUEST, TIMED_OUT

__all__ = ["Probe", "ProbeOutcome", "Proof", "encode_request", "signal_name"]


@dataclass(frozen=True)
class ProbeOutcome:
    """What became of one child: ``code`` is :data:`OK`, :data:`REJECTED`, :data:`CANNOT_RUN`,
    :data:`TIMED_OUT`, another exit status, or minus the signal that killed it."""

    code: int
    message: str = ""
    timeout_s: float = 0.0

    @property
    def verdict(self) -> str | None:
        """None when the blob loaded (safe to load here), else why the peer is refused."""
        code, message = self.code, self.message
        if code == OK:
            return None
        if code == REJECTED:
            return f"NIXL rejected it in the probe: {message}"
        if code == CANNOT_RUN:
            return f"the metadata probe could not run: {message}"
        if code == CLOSED:
            return "the metadata probe is closed"
        if code == RELEASED:
            return "the proof was released before its child answered"
        if code == TIMED_OUT or code == -signal.SIGALRM:
            return f"the metadata probe timed out after {self.timeout_s:g} s"
        if code < 0:
            return f"the NIXL parser crashed on it (signal {-code}, {signal_name(-code)})"
        return f"the NIXL parser exited on it (status {code})" + (f": {message}" if message else "")

    @property
    def cacheable(self) -> bool:
        """Whether the verdict is a property of the blob itself: it loaded, or a signal killed the
        child that loaded it. A timeout, a NIXL error (an unreachable address, say), an exit status,
        a probe that could not run, or a SIGKILL (the OOM killer's) may not recur: not remembered."""
        return self.code == OK or (self.code < 0 and -self.code not in (signal.SIGALRM, signal.SIGKILL, signal.SIGTERM))


def signal_name(number: int) -> str:
    """The name of signal ``number`` (``"SIGSEGV"``), or ``"signal N"`` for one this Python does not know."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class Proof:
    """What a proving child sends once it loaded a blob: ``message`` as a NIXL notification to the agent
    the blob describes, from an agent of its own named ``agent``; it then lingers for at most
    ``linger_s`` seconds (until released)."""

    agent: str
    message: bytes
    linger_s: float


@dataclass
class Probe:
    """One blob to load in a child (or a proof to send), as :class:`.probe.MetadataProbe` keeps it until it
    is answered."""

    id: int
    digest: bytes
    blob: bytes
    timeout_s: float
    callbacks: list[Callable[[str | None], None]] = field(default_factory=list)
    proof: Proof | None = None
    released: bool = False
    """(A proof) its caller released it: whatever its child answers now is not a verdict."""
    sent: float | None = None
    """When it was handed to its helper (monotonic); None while queued."""
    dispatched: bool = False
    """Holds one of the ``max_running`` slots (else it waits for one)."""
    owner: object = None
    """Who asked first (a peer's key): counted against :attr:`.probe.MetadataProbe.per_owner`."""

    @property
    def slot(self) -> bytes:
        """Its key among the probes in flight: a probe's blob joins one in flight with the same digest;
        a proof never joins another (each sends its own message)."""
        return self.digest if self.proof is None else self.digest + self.id.to_bytes(4, "little")


def encode_request(probe: Probe) -> bytes:
    """The request that hands ``probe`` to a helper or child."""
    proof = probe.proof
    if proof is None:
        return REQUEST.pack(PROBE, probe.id, probe.timeout_s, 0.0, 0, 0, len(probe.blob)) + probe.blob
    agent = proof.agent.encode()
    header = REQUEST.pack(PROVE, probe.id, probe.timeout_s, proof.linger_s, len(agent), len(proof.message), len(probe.blob))
    return header + agent + proof.message + probe.blob
