"""Exactly where two policy versions resolve differently, grouped so a person can read it.

The input domain of two policies is finite (see :mod:`kvpolicy.evaluate.domain`): a product of dimensions
(model, requested backend / runtime / KV-cache manager, timeout, environment variables, features),
each split into the classes the policies can tell apart. Instead of evaluating every point of that
product, each policy is evaluated *symbolically* on a *cube* (one set of values per dimension):
whenever a test reads a dimension on which the cube is not uniform, the cube is split into the part
that passes and the part that fails, and both are evaluated again. The leaves partition the domain
into cubes on each of which a policy's outcome is constant. Evaluating NEW inside every leaf of OLD
gives cubes on which both are constant; those where they differ are the change, exactly.

Changed cubes are grouped by *how* they change (the values, deciding rules and diagnostics that
differ) and merged into as few cubes as a greedy merge finds; every cube describes exactly the
contexts in it, so every printed line is true of every context it names and of no other. Where a
group is a product (say, of some architectures and backends with some feature combinations), it
is also written as one: clauses of alternatives. :meth:`Diff.sections` gathers the groups whose
decisions change alike and says where, within them, each diagnostic comes or goes.

Two refinements keep the cost near what changed. Constraints come last and decide nothing, so a
cube that a constraint splits is split there, keeping everything decided so far, instead of
being evaluated again from the start. And when two versions differ only in preference rows (the
usual edit), only the models whose rows differ are evaluated jointly, both versions deciding
each cube together and sharing one split of their constraints; the rest, where they provably
resolve alike, is evaluated only if a description asks about it (see :func:`_partition`).

A preference row's rule id names its architecture (``runtime-preference[LlamaForCausalLM]``); on
cubes it is kept as a template (:func:`canonical_rule`), so architectures whose rows agree stay
together instead of splitting the domain one architecture at a time.

The symbolic evaluator mirrors :meth:`kvpolicy.evaluate.resolver.Program.outcome` stage by stage
(explicit, requirements, preference, conditional defaults, default, constraints); the tests check
it against brute-force evaluation of every point with the engine's own evaluator.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property, lru_cache, reduce
from typing import Any

from ..evaluate.domain import Dimension, Domain, domain_of
from .edit import PolicyEdit, edit_between
from ..read.model import Condition, Decision, Policy, Row

__all__ = [
    "checkpoint_rule_changes",
    "ByValues",
    "Change",
    "Cube",
    "DiagnosticKey",
    "DecisionChange",
    "Diff",
    "Group",
    "Outcome",
    "Unchanged",
    "diff_policies",
    "evaluate_cubes",
    "outcome_of",
    "rejected",
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
    def of(
        cls, values: dict[str, Any], decided_by: dict[str, str], diagnostics: Iterable[Any], architecture: str | None = None
    ) -> Outcome:
        """From what :meth:`kvpolicy.PolicySet.outcome` returns for a context of ``architecture``
        (rule ids canonical as :func:`canonical_rule` makes them; diagnostics compared as a multiset)."""
        return cls(
            tuple(sorted(values.items())),
            tuple(sorted((k, canonical_rule(v, architecture)) for k, v in decided_by.items())),
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
            "decisions": [
                {"decision": d.decision, "old": d.old, "new": d.new, "old_rule": d.old_rule, "new_rule": d.new_rule}
                for d in self.decisions
            ],
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
    versions share may be left out; see :attr:`Diff.evaluated`)."""


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
    evaluated: tuple[tuple[Cube, Outcome, Outcome], ...] = ()
    """Leaves of the part of the domain where the versions may differ: cubes on which the change
    between them is constant, changed or not (the whole domain unless the versions differ only in
    preference rows; see :func:`_partition`). Their outcomes are exact in values and deciding
    rules; diagnostics that both versions share may be left out."""
    evaluated_groups: tuple[int, ...] = ()
    """The index in ``groups`` of each evaluated leaf's group (-1: unchanged)."""
    unchanged: Unchanged | None = field(default=None, compare=False, repr=False)
    """The rest of the domain, where both versions provably resolve alike: its leaves are
    evaluated only when read (descriptions query it a cube at a time)."""

    @cached_property
    def leaves(self) -> tuple[tuple[Cube, Outcome, Outcome], ...]:
        """The joint partition of the whole domain: cubes on which both policies are constant,
        changed or not, with whole outcomes (evaluated again when first read: nothing in a diff's
        own descriptions needs it)."""
        return tuple(evaluate_cubes(self.old, self.new, self.domain))

    @cached_property
    def leaf_groups(self) -> tuple[int, ...]:
        """The index in ``groups`` of each leaf's group (-1: unchanged), aligned with ``leaves``."""
        index = {group.change: i for i, group in enumerate(self.groups)}
        return tuple(-1 if first == second else index[Change.between(first, second)] for _, first, second in self.leaves)

    @property
    def changed(self) -> int:
        """How many points change."""
        return sum(g.count for g in self.groups)

    def __bool__(self) -> bool:
        return bool(self.groups) or bool(self.checkpoint_changes)

    @cached_property
    def edit(self) -> PolicyEdit:
        """What changed in the files (see :mod:`kvpolicy.analyse.edit`): what a reviewer reads first, and
        what each group is attached to."""
        return edit_between(self.old, self.new)

    @cached_property
    def checkpoint_changes(self) -> tuple[tuple[str, str], ...]:
        """How the versions read checkpoints differently (their checkpoint rules): ``(sign, text)``
        per rule, ``+`` added, ``-`` removed, ``~`` changed. The contexts the groups count are
        (architecture, model_type) pairs as read, so such a change shows here, not there."""
        return checkpoint_rule_changes(self.old, self.new)

    def contains(self, cube: Cube, point: tuple[Any, ...]) -> bool:
        """Whether a point (one value per dimension) lies in a cube."""
        return all(value in values for value, values in zip(point, cube))

    def sections(self) -> list[Section]:
        """The groups gathered by how their decisions change (see :class:`Section`)."""
        return list(self._sections)

    @cached_property
    def _sections(self) -> tuple[Section, ...]:
        return tuple(_sections(self))

    @cached_property
    def outcomes(self) -> frozenset[Outcome]:
        """Every distinct outcome either version has anywhere in the domain."""
        return frozenset(o for _, first, second in self.leaves for o in (first, second))

    def leaf_keys(self, with_rules: bool) -> list[tuple[Any, Any]]:
        """(OLD, NEW) resolution keys of every leaf (see :func:`_resolution_key`), computed once."""
        cache = self.__dict__.setdefault("_leaf_keys", {})
        if with_rules not in cache:
            keys = {o: _resolution_key(o, with_rules) for o in self.outcomes}
            cache[with_rules] = [(keys[first], keys[second]) for _, first, second in self.leaves]
        return cache[with_rules]

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


