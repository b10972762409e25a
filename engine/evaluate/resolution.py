"""What ``resolve`` answers: the values, which rule decided each, the diagnostics, and a trace."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Mapping
from operator import itemgetter
from types import MappingProxyType


# typing costs a cold `kvpolicy resolve` milliseconds: type checkers read the typed fields below,
# the interpreter builds the same tuples with collections.namedtuple.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NamedTuple

    class _DiagnosticFields(NamedTuple):
        id: str
        severity: str
        message: str
        decision: str | None
        location: str
        fix: str = ""

    class _TraceStepFields(NamedTuple):
        decision: str
        stage: str
        rule: str
        outcome: str
        detail: str

else:
    _DiagnosticFields = namedtuple("Diagnostic", ["id", "severity", "message", "decision", "location", "fix"], defaults=("",))
    _TraceStepFields = namedtuple("TraceStep", ["decision", "stage", "rule", "outcome", "detail"])

__all__ = ["Diagnostic", "Resolution", "ResolutionError", "Trace", "TraceStep"]


class Diagnostic(_DiagnosticFields):
    """An error, warning or informational message about a resolution: ``id``, ``severity``,
    ``message``, ``decision`` (or None), ``location``, ``fix``.

    ``location`` is the ``file:line:col`` of the policy rule or constraint that raised it;
    ``fix`` says what to change (it is also part of ``message``; "" when there is none).
    """

    __slots__ = ()

    def __str__(self) -> str:
        return f"{self.severity} [{self.id}] {self.message}"


class TraceStep(_TraceStepFields):
    """One step of a decision: ``decision``, ``stage``, the ``rule`` looked at, its ``outcome``
    ("decided", "skipped", "lost", "not adopted", "error", "fired" or "passed") and ``detail``."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"{self.decision:<20} {self.stage:<12} {self.outcome:<12} {self.rule}: {self.detail}"


class Trace(tuple[TraceStep, ...]):
    """The ordered steps of a resolution; ``str()`` renders them for a person."""

    def __str__(self) -> str:
        lines: list[str] = []
        current = None
        for step in self:
            if step.decision != current:
                current = step.decision
                lines.append(f"{current}:")
            lines.append(f"  {step.stage:<12} {step.outcome:<11} {step.rule}")
            if step.detail:
                lines.append(f"  {'':<12} {'':<11}   {step.detail}")
        return "\n".join(lines)


class ResolutionError(ValueError):
    """Raised by ``Resolution.raise_for_errors()`` when a resolution carries errors."""

    def __init__(self, errors: tuple[Diagnostic, ...]) -> None:
        self.errors = errors
        lines = [f"  [{d.id}] {d.message}" for d in errors]
        super().__init__("the configuration cannot start:\n" + "\n".join(lines))


