"""Exactly where two policy versions resolve differently, grouped so a person can read it.

The input domain of two policies is finite (see :mod:`kvpolicy.domain`): a product of dimensions
(model, requested backend / runtime / KV-cache manager, timeout, environment variables, features),
each split into the classes the policies can tell apart. Instead of evaluating every point of that
product, each policy is evaluated *symbolically* on a *cube* (one set of values per dimension):
whenever a test reads a dimension on which the cube is not uniform, the cube is split into the part
that passes and the part that fails, and both are evaluated again. The leaves partition the domain
into cubes on each of which a policy's outcome is constant. Evaluating NEW inside every leaf of OLD
gives cubes on which both are constant; those where they differ are the change, exactly.

Changed cubes are grouped by *how* they change (the values, deciding rules and diagnostics that
differ) and merged into as few cubes as a greedy merge finds; every cube describes exactly the
contexts in it, so every printed line is true of every context it names and of no other.

The symbolic evaluator mirrors :meth:`kvpolicy.resolver.Program.outcome` stage by stage
(explicit, requirements, preference, conditional defaults, default, constraints); the tests check
it against brute-force evaluation of every point with the engine's own evaluator.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import reduce
from typing import Any

from .domain import Dimension, Domain, domain_of
from .model import Condition, Decision, Policy, Row

__all__ = [
    "Change",
    "Cube",
    "DiagnosticKey",
    "DecisionChange",
    "Diff",
    "Group",
    "Outcome",
    "diff_policies",
    "evaluate_cubes",
]

#: A diagnostic as analyses compare it: (id, severity, decision).
DiagnosticKey = tuple[str, str, "str | None"]
#: One set of values per dimension, in the order of :attr:`Diff.dimensions`.
Cube = tuple[frozenset, ...]


@dataclass(frozen=True)
class Outcome:
    """What a policy resolves on a class of contexts: values, deciding rules, diagnostics (sorted)."""

    values: tuple[tuple[str, str | None], ...]
    decided_by: tuple[tuple[str, str], ...]
    diagnostics: tuple[DiagnosticKey, ...]

    @classmethod
    def of(cls, values: dict[str, Any], decided_by: dict[str, str], diagnostics: Iterable[Any]) -> Outcome:
        """From what :meth:`kvpolicy.PolicySet.outcome` returns (diagnostics compared as a multiset)."""
        return cls(
            tuple(sorted(values.items())),
            tuple(sorted(decided_by.items())),
            tuple(sorted(((d[0], d[1], d[3]) for d in diagnostics), key=_diagnostic_sort)),
        )


def _diagnostic_sort(d: DiagnosticKey) -> tuple[str, str, str]:
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
        old_values, new_values = dict(old.values), dict(new.values)
        old_by, new_by = dict(old.decided_by), dict(new.decided_by)
        decisions = tuple(
            DecisionChange(name, old_values.get(name), new_values.get(name), old_by.get(name, ""), new_by.get(name, ""))
            for name in sorted({*old_values, *new_values})
            if (old_values.get(name), old_by.get(name)) != (new_values.get(name), new_by.get(name))
        )
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
            "decisions": [
                {"decision": d.decision, "old": d.old, "new": d.new, "old_rule": d.old_rule, "new_rule": d.new_rule}
                for d in self.decisions
            ],
            "diagnostics_added": [{"id": i, "severity": s, "decision": d} for i, s, d in self.added],
            "diagnostics_removed": [{"id": i, "severity": s, "decision": d} for i, s, d in self.removed],
        }


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
class Group:
    """Contexts that change the same way: the union of disjoint cubes."""

    change: Change
    cubes: tuple[Cube, ...]
    count: int
    """How many points of the full product the cubes hold."""


@dataclass(frozen=True)
class Diff:
    """Every difference between two policies, grouped by how it changes."""

    old: Policy
    new: Policy
    domain: Domain
    dimensions: tuple[Dimension, ...]
    groups: tuple[Group, ...]
    total: int
    """How many points the full product holds."""

    @property
    def changed(self) -> int:
        """How many points change."""
        return sum(g.count for g in self.groups)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def contains(self, cube: Cube, point: tuple[Any, ...]) -> bool:
        """Whether a point (one value per dimension) lies in a cube."""
        return all(value in values for value, values in zip(point, cube))

    def group_of(self, point: tuple[Any, ...]) -> Group | None:
        """The group holding a point, or None when it does not change."""
        for group in self.groups:
            for cube in group.cubes:
                if self.contains(cube, point):
                    return group
        return None


# -- symbolic evaluation ---------------------------------------------------------------------------


class _Split(Exception):
    """Raised when a test reads a dimension the cube is not uniform on: split it into ``inside`` and the rest."""

    __slots__ = ("index", "inside")

    def __init__(self, index: int, inside: frozenset) -> None:
        self.index = index
        self.inside = inside


class _Evaluator:
    """One policy, evaluated on cubes of a given list of dimensions."""

    def __init__(self, policy: Policy, order: tuple[str, ...], dimensions: tuple[Dimension, ...]) -> None:
        self.policy = policy
        self.index = {d.name: i for i, d in enumerate(dimensions)}
        self.models = dimensions[0].values
        self.dimensions = dimensions
        self.decisions = [policy.decisions[name] for name in order]
        self.requirements = {
            d.name: sorted(d.requirements, key=lambda r: r.id) for d in self.decisions
        }
        self.constraints = sorted(policy.constraints, key=lambda c: c.id)
        self._conditions: dict[int, tuple[list[tuple[str, Any]], list[tuple[int, frozenset]]]] = {}
        self._rows: dict[str, dict[Any, Row | None]] = {}
        for decision in self.decisions:
            if decision.preference is not None and decision.preference.rows:
                self._rows[decision.name] = {m: _row_for(decision, *m) for m in self.models}

    # A condition becomes tests of decided values (never split) and tests of dimensions.
    def _compiled(self, condition: Condition) -> tuple[list[tuple[str, Any]], list[tuple[int, frozenset]]]:
        key = id(condition)
        found = self._conditions.get(key)
        if found is not None:
            return found
        decided: list[tuple[str, Any]] = []
        tests: list[tuple[int, frozenset]] = []
        for subject, matcher in sorted(condition.subjects.items()):
            if subject in self.policy.decisions:
                decided.append((subject, matcher))
            else:
                position = 0 if subject == "architecture" else 1
                tests.append((0, frozenset(m for m in self.models if matcher.matches(m[position]))))
        if condition.timeout is not None:
            tests.append((self.index["kv_transfer_timeout_ms"], frozenset([None] if condition.timeout == "null" else [
                v for v in self.dimensions[self.index["kv_transfer_timeout_ms"]].values if v is not None
            ])))
        for feature, on in sorted(condition.features.items()):
            tests.append((self.index[f"feature:{feature}"], frozenset([on])))
        for variable, matcher in sorted(condition.env.items()):
            i = self.index[f"env:{variable}"]
            tests.append((i, frozenset(v for v in self.dimensions[i].values if matcher.matches(v))))
        found = (decided, tests)
        self._conditions[key] = found
        return found

    def holds(self, condition: Condition, cube: Cube, values: dict[str, Any]) -> bool:
        decided, tests = self._compiled(condition)
        for subject, matcher in decided:
            if not matcher.matches(values[subject]):
                return False
        for index, accepted in tests:
            if not _member(cube, index, accepted):
                return False
        return True

    def evaluate(self, cube: Cube) -> Outcome:
        """The outcome on ``cube``; raises :class:`_Split` when it is not constant there."""
        values: dict[str, Any] = {}
        by: dict[str, str] = {}
        diags: list[DiagnosticKey] = []
        for decision in self.decisions:
            name = decision.name
            index = self.index[name]
            requested = cube[index]
            value: Any = None
            rule = ""
            if _member(cube, index, frozenset([decision.auto])):
                held = [r for r in self.requirements[name] if self.holds(r.when, cube, values)]
                if held:
                    if len({r.value for r in held}) > 1:
                        diags.append(("requirements-conflict", "error", name))
                    else:
                        winner = held[0]
                        value, rule = winner.value, winner.id
                        if winner.notice is not None:
                            diags.append((winner.notice.id, winner.notice.severity, name))
                if value is None and name in self._rows:
                    rows = self._rows[name]
                    row = _uniform(cube, 0, rows)
                    if row is not None:
                        preference = decision.preference
                        assert preference is not None
                        if self.holds(preference.adopt_when, cube, values):
                            value, rule = row.value, row.id
                        elif preference.on_not_adopted is not None:
                            notice = preference.on_not_adopted
                            diags.append((notice.id, notice.severity, name))
                if value is None:
                    chosen = decision.default
                    for candidate in decision.conditionals:
                        if self.holds(candidate.when, cube, values):
                            chosen = candidate
                            break
                    value, rule = chosen.value, chosen.id
                    if chosen.notice is not None:
                        diags.append((chosen.notice.id, chosen.notice.severity, name))
            else:
                if len(requested) > 1:
                    raise _Split(index, frozenset([next(iter(sorted(requested, key=str)))]))
                (value,) = requested
                rule = "explicit"
                for r in self.requirements[name]:
                    if r.value != value and self.holds(r.when, cube, values):
                        diags.append((r.id, "error", name))
            values[name] = value
            by[name] = rule
        for constraint in self.constraints:
            if self.holds(constraint.when, cube, values):
                diags.append((constraint.id, constraint.severity, constraint.decision))
        return Outcome(tuple(sorted(values.items())), tuple(sorted(by.items())), tuple(sorted(diags, key=_diagnostic_sort)))


def _member(cube: Cube, index: int, accepted: frozenset) -> bool:
    current = cube[index]
    inside = current & accepted
    if len(inside) == len(current):
        return True
    if not inside:
        return False
    raise _Split(index, inside)


def _uniform(cube: Cube, index: int, mapping: dict[Any, Any]) -> Any:
    """``mapping`` of the cube's values on a dimension, when it is the same for all of them."""
    current = cube[index]
    first = mapping[next(iter(current))]
    if len(current) > 1:
        same = frozenset(v for v in current if mapping[v] is first)
        if len(same) != len(current):
            raise _Split(index, same)
    return first