_Compiled = tuple  # (decided-value tests, dimension tests) of one condition


class _Evaluator:
    """One policy, evaluated on cubes of a given list of dimensions.

    A preference row decides with the rule id ``PREF[ARCH]``; on cubes it is the *template*
    ``PREF[{architecture}]`` (see :func:`canonical_rule`), so every architecture whose row gives
    the same value stays in one cube instead of one cube per architecture."""

    def __init__(
        self, policy: Policy, order: tuple[str, ...], dimensions: tuple[Dimension, ...], row_indexes: dict[int, _RowIndex] | None = None
    ) -> None:
        self.policy = policy
        self.diagnose = True
        self.read_rows = False
        """Whether the last :meth:`evaluate` looked up a preference row."""
        self.index = {d.name: i for i, d in enumerate(dimensions)}
        self.models = dimensions[0].values
        self.dimensions = dimensions
        self.plan = []
        for name in order:
            decision = policy.decisions[name]
            requirements = tuple(
                (self._compile(r.when), r.value, r.id, _notice_key(r.notice, name))
                for r in sorted(decision.requirements, key=lambda r: r.id)
            )
            rows = None
            adopt = not_adopted = None
            if decision.preference is not None and decision.preference.rows:
                index = row_indexes[id(decision)] if row_indexes is not None else _row_index(decision)
                rows = {m: _row_key(decision, *m, index=index) for m in self.models}
                adopt = self._compile(decision.preference.adopt_when)
                not_adopted = _notice_key(decision.preference.on_not_adopted, name)
            conditionals = tuple(
                (self._compile(r.when), r.value, r.id, _notice_key(r.notice, name)) for r in decision.conditionals
            )
            default = (decision.default.value, decision.default.id, _notice_key(decision.default.notice, name))
            self.plan.append(
                (name, self.index[name], decision.undecided, requirements, rows, adopt, not_adopted, conditionals, default)
            )
        self.adjustments = tuple(
            (
                name,
                self.index[name],
                policy.decisions[name].undecided,
                tuple((self._compile(r.when), r.value, r.id, _notice_key(r.notice, name)) for r in policy.decisions[name].adjustments),
            )
            for name in order
            if policy.decisions[name].adjustments
        )
        self.constraints = tuple(
            (self._compile(c.when), (c.id, c.severity, c.decision)) for c in sorted(policy.constraints, key=lambda c: c.id)
        )
        # Requested values this policy accepts (the other policy may know more values), and
        # features it does not declare (``resolve`` rejects a context that carries one).
        self.accepted = tuple(
            (name, self.index[name], frozenset(policy.decisions[name].requests))
            for name in order
        )
        self.undeclared = tuple(
            (d.name[len("feature:"):], i)
            for i, d in enumerate(dimensions)
            if d.name.startswith("feature:") and d.name[len("feature:"):] not in policy.features
        )

    def resolutions_only(self) -> _Evaluator:
        """The same evaluator, but outcomes only as far as values and deciding rules go: it never
        splits a cube for a diagnostic alone (constraints, explicit choices against requirements),
        so it needs far fewer leaves; the diagnostics of its outcomes are incomplete."""
        twin = copy.copy(self)
        twin.diagnose = False
        return twin

    def _shape(self) -> tuple:
        """Everything this evaluator reads except the models' row keys."""
        plan = tuple((*step[:4], step[4] is None, *step[5:]) for step in self.plan)
        return (plan, self.adjustments, self.constraints, self.accepted, self.undeclared)

    def models_differing_from(self, other: _Evaluator) -> frozenset | None:
        """The models on which ``other`` may resolve differently, when the two differ only in
        row keys (None when they differ elsewhere: then any model may)."""
        if self.dimensions != other.dimensions or self._shape() != other._shape():
            return None
        return frozenset(
            model
            for model in self.models
            if any(mine[4] is not None and mine[4][model] != theirs[4][model] for mine, theirs in zip(self.plan, other.plan))
        )

    def _compile(self, condition: Condition) -> _Compiled:
        """A condition as tests of decided values (never split) and tests of dimensions."""
        decided: list[tuple[str, Any]] = []
        tests: list[tuple[int, frozenset]] = []
        for subject, matcher in sorted(condition.subjects.items()):
            if subject in self.policy.decisions:
                decided.append((subject, matcher.values, matcher.negate))
            else:
                position = 0 if subject == "architecture" else 1
                tests.append((0, frozenset(m for m in self.models if matcher.matches(m[position]))))
        for subject, matcher in sorted(condition.requested.items()):
            i = self.index[subject]
            tests.append((i, frozenset(v for v in self.dimensions[i].values if matcher.matches(v))))
        if condition.timeout is not None:
            i = self.index["kv_transfer_timeout_ms"]
            want_null = condition.timeout == "null"
            tests.append((i, frozenset(v for v in self.dimensions[i].values if (v is None) is want_null)))
        for feature, on in sorted(condition.features.items()):
            tests.append((self.index[f"feature:{feature}"], frozenset([on])))
        for variable, matcher in sorted(condition.env.items()):
            i = self.index[f"env:{variable}"]
            tests.append((i, frozenset(v for v in self.dimensions[i].values if matcher.matches(v))))
        return (tuple(decided), tuple(tests))

    @staticmethod
    def holds(compiled: _Compiled, cube: Cube, values: dict[str, Any]) -> bool:
        # The hottest function of a diff (millions of calls): set predicates that allocate
        # nothing unless the cube must be split.
        decided, tests = compiled
        for subject, accepted, negate in decided:
            if (values[subject] in accepted) is negate:
                return False
        for index, accepted in tests:
            current = cube[index]
            if current <= accepted:
                continue
            if current.isdisjoint(accepted):
                return False
            raise _Split(index, current & accepted)
        return True

    def evaluate(self, cube: Cube) -> list[tuple[Cube, Outcome]]:
        """The outcome on ``cube``, as pieces of it on which it is constant; raises :class:`_Split`
        when the cube must be split before that."""
        state = self.decide(cube)
        if isinstance(state, Outcome):
            return [(cube, state)]
        if not (self.diagnose and self.constraints):
            return [(cube, self.outcome(state, ()))]
        return [(piece, self.outcome(state, found)) for piece, (found,) in _split_constraints(self.constraints, cube, (state,))]

    def outcome(self, state: tuple[tuple, tuple, list[DiagnosticKey], dict[str, Any]], found: Iterable[DiagnosticKey]) -> Outcome:
        """The outcome of a decided state (see :meth:`decide`) with the constraints ``found``."""
        decided, rules, diags, _ = state
        order = _SORT_KEYS.__getitem__
        return Outcome(decided, rules, tuple(sorted([*diags, *found], key=order)))

    def decide(self, cube: Cube) -> Outcome | tuple[tuple, tuple, list[DiagnosticKey], dict[str, Any]]:
        """Every stage but the constraints: the outcome of a rejected context, or (values, deciding
        rules, diagnostics so far, the values by decision); raises :class:`_Split`."""
        holds = self.holds
        self.read_rows = False
        for name, index, accepted in self.accepted:
            if not _member(cube, index, accepted):
                return rejected(name)
        for _, index in self.undeclared:
            if not _member(cube, index, _OFF):
                return rejected("features")
        values: dict[str, Any] = {}
        by: dict[str, str] = {}
        diags: list[DiagnosticKey] = []
        for name, index, auto, requirements, rows, adopt, not_adopted, conditionals, default in self.plan:
            requested = cube[index]
            value: Any = None
            rule = ""
            if _member(cube, index, auto):
                held = [r for r in requirements if holds(r[0], cube, values)]
                if held:
                    if len({r[1] for r in held}) > 1:
                        diags.append(("requirements-conflict", "error", name))
                    else:  # agreeing requirements decide together, each with its notice (as the resolver)
                        value = held[0][1]
                        rule = "+".join(r[2] for r in held)
                        diags += [r[3] for r in held if r[3] is not None]
                if value is None and rows is not None:
                    self.read_rows = True
                    row = _uniform(cube, 0, rows)
                    if row is not None:
                        if holds(adopt, cube, values):
                            value, rule = row
                        elif not_adopted is not None:
                            diags.append(not_adopted)
                if value is None:
                    value, rule, notice = default
                    for condition, candidate, candidate_id, candidate_notice in conditionals:
                        if holds(condition, cube, values):
                            value, rule, notice = candidate, candidate_id, candidate_notice
                            break
                    if notice is not None:
                        diags.append(notice)
            else:
                if len(requested) > 1:
                    raise _Split(index, frozenset([min(requested, key=str)]))
                (value,) = requested
                rule = "explicit"
                if self.diagnose:
                    for condition, required, rule_id, _ in requirements:
                        if required != value and holds(condition, cube, values):
                            diags.append((rule_id, "error", name))
            values[name] = value
            by[name] = rule
        for name, index, undecided, rules in self.adjustments:
            if not _member(cube, index, undecided):
                continue
            for condition, value, rule, notice in rules:
                if holds(condition, cube, values):
                    values[name], by[name] = value, rule
                    if notice is not None:
                        diags.append(notice)
                    break
        return (tuple(sorted(values.items())), tuple(sorted(by.items())), diags, values)