class Resolution(tuple):
    """The answer to one context under one policy version. Immutable.

    ``values`` maps each decision to its value (empty when disaggregation is off),
    ``decided_by`` names the rule that decided each value (``explicit`` for a user's choice; ``a+b`` when
    requirements ``a`` and ``b`` agree and decide together, ids sorted), and
    ``trace`` says why the other candidates lost; the trace is computed when it is read.
    """

    # A tuple underneath: a resolution is built on the hot path, and one tuple allocation is the
    # cheapest immutable object Python offers.
    __slots__ = ()

    def __new__(
        cls,
        values: dict[str, str | None],
        decided_by: dict[str, str],
        diagnostics: tuple[Diagnostic, ...],
        context: dict[str, Any],
        policy: Any,
    ) -> Resolution:
        return tuple.__new__(cls, (values, decided_by, diagnostics, context, policy))

    _values = property(itemgetter(0))
    _decided_by = property(itemgetter(1))
    _diagnostics = property(itemgetter(2))
    _context = property(itemgetter(3))
    _policy = property(itemgetter(4))

    @property
    def values(self) -> Mapping[str, str | None]:
        """Each decision's value: ``backend``, ``transceiver_runtime``, ``kv_cache_manager``."""
        return MappingProxyType(self._values)

    @property
    def runtime(self) -> str | None:
        """The transceiver runtime (``PYTHON`` or ``CPP``), or ``None`` when disaggregation is off."""
        return self._values.get("transceiver_runtime")

    @property
    def backend(self) -> str | None:
        """The effective backend (``DEFAULT`` resolved), or ``None`` when disaggregation is off."""
        return self._values.get("backend")

    @property
    def kv_cache_manager(self) -> str | None:
        """The KV-cache manager (``V1`` or ``V2``), or ``None`` when disaggregation is off."""
        return self._values.get("kv_cache_manager")

    @property
    def enabled(self) -> bool:
        """False when ``backend`` is null: disaggregation off, nothing resolved."""
        return bool(self._values)

    @property
    def decided_by(self) -> Mapping[str, str]:
        """The id of the rule that decided each value (``explicit`` for the user's own choice)."""
        return MappingProxyType(self._decided_by)

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        """Every diagnostic, errors first, in a stable order."""
        return self._diagnostics

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        """Diagnostics that stop the configuration from starting."""
        return tuple(d for d in self._diagnostics if d.severity == "error")

    @property
    def warnings(self) -> tuple[Diagnostic, ...]:
        """Diagnostics worth a look that do not stop anything."""
        return tuple(d for d in self._diagnostics if d.severity == "warning")

    @property
    def notes(self) -> tuple[Diagnostic, ...]:
        """Informational diagnostics (for example, a preference that was not adopted)."""
        return tuple(d for d in self._diagnostics if d.severity == "info")

    @property
    def ok(self) -> bool:
        """True when the resolution has no errors."""
        return not any(d.severity == "error" for d in self._diagnostics)

    def raise_for_errors(self) -> Resolution:
        """Raise :class:`kvpolicy.ResolutionError` when there are errors; return self otherwise."""
        errors = self.errors
        if errors:
            raise ResolutionError(errors)
        return self

    @property
    def context(self) -> Mapping[str, Any]:
        """The normalised inputs this resolution answered."""
        return MappingProxyType(self._context)

    @property
    def policy_version(self) -> str:
        """The content version of the policy that answered."""
        return self._policy.version

    @property
    def policy_digest(self) -> str:
        """sha256 of the policy file's bytes."""
        return self._policy.digest

    @property
    def trace(self) -> Trace:
        """The steps of every decision and constraint, in order (computed when read)."""
        return self._policy.trace(self._context)

    @property
    def architecture_known(self) -> bool:
        """Whether the context named the model's architecture. When it did not, this resolution is
        for a model with no preference, and :meth:`verdict` says what holds for every model."""
        return self._context.get("architecture") is not None

    def verdict(self) -> Any:
        """A :class:`kvpolicy.evaluate.verdict.Verdict`: whether this context starts for every model it may be
        about. With a known architecture, this resolution alone; with an unknown one, the context
        resolved for every class of models the policy tells apart, e.g. ``depends on the model:
        cannot start for DeepseekV3ForCausalLM, ...; starts for any other architecture``."""
        return self._policy.verdict_of(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form, stable for scripts."""
        context = dict(self._context)
        context["features"] = sorted(context.get("features", ()))
        context["env"] = dict(context.get("env", {}))
        return {
            "policy_version": self.policy_version,
            "policy_digest": self.policy_digest,
            "enabled": self.enabled,
            "ok": self.ok,
            "values": dict(self._values),
            "decided_by": dict(self._decided_by),
            "diagnostics": [d._asdict() for d in self._diagnostics],
            "context": context,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Resolution):
            return NotImplemented
        return (
            self._values == other._values
            and self._decided_by == other._decided_by
            and self._diagnostics == other._diagnostics
            and self._policy.digest == other._policy.digest
        )

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((tuple(self._values.items()), tuple(self._decided_by.items()), self._diagnostics))

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        if not self._values:
            return f"<Resolution disaggregation off (policy {self.policy_version})>"
        values = ", ".join(f"{k}={v}" for k, v in self._values.items())
        return f"<Resolution {values} ok={self.ok} (policy {self.policy_version})>"