def _row_for(decision: Decision, architecture: str | None, model_type: str | None) -> Row | None:
    """The preference row the resolver picks: a model_type-qualified row first, then the plain one
    (the first of each in file order)."""
    if architecture is None or decision.preference is None:
        return None
    plain = None
    for row in decision.preference.rows:
        if row.architecture != architecture:
            continue
        if row.model_type is not None:
            if row.model_type == model_type:
                return row
        elif plain is None:
            plain = row
    return plain


def _leaves(cube: Cube, evaluate: Any) -> Iterator[tuple[Cube, Any]]:
    stack = [cube]
    while stack:
        current = stack.pop()
        try:
            result = evaluate(current)
        except _Split as split:
            i = split.index
            rest = current[i] - split.inside
            stack.append(current[:i] + (rest,) + current[i + 1 :])
            stack.append(current[:i] + (split.inside,) + current[i + 1 :])
            continue
        yield current, result


def evaluate_cubes(old: Policy, new: Policy, old_order: tuple[str, ...], new_order: tuple[str, ...], domain: Domain | None = None) -> Iterator[tuple[Cube, Outcome, Outcome]]:
    """Partition the joint domain into cubes on which both policies are constant."""
    domain = domain or domain_of(old, new)
    dimensions = domain.dimensions()
    full: Cube = tuple(frozenset(d.values) for d in dimensions)
    first = _Evaluator(old, old_order, dimensions)
    second = _Evaluator(new, new_order, dimensions)
    for cube, outcome in _leaves(full, first.evaluate):
        for inner, other in _leaves(cube, second.evaluate):
            yield inner, outcome, other