def _split_constraints(
    constraints: tuple, cube: Cube, states: tuple[Any, ...], shared: bool = True
) -> list[tuple[Cube, tuple[list[DiagnosticKey], ...]]]:
    """The constraints that hold for each decided state (see :meth:`_Evaluator.decide`; an
    :class:`Outcome` for a rejected context, which no constraint reads), on the pieces of
    ``cube`` where every one of them is constant.

    Constraints come last and decide nothing, so where one splits the cube both parts keep
    everything decided so far (every earlier test was uniform on the whole cube): the pieces are
    split here instead of evaluating the whole policy again for each. They come out in the order
    that evaluating again would give (the part inside a test first). Two states of versions that
    differ only in rows share the constraints and split the cube once, for both; with ``shared``
    False, a constraint that applies to both (its tests of decided values pass for both) is left
    out: it holds for both or for neither on every context, so it never changes what differs."""
    # Tests of decided values, and tests the whole cube passes or fails, are the same on every
    # piece: read them once, and split only on the rest.
    width = len(states)
    always: tuple[list[DiagnosticKey], ...] = tuple([] for _ in states)
    active = []
    for (decided, tests), key in constraints:
        applies = tuple(
            not isinstance(state, Outcome)
            and not any((state[3][subject] in accepted) is negate for subject, accepted, negate in decided)
            for state in states
        )
        if not any(applies) or (not shared and all(applies)):
            continue
        splitting = []
        for index, accepted in tests:
            current = cube[index]
            if current <= accepted:
                continue
            if current.isdisjoint(accepted):
                break
            splitting.append((index, accepted))
        else:
            if splitting:
                active.append((splitting, key, applies))
            else:
                for j in range(width):
                    if applies[j]:
                        always[j].append(key)
    count = len(active)
    pieces = []
    stack: list[tuple[Cube, int, tuple[list[DiagnosticKey], ...]]] = [(cube, 0, always)]
    while stack:
        piece, at, found = stack.pop()
        while at < count:
            tests, key, applies = active[at]
            for index, accepted in tests:
                current = piece[index]
                if current <= accepted:
                    continue
                if current.isdisjoint(accepted):
                    break
                stack.append((piece[:index] + (current - accepted,) + piece[index + 1 :], at + 1, found))
                piece = piece[:index] + (current & accepted,) + piece[index + 1 :]
            else:
                found = tuple([*keys, key] if applies[j] else keys for j, keys in enumerate(found))
            at += 1
        pieces.append((piece, found))
    return pieces


def _finish(evaluator: _Evaluator, state: Any, found: Iterable[DiagnosticKey]) -> Outcome:
    return state if isinstance(state, Outcome) else evaluator.outcome(state, found)


class _SortKeys(dict):
    """:func:`_diagnostic_sort` of each diagnostic, remembered (a dict lookup sorts faster than a
    Python key function: a diff sorts hundreds of thousands of them)."""

    def __missing__(self, key: DiagnosticKey) -> tuple[str, str, str]:
        value = self[key] = _diagnostic_sort(key)
        return value


