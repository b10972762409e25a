"""What a diff finds, as values: a policy's outcome on a class of contexts, how it changes between
two versions, and the groups and sections the changes are gathered into.

These are the result types the parts of a diff share: :mod:`kvpolicy.analyse.evaluators` computes
outcomes on cubes, :mod:`kvpolicy.analyse.partition` pairs OLD's with NEW's across the domain,
:mod:`kvpolicy.analyse.diff` groups the changes and :mod:`kvpolicy.analyse.describe` puts them in
words. All are frozen.

A preference row's rule id names its architecture (``runtime-preference[LlamaForCausalLM]``); in an
outcome it is kept as a template (:func:`canonical_rule`), so architectures whose rows agree stay
together instead of splitting the domain one architecture at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .cubes import Cube

__all__ = [
    "ARCHITECTURE_SLOT",
    "UNKNOWN_VALUE",
    "ByValues",
    "Change",
    "Clause",
    "DecisionChange",
    "DiagnosticChange",
    "DiagnosticKey",
    "Group",
    "Outcome",
    "Section",
    "canonical_rule",
    "concrete_rule",
    "diagnostic_sort",
    "rejected",
    "resolution_key",
]

#: A diagnostic as analyses compare it: (id, severity, decision).
DiagnosticKey = tuple[str, str, "str | None"]


@dataclass(frozen=True)
class Outcome:
    """What a policy resolves on a class of contexts: values, deciding rules, diagnostics (sorted)."""

    values: tuple[tuple[str, str | None], ...]
    decided_by: tuple[tuple[str, str], ...]
    diagnostics: tuple[DiagnosticKey, ...]

    def __hash__(self) -> int:
        # Outcomes are dictionary keys over and over in a diff: hash the three tuples once.
        found = self.__dict__.get("_hash")
        if found is None:
            found = self.__dict__["_hash"] = hash((self.values, self.decided_by, self.diagnostics))
        return found

    def __getstate__(self) -> dict[str, Any]:
        # A string's hash differs from one process to the next: never carry it along.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @classmethod
    def of(cls, values: dict[str, Any], decided_by: dict[str, str], diagnostics: Iterable[Any], architecture: str | None = None) -> Outcome:
        """From what :meth:`kvpolicy.PolicySet.outcome` returns for a context of ``architecture``
        (rule ids canonical as :func:`canonical_rule` makes them; diagnostics compared as a multiset)."""
        return cls(
            tuple(sorted(values.items())),
            tuple(sorted((k, canonical_rule(v, architecture)) for k, v in decided_by.items())),
            tuple(sorted(((d[0], d[1], d[3]) for d in diagnostics), key=diagnostic_sort)),
        )


def diagnostic_sort(d: DiagnosticKey) -> tuple[str, str, str]:
    """The order diagnostics are listed in: by id, severity, then decision (none first)."""
    return (d[0], d[1], d[2] or "")


@dataclass(frozen=True)
class DecisionChange:
    """One decision whose value or deciding rule differs."""

    decision: str
    old: str | None
    new: str | None
    old_rule: str
    new_rule: str

    def __str__(self) -> str:
        if self.old != self.new:
            text = f"{self.decision} {self.old} -> {self.new}"
            if self.old_rule == self.new_rule:  # the rule's own value changed (a row's, say)
                return f"{text}, still decided by {self.new_rule}, whose value changed"
            return f"{text}, decided by {self.new_rule} instead of {self.old_rule}"
        return f"{self.decision} stays {self.new}, decided by {self.new_rule} instead of {self.old_rule}"


@dataclass(frozen=True)
class Change:
    """How a context changes: decisions that differ, diagnostics lost and gained."""

    decisions: tuple[DecisionChange, ...]
    removed: tuple[DiagnosticKey, ...]
    added: tuple[DiagnosticKey, ...]

    @classmethod
    def between(cls, old: Outcome, new: Outcome) -> Change:
        """The change from ``old`` to ``new`` (empty when they are equal)."""
        decisions = _decision_changes(old.values, old.decided_by, new.values, new.decided_by)
        removed = _multiset_minus(old.diagnostics, new.diagnostics)
        added = _multiset_minus(new.diagnostics, old.diagnostics)
        return cls(decisions, removed, added)

    @property
    def values_change(self) -> bool:
        """Whether a decided value changes (not only the rule that decided it)."""
        return any(d.old != d.new for d in self.decisions)

    @property
    def starts_failing(self) -> bool:
        """Whether NEW has an error that OLD did not have."""
        return any(d[1] == "error" for d in self.added)

    @property
    def stops_failing(self) -> bool:
        """Whether an error of OLD is gone in NEW."""
        return any(d[1] == "error" for d in self.removed)

    def summary(self) -> list[str]:
        """Lines that say what changes."""
        lines = [str(d) for d in self.decisions]
        lines += [f"+ {severity} {id_}" + (f" ({decision})" if decision else "") for id_, severity, decision in self.added]
        lines += [f"- {severity} {id_}" + (f" ({decision})" if decision else "") for id_, severity, decision in self.removed]
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "decisions": [{"decision": d.decision, "old": d.old, "new": d.new, "old_rule": d.old_rule, "new_rule": d.new_rule} for d in self.decisions],
            "diagnostics_added": [{"id": i, "severity": s, "decision": d} for i, s, d in self.added],
            "diagnostics_removed": [{"id": i, "severity": s, "decision": d} for i, s, d in self.removed],
        }


@lru_cache(maxsize=4096)
def _decision_changes(
    old_values: tuple[tuple[str, str | None], ...],
    old_decided_by: tuple[tuple[str, str], ...],
    new_values: tuple[tuple[str, str | None], ...],
    new_decided_by: tuple[tuple[str, str], ...],
) -> tuple[DecisionChange, ...]:
    # A diff meets the same few resolutions in thousands of leaves that differ only in diagnostics.
    old_map, new_map = dict(old_values), dict(new_values)
    old_by, new_by = dict(old_decided_by), dict(new_decided_by)
    return tuple(
        DecisionChange(name, old_map.get(name), new_map.get(name), old_by.get(name, ""), new_by.get(name, ""))
        for name in sorted({*old_map, *new_map})
        if (old_map.get(name), old_by.get(name)) != (new_map.get(name), new_by.get(name))
    )


def _multiset_minus(a: tuple[DiagnosticKey, ...], b: tuple[DiagnosticKey, ...]) -> tuple[DiagnosticKey, ...]:
    rest = list(b)
    out = []
    for item in a:
        if item in rest:
            rest.remove(item)
        else:
            out.append(item)
    return tuple(out)


@dataclass(frozen=True)
class Clause:
    """Alternatives over some dimensions: a context satisfies the clause when its values on
    ``dims`` lie in one of the sub-cubes (one set of values per dimension of ``dims``)."""

    dims: tuple[int, ...]
    alternatives: tuple[Cube, ...]


@dataclass(frozen=True)
class Group:
    """Contexts that change the same way: the union of disjoint cubes.

    ``clauses`` describe the same set as a product: a context is in the group exactly when it
    satisfies every clause (the dimensions of the clauses partition all dimensions)."""

    change: Change
    cubes: tuple[Cube, ...]
    count: int
    """How many points of the full product the cubes hold."""
    clauses: tuple[Clause, ...] = ()
    resolved: frozenset = frozenset()
    """OLD's outcomes on its contexts, exact in values and deciding rules (diagnostics that both
    versions share may be left out; see :attr:`kvpolicy.analyse.diff.Diff.evaluated`)."""


@dataclass(frozen=True)
class ByValues:
    """A set of contexts written as inputs plus what they resolve to: the contexts of
    ``restriction`` that OLD resolves to one of ``resolved`` (with ``both``: that both versions
    resolve alike to one of them). Used where that is far shorter than a list of input cubes,
    e.g. for changes that follow from decided values rather than from the inputs directly."""

    restriction: Cube
    resolved: tuple[tuple[tuple[str, str | None, str | None], ...], ...]
    """(decision, value, deciding rule) of every decision, one tuple per alternative; the rule
    is None where the description does not need it (``with_rules`` False)."""
    with_rules: bool = True
    both: bool = True
    """True: both versions resolve alike to one of ``resolved``; False: OLD resolves to one."""


@dataclass(frozen=True)
class DiagnosticChange:
    """A diagnostic gained (``+``) or lost (``-``) by some contexts of a section.

    Which contexts: ``restriction``, a cube that, intersected with the section, gives exactly
    them (full on every dimension it does not narrow); or, when no single cube does, ``clauses``
    that describe them on their own. Both None: every context of the section."""

    sign: str
    diagnostic: DiagnosticKey
    count: int
    restriction: Cube | None = None
    clauses: tuple[Clause, ...] | None = None


@dataclass(frozen=True)
class Section:
    """The groups whose decisions change alike (same values, same deciding rules), whatever
    happens to their diagnostics: what a person reads first."""

    decisions: tuple[DecisionChange, ...]
    groups: tuple[Group, ...]
    cubes: tuple[Cube, ...]
    count: int
    clauses: tuple[Clause, ...]
    diagnostics: tuple[DiagnosticChange, ...]
    by_values: ByValues | None = None
    """The same contexts by what they resolve to, where that is shorter than ``clauses``."""


#: The diagnostic of a context a policy rejects (a requested value or feature it does not know).
UNKNOWN_VALUE = "unknown-value"


def rejected(field: str) -> Outcome:
    """The outcome of a context whose requested value of ``field`` (a decision, or
    ``features``) the policy does not accept (``resolve`` raises ContextError for it): nothing
    decided, one error."""
    return Outcome((), (), ((UNKNOWN_VALUE, "error", field),))


#: Where a preference row's id names its architecture (see :func:`canonical_rule`).
ARCHITECTURE_SLOT = "{architecture}"


def canonical_rule(rule: str, architecture: str | None) -> str:
    """A deciding rule id with the context's architecture replaced by ``{architecture}``.

    Preference rows are named ``PREF[ARCH]`` / ``PREF[ARCH,model_type=T]``; rule ids cannot hold
    brackets, so the replacement is exact: two canonical ids are equal for a context exactly when
    the real ids are."""
    if architecture is not None and rule.endswith("]"):
        head, bracket, rest = rule.partition("[")
        if bracket and (rest == architecture + "]" or rest.startswith(architecture + ",model_type=")):
            return f"{head}[{ARCHITECTURE_SLOT}{rest[len(architecture) :]}"
    return rule


def concrete_rule(rule: str, architecture: str | None) -> str:
    """The inverse of :func:`canonical_rule` for one architecture."""
    return rule.replace(ARCHITECTURE_SLOT, architecture or "?") if ARCHITECTURE_SLOT in rule else rule


@lru_cache(maxsize=65536)
def resolution_key(outcome: Outcome, with_rules: bool = True) -> tuple[tuple[str, Any, str | None], ...]:
    """(decision, value, deciding rule or None) of every decision: what a context resolves to
    (and why, ``with_rules``)."""
    by = dict(outcome.decided_by)
    return tuple((name, value, by.get(name, "") if with_rules else None) for name, value in outcome.values)