# -- grouping --------------------------------------------------------------------------------------


def _merge(cubes: list[Cube]) -> list[Cube]:
    """Merge disjoint cubes that agree on every dimension but one, until none do.

    The union of two disjoint cubes that differ in one dimension is the cube with the union of
    that dimension's sets, so every merge keeps the cubes exact and disjoint."""
    current = set(cubes)
    if len(current) < 2:
        return list(current)
    width = len(next(iter(current)))
    changed = True
    while changed:
        changed = False
        for i in range(width):
            buckets: dict[tuple, list[frozenset]] = {}
            for cube in current:
                buckets.setdefault(cube[:i] + cube[i + 1 :], []).append(cube[i])
            if len(buckets) < len(current):
                changed = True
                current = {key[:i] + (reduce(frozenset.union, sets),) + key[i:] for key, sets in buckets.items()}
    return sorted(current, key=_cube_order)


def _cube_order(cube: Cube) -> tuple:
    return tuple(sorted(map(repr, values)) for values in cube)


def _size(cube: Cube) -> int:
    count = 1
    for values in cube:
        count *= len(values)
    return count


def diff_policies(old: Any, new: Any) -> Diff:
    """Every context on which two policies (``Policy`` or ``PolicySet``) resolve differently."""
    old_policy, old_order = _unpack(old)
    new_policy, new_order = _unpack(new)
    domain = domain_of(old_policy, new_policy)
    dimensions = domain.dimensions()
    by_change: dict[Change, list[Cube]] = {}
    memo: dict[tuple[Outcome, Outcome], Change | None] = {}
    for cube, first, second in evaluate_cubes(old_policy, new_policy, old_order, new_order, domain):
        key = (first, second)
        change = memo.get(key, memo)
        if change is memo:
            change = None if first == second else Change.between(first, second)
            memo[key] = change  # type: ignore[assignment]
        if change is not None:
            by_change.setdefault(change, []).append(cube)  # type: ignore[arg-type]
    groups = []
    for change, cubes in by_change.items():
        merged = _merge(cubes)
        groups.append(Group(change, tuple(merged), sum(_size(c) for c in merged)))
    groups.sort(key=lambda g: (not g.change.values_change, not g.change.starts_failing, -g.count, g.change.summary()))
    total = _size(tuple(frozenset(d.values) for d in dimensions))
    return Diff(old_policy, new_policy, domain, dimensions, tuple(groups), total)


def _unpack(item: Any) -> tuple[Policy, tuple[str, ...]]:
    if isinstance(item, Policy):
        return item, _order(item)
    return item.policy, tuple(item.decisions)


def _order(policy: Policy) -> tuple[str, ...]:
    """Decisions in an order where every input comes first (any such order gives the same values)."""
    done: list[str] = []
    pending = sorted(policy.decisions)
    while pending:
        ready = [n for n in pending if all(i in done for i in policy.decisions[n].inputs)]
        if not ready:  # a cycle; the loader rejects these
            raise ValueError(f"decision inputs form a cycle among {pending}")
        done += ready
        pending = [n for n in pending if n not in ready]
    return tuple(done)


def points(dimensions: tuple[Dimension, ...]) -> Iterator[tuple[Any, ...]]:
    """Every point of the full product (for tests and small domains)."""
    return itertools.product(*(d.values for d in dimensions))