_SORT_KEYS = _SortKeys()


#: The diagnostic of a context a policy rejects (a requested value or feature it does not know).
UNKNOWN_VALUE = "unknown-value"
_OFF = frozenset([False])


def rejected(field: str) -> Outcome:
    """The outcome of a context whose requested value of ``field`` (a decision, or
    ``features``) the policy does not accept (``resolve`` raises ContextError for it): nothing
    decided, one error."""
    return Outcome((), (), ((UNKNOWN_VALUE, "error", field),))


def outcome_of(policy_set: Any, ctx: dict[str, Any]) -> Outcome:
    """The reference outcome of a normalised context, by the engine's own evaluator, as
    :class:`Outcome` (for tests and benchmarks; the diff itself never evaluates points)."""
    for name in policy_set.decisions:
        decision = policy_set.policy.decisions[name]
        if ctx[name] not in decision.requests:
            return rejected(name)
    if not ctx["features"] <= policy_set.features:
        return rejected("features")
    return Outcome.of(*policy_set.outcome(dict(ctx)), ctx["architecture"])


def _notice_key(notice: Any, decision: str) -> DiagnosticKey | None:
    return None if notice is None else (notice.id, notice.severity, decision)


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
            return f"{head}[{ARCHITECTURE_SLOT}{rest[len(architecture):]}"
    return rule


def concrete_rule(rule: str, architecture: str | None) -> str:
    """The inverse of :func:`canonical_rule` for one architecture."""
    return rule.replace(ARCHITECTURE_SLOT, architecture or "?") if ARCHITECTURE_SLOT in rule else rule


def _row_key(
    decision: Decision, architecture: str | None, model_type: str | None, index: _RowIndex | None = None
) -> tuple[str, str] | None:
    row = _row_for(decision, architecture, model_type, index)
    return None if row is None else (row.value, canonical_rule(row.id, architecture))


#: Per architecture: its first plain row and its first row of each model_type (file order).
_RowIndex = dict[str, tuple["Row | None", dict[str, Row]]]


def _row_index(decision: Decision) -> _RowIndex:
    """The preference rows of a decision by architecture, built in one pass over the rows, so
    that finding every model's row is linear in rows rather than quadratic."""
    index: _RowIndex = {}
    if decision.preference is None:
        return index
    for row in decision.preference.rows:
        plain, qualified = index.get(row.architecture, (None, {}))
        if row.model_type is not None:
            qualified.setdefault(row.model_type, row)
        elif plain is None:
            plain = row
        index[row.architecture] = (plain, qualified)
    return index


def _member(cube: Cube, index: int, accepted: frozenset) -> bool:
    current = cube[index]
    if current <= accepted:
        return True
    if current.isdisjoint(accepted):
        return False
    raise _Split(index, current & accepted)


def _uniform(cube: Cube, index: int, mapping: dict[Any, Any]) -> Any:
    """``mapping`` of the cube's values on a dimension, when it is the same for all of them."""
    current = cube[index]
    first = mapping[next(iter(current))]
    if len(current) > 1:
        same = frozenset(v for v in current if mapping[v] == first)
        if len(same) != len(current):
            raise _Split(index, same)
    return first


def _row_for(
    decision: Decision, architecture: str | None, model_type: str | None, index: _RowIndex | None = None
) -> Row | None:
    """The preference row the resolver picks: a model_type-qualified row first, then the plain one
    (the first of each in file order). ``index`` (from :func:`_row_index`) makes it a lookup."""
    if architecture is None or decision.preference is None:
        return None
    if index is not None:
        plain, qualified = index.get(architecture, (None, {}))
        return qualified.get(model_type, plain) if model_type is not None else plain
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
            pieces = evaluate(current)
        except _Split as split:
            i = split.index
            rest = current[i] - split.inside
            stack.append(current[:i] + (rest,) + current[i + 1 :])
            stack.append(current[:i] + (split.inside,) + current[i + 1 :])
            continue
        yield from pieces


def evaluate_cubes(old: Any, new: Any, domain: Domain | None = None) -> Iterator[tuple[Cube, Outcome, Outcome]]:
    """Partition the joint domain of two policies (``Policy`` or ``PolicySet``) into cubes on
    which both are constant: (cube, old outcome, new outcome), cubes aligned with
    ``domain.dimensions()``."""
    evaluated, unchanged = _partition(old, new, domain)
    yield from evaluated
    if unchanged is not None:
        yield from unchanged.leaves()


def _partition(
    old: Any, new: Any, domain: Domain | None, *, shared: bool = True
) -> tuple[Iterator[tuple[Cube, Outcome, Outcome]], Unchanged | None]:
    """The joint partition in two parts: leaves where the versions may differ, evaluated with
    both, and (when there is one) a function giving the leaves of the rest, where they provably
    resolve alike, evaluated with OLD alone.

    When two versions differ only in preference rows (the common edit, and a 10,000-row file
    with 1% of rows changed), their evaluators are the same function of everything but a model's
    row keys: every other part they read compiles to equal tests and values. On a model whose
    row keys are equal in both, the two therefore return equal outcomes on every cube, so only the
    models whose row keys differ need the joint evaluation; the cost follows the rows that
    changed, not the size of the policies.

    With ``shared`` False, outcomes where the versions differ only in rows leave out the
    diagnostics of constraints that apply to both: the changes are the same, on far fewer cubes
    (what :func:`diff_policies` needs; :func:`evaluate_cubes` gives whole outcomes)."""
    old, old_order = _unpack(old)
    new, new_order = _unpack(new)
    domain = domain or domain_of(old, new)
    dimensions = domain.dimensions()
    row_indexes = _row_indexes_of((old, new))
    members, reduced = _model_classes((old, new), dimensions, row_indexes)
    first = _Evaluator(old, old_order, reduced, row_indexes)
    second = _Evaluator(new, new_order, reduced, row_indexes)
    expanded: dict[frozenset, frozenset] = {}

    def expand(representatives: frozenset) -> frozenset:
        # One object per distinct set of classes: leaves share it, and it hashes once.
        found = expanded.get(representatives)
        if found is None:
            found = expanded[representatives] = frozenset().union(*(members[r] for r in representatives))
        return found

    rest = tuple(frozenset(d.values) for d in reduced[1:])
    models = frozenset(reduced[0].values)
    differ = first.models_differing_from(second)
    joint = models if differ is None else differ
    alike = models - joint

    # Cubes where both provably resolve alike, in class representatives: the models whose rows
    # agree, and (filled while ``evaluated`` runs) the cubes where OLD read no differing row.
    region: list[Cube] = [(alike, *rest)] if alike else []

    def both(cube: Cube) -> list[tuple[Cube, Outcome | None, Outcome | None]]:
        # Versions that differ only in rows: decide with both, split the constraints once.
        mine = first.decide(cube)
        if not first.read_rows:
            # OLD read no row here: NEW takes the very same steps, so they agree on all of the
            # cube. Its constraints are split only if something reads the region.
            return [(cube, None, None)]
        theirs = second.decide(cube)
        if not (first.diagnose and first.constraints):
            return [(cube, _finish(first, mine, ()), _finish(second, theirs, ()))]
        return [
            (piece, _finish(first, mine, found), _finish(second, theirs, other))
            for piece, (found, other) in _split_constraints(first.constraints, cube, (mine, theirs), shared)
        ]

    def evaluated() -> Iterator[tuple[Cube, Outcome, Outcome]]:
        if not joint:
            return
        if differ is None:
            for cube, outcome in _leaves((joint, *rest), first.evaluate):
                for inner, other in _leaves(cube, second.evaluate):
                    yield (expand(inner[0]), *inner[1:]), outcome, other
            return
        for cube, outcome, other in _leaves((joint, *rest), both):
            if outcome is None:
                region.append(cube)
            else:
                yield (expand(cube[0]), *cube[1:]), outcome, other

    return evaluated(), Unchanged(first, region, members, expand)


class Unchanged:
    """The part of a joint domain where two versions provably resolve alike (see
    :func:`_partition`), evaluated with OLD, and only as far as a question needs."""

    def __init__(self, evaluator: _Evaluator, cubes: list[Cube], members: dict[Any, frozenset], expand: Callable) -> None:
        self._evaluator = evaluator
        self._resolver = evaluator.resolutions_only()
        self._cubes = cubes  # models as class representatives
        self._members = members
        self._expand = expand
        self._keys: dict[bool, frozenset] = {}

    def __bool__(self) -> bool:
        return bool(self._cubes)

    def leaves(self) -> Iterator[tuple[Cube, Outcome, Outcome]]:
        """(cube, outcome, outcome) partitioning the region."""
        for region in self._cubes:
            for cube, outcome in _leaves(region, self._evaluator.evaluate):
                yield (self._expand(cube[0]), *cube[1:]), outcome, outcome

    def _resolutions(self, within: Cube | None) -> Iterator[Outcome]:
        for region in self._cubes:
            if within is not None:
                models = frozenset(r for r in region[0] if not self._members[r].isdisjoint(within[0]))
                region = (models, *(a & b for a, b in zip(region[1:], within[1:])))
                if not all(region):
                    continue
            for _, outcome in _leaves(region, self._resolver.evaluate):
                yield outcome

    def resolution_keys(self, with_rules: bool) -> frozenset:
        """Every resolution (see :func:`_resolution_key`) of a context of the region."""
        if with_rules not in self._keys:
            self._keys[with_rules] = frozenset(_resolution_key(o, with_rules) for o in self._resolutions(None))
        return self._keys[with_rules]

    def resolves_in(self, within: Cube, keys: set, with_rules: bool) -> bool:
        """Whether some context of the region inside ``within`` resolves to one of ``keys``."""
        return any(_resolution_key(o, with_rules) in keys for o in self._resolutions(within))


def _conditions(policy: Policy) -> Iterator[Condition]:
    """Every condition of a policy."""
    for decision in policy.decisions.values():
        for rule in (*decision.requirements, *decision.conditionals, decision.default, *decision.adjustments):
            yield rule.when
        if decision.preference is not None:
            yield decision.preference.adopt_when
    for constraint in policy.constraints:
        yield constraint.when


def _row_indexes_of(policies: tuple[Policy, ...]) -> dict[int, _RowIndex]:
    """:func:`_row_index` of every decision with preference rows, by ``id`` of the decision (the
    policies must outlive the result)."""
    return {
        id(decision): _row_index(decision)
        for policy in policies
        for decision in policy.decisions.values()
        if decision.preference is not None and decision.preference.rows
    }


def _model_classes(
    policies: tuple[Policy, ...], dimensions: tuple[Dimension, ...], row_indexes: dict[int, _RowIndex] | None = None
) -> tuple[dict[Any, frozenset], tuple[Dimension, ...]]:
    """The models both policies cannot tell apart, as classes: (members of each class by its
    representative, the dimensions with one representative per class on the model dimension).

    The evaluators read a model only through the architecture and model_type tests of conditions
    and through its preference row (value and canonical rule id), so models that agree on all of
    those behave identically in both policies: evaluating one representative per class is exact,
    and the number of leaves no longer grows with the number of rows."""
    models = dimensions[0].values
    tests = []
    for policy in policies:
        for condition in _conditions(policy):
            for subject in ("architecture", "model_type"):
                matcher = condition.subjects.get(subject)
                if matcher is not None:
                    tests.append((0 if subject == "architecture" else 1, matcher))
    row_indexes = row_indexes if row_indexes is not None else _row_indexes_of(policies)
    indexes = [
        (decision, row_indexes[id(decision)])
        for policy in policies
        for decision in policy.decisions.values()
        if decision.preference is not None and decision.preference.rows
    ]
    classes: dict[tuple, list] = {}
    for model in models:
        signature = (
            model[0] is None,
            tuple(_row_key(decision, *model, index=index) for decision, index in indexes),
            tuple(matcher.matches(model[position]) for position, matcher in tests),
        )
        classes.setdefault(signature, []).append(model)
    members = {group[0]: frozenset(group) for group in classes.values()}
    reduced = (Dimension(dimensions[0].name, tuple(m for m in models if m in members)), *dimensions[1:])
    return members, reduced


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


def _sections(result: Diff) -> list[Section]:
    # Groups whose decisions change alike share a section; where only diagnostics change, each
    # way they change is its own section (they rarely have anything else in common).
    by_decisions: dict[Any, list[Group]] = {}
    for group in result.groups:
        by_decisions.setdefault(group.change.decisions or group.change, []).append(group)
    blocks = _blocks(result.dimensions)
    sections = []
    for decisions, groups in by_decisions.items():
        cubes = _merge([c for g in groups for c in g.cubes])
        count = sum(g.count for g in groups)
        box = _bounding_box(cubes)
        changes = []
        for sign, attribute in (("+", "added"), ("-", "removed")):
            keys = sorted({d for g in groups for d in getattr(g.change, attribute)}, key=_diagnostic_sort)
            for key in keys:
                members = [g for g in groups if key in getattr(g.change, attribute)]
                subset = [c for g in members for c in g.cubes]
                subset_count = sum(g.count for g in members)
                if subset_count == count:
                    changes.append(DiagnosticChange(sign, key, subset_count))
                    continue
                restriction = _bounding_box(subset)
                if sum(_size(_intersect(c, restriction)) for c in cubes) == subset_count:
                    # Show only what narrows the section: full on every dimension the section
                    # already bounds the same way.
                    shown = tuple(
                        r if r != b else frozenset(d.values) for r, b, d in zip(restriction, box, result.dimensions)
                    )
                    changes.append(DiagnosticChange(sign, key, subset_count, restriction=shown))
                else:
                    merged = _merge(subset)
                    changes.append(DiagnosticChange(sign, key, subset_count, clauses=_factor(merged, blocks)))
        clauses = _factor(cubes, blocks)
        by_values = None
        outcomes = frozenset().union(*(g.resolved for g in groups))
        lines = sum(len(alternatives) for alternatives in describe_clauses(clauses, result.dimensions))
        both = not groups[0].change.decisions
        for with_rules in (False, True):
            if lines <= 2:
                break
            members = {result.groups.index(g) for g in groups}
            candidate = _by_values(result, cubes, members, outcomes, with_rules, both)
            if candidate is not None:
                size = len(describe_resolved(candidate, result)) + 1
                if size < lines:
                    by_values, lines = candidate, size
        key = decisions if isinstance(decisions, tuple) else ()
        sections.append(Section(key, tuple(groups), tuple(cubes), count, clauses, tuple(changes), by_values))
    return sections


def _by_values(
    result: Diff, cubes: list[Cube], members: set[int], outcomes: frozenset, with_rules: bool, both: bool
) -> ByValues | None:
    """The contexts as (a cube of inputs) x (what OLD, or both versions alike, resolve), if exact.

    The contexts of a box that resolve so are exactly the section's when the box holds the whole
    section (the bounding box does, and widening keeps it) and no *other* context that resolves
    so lies in the box. Start from the bounding box and widen one dimension at a time to every
    value while that holds: widening a dimension adds the slab of the box's complement on it,
    and is refused when some other context resolving alike lies in that slab."""
    resolved = {_resolution_key(o, with_rules) for o in outcomes}
    found: dict[int, bool] = {}  # by id of a key: whether it is one of ``resolved``
    others = []
    for (cube, _, _), (first, second), group in zip(result.evaluated, _evaluated_keys(result, with_rules), result.evaluated_groups):
        if group in members or (both and second is not first):
            continue
        inside = found.get(id(first))
        if inside is None:
            inside = found[id(first)] = first in resolved
        if inside:
            others.append(cube)

    def alike_in(query: Cube) -> bool:
        if any(all(values & allowed for values, allowed in zip(cube, query)) for cube in others):
            return True
        # Where the versions resolve alike, ``both`` holds of every context.
        unchanged = result.unchanged
        return unchanged is not None and unchanged.resolves_in(query, resolved, with_rules)

    box = list(_bounding_box(cubes))
    if alike_in(tuple(box)):
        return None  # another context resolving alike lies in the box: not exact
    for index in reversed(range(len(box))):
        full = frozenset(result.dimensions[index].values)
        if box[index] == full:
            continue
        if not alike_in((*box[:index], full - box[index], *box[index + 1 :])):
            box[index] = full
    return ByValues(tuple(box), tuple(sorted(resolved, key=repr)), with_rules, both)


def _evaluated_keys(result: Diff, with_rules: bool) -> list[tuple[Any, Any]]:
    """(OLD, NEW) resolution keys of every evaluated leaf, computed once per diff. Equal keys are
    one object (a leaf's outcomes are shared among leaves), so callers may compare them with ``is``:
    every section asks, and hashing each leaf's outcomes again cost seconds on structural diffs."""
    cache = result.__dict__.setdefault("_evaluated_keys", {})
    if with_rules not in cache:
        by_id: dict[int, Any] = {}
        interned: dict[Any, Any] = {}
        pairs = []
        for _, first, second in result.evaluated:
            keys = []
            for outcome in (first, second):
                key = by_id.get(id(outcome))
                if key is None:
                    key = _resolution_key(outcome, with_rules)
                    key = by_id[id(outcome)] = interned.setdefault(key, key)
                keys.append(key)
            pairs.append((keys[0], keys[1]))
        cache[with_rules] = pairs
    return cache[with_rules]


@lru_cache(maxsize=65536)
def _resolution_key(outcome: Outcome, with_rules: bool = True) -> tuple[tuple[str, Any, str | None], ...]:
    """(decision, value, deciding rule or None) of every decision: what a context resolves to
    (and why, ``with_rules``)."""
    by = dict(outcome.decided_by)
    return tuple((name, value, by.get(name, "") if with_rules else None) for name, value in outcome.values)


def _bounding_box(cubes: list[Cube]) -> Cube:
    return tuple(reduce(frozenset.union, column) for column in zip(*cubes))


def _intersect(a: Cube, b: Cube) -> Cube:
    return tuple(x & y for x, y in zip(a, b))


def _blocks(dimensions: tuple[Dimension, ...]) -> list[tuple[int, ...]]:
    """Dimensions that read well as one clause: the features, and the backend with its variables."""
    features = tuple(i for i, d in enumerate(dimensions) if d.name.startswith("feature:"))
    backend = tuple(i for i, d in enumerate(dimensions) if d.name == "backend" or d.name.startswith("env:"))
    return [b for b in (features, backend) if b]


def _factor(cubes: list[Cube], blocks: list[tuple[int, ...]]) -> tuple[Clause, ...]:
    """Write a union of disjoint cubes as a product of clauses where it is one.

    A block factors out when every cube's projection on the other dimensions comes with the same
    alternatives on the block; then the union is exactly (those projections) x (alternatives).
    Where it does not, the block stays with the other dimensions."""
    rest: tuple[int, ...] = tuple(range(len(cubes[0])))
    current: list[tuple] = list(cubes)  # aligned with ``rest``
    clauses: list[Clause] = []
    for block in blocks:
        inside = [p for p, d in enumerate(rest) if d in block]
        outside = [p for p, d in enumerate(rest) if d not in block]
        if not inside or not outside:
            continue
        table: dict[tuple, list[tuple]] = {}
        for cube in current:
            table.setdefault(tuple(cube[p] for p in outside), []).append(tuple(cube[p] for p in inside))
        shapes = {frozenset(_merge(alternatives)) for alternatives in table.values()}
        if len(shapes) != 1:
            continue
        (shape,) = shapes
        clauses.append(Clause(tuple(rest[p] for p in inside), tuple(sorted(shape, key=_cube_order))))
        current = _merge(list(table))
        rest = tuple(rest[p] for p in outside)
    clauses.insert(0, Clause(rest, tuple(current)))
    return tuple(clauses)


def _cube_order(cube: Cube) -> tuple:
    return tuple(sorted(map(repr, values)) for values in cube)


def _size(cube: Cube) -> int:
    count = 1
    for values in cube:
        count *= len(values)
    return count


def diff_policies(old: Any, new: Any) -> Diff:
    """Every context on which two policies (``Policy`` or ``PolicySet``) resolve differently."""
    old_policy, _ = _unpack(old)
    new_policy, _ = _unpack(new)
    domain = domain_of(old_policy, new_policy)
    dimensions = domain.dimensions()
    by_change: dict[Change, list[Cube]] = {}
    resolved: dict[Change, set[Any]] = {}
    memo: dict[tuple[Outcome, Outcome], Change | None] = {}
    evaluated, unchanged = _partition(old, new, domain, shared=False)
    leaves = tuple(evaluated)
    leaf_changes = []
    for cube, first, second in leaves:
        key = (first, second)
        change = memo.get(key, memo)
        if change is memo:
            change = None if first == second else Change.between(first, second)
            memo[key] = change  # type: ignore[assignment]
        leaf_changes.append(change)
        if change is not None:
            by_change.setdefault(change, []).append(cube)  # type: ignore[arg-type]
            resolved.setdefault(change, set()).add(first)  # type: ignore[arg-type]
    groups = []
    blocks = _blocks(dimensions)
    for change, cubes in by_change.items():
        merged = _merge(cubes)
        groups.append(
            Group(change, tuple(merged), sum(_size(c) for c in merged), _factor(merged, blocks), frozenset(resolved[change]))
        )
    # Value changes first; groups with the same decision change next to each other.
    groups.sort(
        key=lambda g: (not g.change.values_change, [str(d) for d in g.change.decisions], not g.change.starts_failing, -g.count, g.change.summary())
    )
    total = _size(tuple(frozenset(d.values) for d in dimensions))
    # Each leaf's group, by index (-1: unchanged); equal changes are hashed once per object.
    index_of = {g.change: i for i, g in enumerate(groups)}
    by_object: dict[int, int] = {}
    leaf_groups = []
    for change in leaf_changes:
        found = by_object.get(id(change))
        if found is None:
            found = by_object[id(change)] = -1 if change is None else index_of[change]
        leaf_groups.append(found)
    return Diff(old_policy, new_policy, domain, dimensions, tuple(groups), total, leaves, tuple(leaf_groups), unchanged)


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


# -- descriptions ----------------------------------------------------------------------------------

_REQUEST_LABELS = {"transceiver_runtime": "runtime"}


def describe_cube(cube: Cube, dimensions: tuple[Dimension, ...]) -> str:
    """A cube (one set of values per dimension, aligned with ``dimensions``) in words; every
    context it names lies in the cube and no other does. Dimensions on which the cube holds every
    value are left out: any value will do."""
    parts: list[str] = []
    env_parts: dict[str, list[str]] = {}
    features_on: list[str] = []
    features_off: list[str] = []
    for dimension, values in zip(dimensions, cube):
        if len(values) == len(dimension.values):
            continue
        name = dimension.name
        if name == "model":
            parts.append(_describe_models(values, dimension.values))
        elif name == "kv_transfer_timeout_ms":
            parts.append("null timeout" if values == frozenset([None]) else "finite timeout")
        elif name.startswith("feature:"):
            (features_on if True in values else features_off).append(name[8:])
        elif name.startswith("env:"):
            text = _describe_env(values, dimension.values)
            env_parts.setdefault(text, []).append(name[4:])
        else:
            label = _REQUEST_LABELS.get(name, name)
            ordered = [v for v in dimension.values if v in values]
            parts.append(f"{label} {_or(ordered)}")
    # Variables set to a value first: they say which route DEFAULT takes.
    for text, variables in sorted(env_parts.items(), key=lambda item: not item[0].startswith("=")):
        parts.append(f"{_and(variables)}{text}")
    all_features = sum(1 for d in dimensions if d.name.startswith("feature:"))
    if features_off and not features_on and len(features_off) == all_features > 1:
        parts.append("no features")
    else:
        if features_on:
            parts.append(f"with {_and(features_on)}")
        if features_off:
            parts.append(f"without {_or(features_off)}")
    return ", ".join(parts) if parts else "any"


def describe_group(group: Group | Section, dimensions: tuple[Dimension, ...]) -> list[list[str]]:
    """A group (or section) as clauses, each a list of alternatives in words (a context is in
    the group when it matches one alternative of every clause)."""
    return describe_clauses(group.clauses, dimensions)


def describe_clauses(clauses: tuple[Clause, ...], dimensions: tuple[Dimension, ...]) -> list[list[str]]:
    """Clauses, each a list of alternatives in words."""
    described = []
    for clause in clauses:
        dims = tuple(dimensions[i] for i in clause.dims)
        texts = [describe_cube(alternative, dims) for alternative in clause.alternatives]
        if texts != ["any"]:
            described.append(texts)
    return described or [["any context"]]


def _resolutions_seen(result: Diff, with_rules: bool) -> tuple[dict[str, set[Any]], dict[tuple[str, Any], set[Any]]]:
    """Per decision, every (value, rule) either version decides anywhere, and the rules of each value."""
    cache = result.__dict__.setdefault("_resolutions_seen", {})
    if with_rules not in cache:
        every: dict[str, set[Any]] = {}
        rules_of: dict[tuple[str, Any], set[Any]] = {}
        keys = {key for pair in _evaluated_keys(result, with_rules) for key in pair}
        if result.unchanged is not None:
            keys |= result.unchanged.resolution_keys(with_rules)
        for key in keys:
            for name, value, rule in key:
                every.setdefault(name, set()).add((value, rule))
                rules_of.setdefault((name, value), set()).add(rule)
        cache[with_rules] = (every, rules_of)
    return cache[with_rules]


def describe_resolved(by_values: ByValues, result: Diff) -> list[str]:
    """The resolutions of a :class:`ByValues`, as alternatives in words. A value is named with
    the rules that decided it, unless every rule that ever decides that value is among them."""
    names = [name for name, _, _ in by_values.resolved[0]]
    every, rules_of = _resolutions_seen(result, by_values.with_rules)
    cubes = _merge([tuple(frozenset([(value, rule)]) for _, value, rule in key) for key in by_values.resolved])
    texts = []
    for cube in cubes:
        parts = []
        for name, pairs in zip(names, cube):
            if pairs == every[name]:
                continue
            by_value: dict[Any, set[Any]] = {}
            for value, rule in pairs:
                by_value.setdefault(value, set()).add(rule)
            plain, qualified = [], []
            for value in sorted(by_value, key=str):
                rules = by_value[value]
                if not by_values.with_rules or rules >= rules_of[(name, value)]:
                    plain.append(str(value))
                else:
                    shown = sorted(str(r).replace(ARCHITECTURE_SLOT, "<architecture>") for r in rules)
                    qualified.append(f"{value} (by {_or(shown)})")
            # Values decided by named rules first, so that no "(by ...)" reads as if it held for all.
            parts.append(f"{name} {_or(qualified + plain)}")
        texts.append(", ".join(parts) if parts else "anything")
    return sorted(texts)


def architectures_of(group: Group | Section, dimensions: tuple[Dimension, ...]) -> list[str | None]:
    """The architectures a group's contexts may have."""
    index = [d.name for d in dimensions].index("model")
    return sorted({model[0] for cube in group.cubes for model in cube[index]}, key=lambda a: (a is None, a or ""))


def _or(items: list[Any]) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _and(items: list[Any]) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _describe_env(values: frozenset, options: tuple[str, ...]) -> str:
    named = [o for o in options if o not in ("", _OTHER)]
    shown = [("unset" if v == "" else "another value" if v == _OTHER else repr(v)) for v in options if v in values]
    missing = [o for o in options if o not in values]
    if "" in options and _OTHER not in options and "" in values and len(missing) == 1 and missing[0] != "":
        return f" not {missing[0]}"  # '' stands for unset and every unnamed value
    if "" in values and _OTHER not in options and named:
        shown[shown.index("unset")] = f"not {_or(named)}"
    only = [v for v in options if v in values]
    if len(only) == 1 and only[0] not in ("", _OTHER):
        return f"={only[0]}"
    return " is " + _or(shown)


def _describe_models(values: frozenset, models: tuple[tuple[str | None, str | None], ...]) -> str:
    """Architectures by name; a qualified architecture says which model_type it covers."""
    by_architecture = _by_architecture(models)

    def name(architecture: str | None, model_types: list[str | None]) -> str:
        all_types = by_architecture[architecture]
        label = architecture or "any other architecture"
        if len(model_types) == len(all_types):
            return label
        named = [t for t in all_types if t is not None]
        if model_types == [None]:
            return f"{label} (model_type not {_or(named)})"
        return f"{label} (model_type {_or([t or 'another' for t in model_types])})"

    # Only the architectures of ``values`` are named, unless the set holds "any other
    # architecture" and may read shorter as its complement: then every architecture counts.
    if (None, None) in values:
        architectures: Iterable[str | None] = by_architecture
    else:
        position = _positions(models)
        architectures = sorted({a for a, _ in values}, key=position.__getitem__)
    inside: list[str] = []
    outside: list[str] = []
    for architecture in architectures:
        all_types = by_architecture[architecture]
        kept = [t for t in all_types if (architecture, t) in values]
        if kept:
            inside.append(name(architecture, kept))
        if len(kept) < len(all_types):
            outside.append(name(architecture, [t for t in all_types if (architecture, t) not in values]))
    if (None, None) in values and len(outside) < len(inside):
        return f"every architecture except {_or(outside)}"
    return _or(inside)


@lru_cache(maxsize=16)
def _by_architecture(models: tuple[tuple[str | None, str | None], ...]) -> dict[str | None, list[str | None]]:
    """The model_types of each architecture, in the order of ``models`` (one dimension's values:
    the same tuple for every description of a diff)."""
    by_architecture: dict[str | None, list[str | None]] = {}
    for architecture, model_type in models:
        by_architecture.setdefault(architecture, []).append(model_type)
    return by_architecture


@lru_cache(maxsize=16)
def _positions(models: tuple[tuple[str | None, str | None], ...]) -> dict[str | None, int]:
    return {architecture: i for i, architecture in enumerate(_by_architecture(models))}


_OTHER = "\x00other"


def checkpoint_rule_changes(old: Policy, new: Policy) -> tuple[tuple[str, str], ...]:
    """The checkpoint rules of two versions, compared by id: ``(sign, description)`` pairs."""

    def text(rule: Any) -> str:
        kind = {True: " (composite checkpoints)", False: " (text-only checkpoints)", None: ""}[rule.multimodal]
        return f"{rule.id}: model_type {' or '.join(rule.model_type)}{kind} loads as {rule.architecture}"

    before = {r.id: r for r in old.checkpoint_rules}
    after = {r.id: r for r in new.checkpoint_rules}
    found: list[tuple[str, str]] = []
    for rule_id in sorted(before.keys() | after.keys()):
        a, b = before.get(rule_id), after.get(rule_id)
        if a is None:
            found.append(("+", text(b)))
        elif b is None:
            found.append(("-", text(a)))
        elif (a.model_type, a.multimodal, a.architecture) != (b.model_type, b.multimodal, b.architecture):
            found.append(("~", f"{text(a)} -> {text(b)}"))
    if [r.id for r in old.checkpoint_rules if r.id in after] != [r.id for r in new.checkpoint_rules if r.id in before]:
        found.append(("~", "the order in which checkpoint rules are tried changed (the first that matches wins)"))
    return tuple(found)
