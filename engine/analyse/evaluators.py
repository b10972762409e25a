"""One policy evaluated *symbolically* on cubes of its input domain, and the reference outcome of
one context.

The input domain of two policies is finite (see :mod:`kvpolicy.evaluate.domain`): a product of
dimensions (model, requested backend / runtime / KV-cache manager, timeout, environment variables,
features), each split into the classes the policies can tell apart. Instead of evaluating every point
of that product, an :class:`Evaluator` evaluates a policy on a *cube* (one set of values per
dimension): whenever a test reads a dimension on which the cube is not uniform, it raises
:class:`Split`, and :func:`leaves_of` splits the cube into the part that passes and the part that
fails and evaluates both again. The leaves are cubes on each of which the policy's outcome is
constant.

Constraints come last and decide nothing, so a cube that a constraint splits is split there
(:func:`split_constraints`), keeping everything decided so far, instead of being evaluated again
from the start.

The symbolic evaluator mirrors :meth:`kvpolicy.evaluate.interpreter.Program.outcome` stage by stage
(explicit, requirements, preference, conditional defaults, default, constraints); the tests check
it against brute-force evaluation of every point with the engine's own evaluator
(:func:`outcome_of`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any

from ..evaluate.domain import Dimension
from ..read.model import Condition, Policy
from .cubes import Cube
from .outcomes import DiagnosticKey, Outcome, diagnostic_sort, rejected
from .rows import RowIndex, row_index, row_key

__all__ = ["Evaluator", "Split", "joint_constraints", "leaves_of", "outcome_of", "split_constraints"]


class Split(Exception):
    """Raised when a test reads a dimension the cube is not uniform on: split it into ``inside`` and the rest."""

    __slots__ = ("index", "inside")

    def __init__(self, index: int, inside: frozenset) -> None:
        self.index = index
        self.inside = inside


_Compiled = tuple  # (decided-value tests, dimension tests) of one condition


class Evaluator:
    """One policy, evaluated on cubes of a given list of dimensions.

    A preference row decides with the rule id ``PREF[ARCH]``; on cubes it is the *template*
    ``PREF[{architecture}]`` (see :func:`canonical_rule`), so every architecture whose row gives
    the same value stays in one cube instead of one cube per architecture."""

    def __init__(self, policy: Policy, order: tuple[str, ...], dimensions: tuple[Dimension, ...], row_indexes: dict[int, RowIndex] | None = None) -> None:
        self.policy = policy
        self.diagnose = True
        self.read_rows = False
        """Whether the last :meth:`evaluate` looked up a preference row."""
        self.index = {d.name: i for i, d in enumerate(dimensions)}
        self.models: tuple[tuple[str | None, str | None], ...] = dimensions[0].values
        self.dimensions = dimensions
        self.plan: list[tuple[Any, ...]] = []  # one tuple per decision, unpacked by decide()
        for name in order:
            decision = policy.decisions[name]
            requirements = tuple((self._compile(r.when), r.value, r.id, _notice_key(r.notice, name)) for r in sorted(decision.requirements, key=lambda r: r.id))
            rows = None
            adopt = not_adopted = None
            if decision.preference is not None and decision.preference.rows:
                index = row_indexes[id(decision)] if row_indexes is not None else row_index(decision)
                rows = {m: row_key(decision, *m, index=index) for m in self.models}
                adopt = self._compile(decision.preference.adopt_when)
                not_adopted = _notice_key(decision.preference.on_not_adopted, name)
            conditionals = tuple((self._compile(r.when), r.value, r.id, _notice_key(r.notice, name)) for r in decision.conditionals)
            default = (decision.default.value, decision.default.id, _notice_key(decision.default.notice, name))
            self.plan.append((name, self.index[name], decision.undecided, requirements, rows, adopt, not_adopted, conditionals, default))
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
        self.constraints = tuple((self._compile(c.when), (c.id, c.severity, c.decision)) for c in sorted(policy.constraints, key=lambda c: c.id))
        self._owned = tuple((compiled, key, (True,)) for compiled, key in self.constraints)
        # Requested values this policy accepts (the other policy may know more values), and
        # features it does not declare (``resolve`` rejects a context that carries one).
        self.accepted = tuple((name, self.index[name], frozenset(policy.decisions[name].requests)) for name in order)
        self.undeclared = tuple(
            (d.name[len("feature:") :], i)
            for i, d in enumerate(dimensions)
            if d.name.startswith("feature:") and d.name[len("feature:") :] not in policy.features
        )

    def resolutions_only(self) -> Evaluator:
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

    def models_differing_from(self, other: Evaluator) -> frozenset | None:
        """The models on which ``other`` may resolve differently, when the two differ only in
        row keys (None when they differ elsewhere: then any model may)."""
        if self.dimensions != other.dimensions or self._shape() != other._shape():
            return None
        return frozenset(
            model for model in self.models if any(mine[4] is not None and mine[4][model] != theirs[4][model] for mine, theirs in zip(self.plan, other.plan))
        )

    def _compile(self, condition: Condition) -> _Compiled:
        """A condition as tests of decided values (never split) and tests of dimensions."""
        decided: list[tuple[str, frozenset[str], bool]] = []
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
            raise Split(index, current & accepted)
        return True

    def evaluate(self, cube: Cube) -> list[tuple[Cube, Outcome]]:
        """The outcome on ``cube``, as pieces of it on which it is constant; raises :class:`Split`
        when the cube must be split before that."""
        state = self.decide(cube)
        if isinstance(state, Outcome):
            return [(cube, state)]
        if not (self.diagnose and self.constraints):
            return [(cube, self.outcome(state, ()))]
        return [(piece, self.outcome(state, found)) for piece, (found,) in split_constraints(self._owned, cube, (state,))]

    def outcome(self, state: tuple[tuple, tuple, list[DiagnosticKey], dict[str, Any]], found: Iterable[DiagnosticKey]) -> Outcome:
        """The outcome of a decided state (see :meth:`decide`) with the constraints ``found``."""
        decided, rules, diags, _ = state
        order = _SORT_KEYS.__getitem__
        return Outcome(decided, rules, tuple(sorted([*diags, *found], key=order)))

    def finish(self, state: Any, found: Iterable[DiagnosticKey]) -> Outcome:
        """What :meth:`decide` returned, made an outcome with the constraints ``found``."""
        return state if isinstance(state, Outcome) else self.outcome(state, found)

    def decide(self, cube: Cube) -> Outcome | tuple[tuple, tuple, list[DiagnosticKey], dict[str, Any]]:
        """Every stage but the constraints: the outcome of a rejected context, or (values, deciding
        rules, diagnostics so far, the values by decision); raises :class:`Split`."""
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
                    raise Split(index, frozenset([min(requested, key=str)]))
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


def joint_constraints(first: Evaluator, second: Evaluator) -> tuple:
    """The constraints of two evaluators on the same dimensions, for :func:`split_constraints`
    with the states of both: a constraint both have (the same tests and key) once, owned by
    both; the others owned by theirs alone."""
    theirs, mine = second.constraints, first.constraints
    joint = [(compiled, key, (True, (compiled, key) in theirs)) for compiled, key in mine]
    joint += [(compiled, key, (False, True)) for compiled, key in theirs if (compiled, key) not in mine]
    return tuple(joint)


def split_constraints(constraints: tuple, cube: Cube, states: tuple[Any, ...], shared: bool = True) -> list[tuple[Cube, tuple[list[DiagnosticKey], ...]]]:
    """The constraints that hold for each decided state (see :meth:`Evaluator.decide`; an
    :class:`Outcome` for a rejected context, which no constraint reads), on the pieces of
    ``cube`` where every one of them is constant. ``constraints``: (compiled condition, key,
    owners), where owners says, per state, whether the state's policy has the constraint
    (:func:`joint_constraints`).

    Constraints come last and decide nothing, so where one splits the cube both parts keep
    everything decided so far (every earlier test was uniform on the whole cube): the pieces are
    split here instead of evaluating the whole policy again for each. They come out in the order
    that evaluating again would give (the part inside a test first). Two states of versions that
    differ only in rows share the constraints and split the cube once, for both; with ``shared``
    False, a constraint that applies to both (its tests of decided values pass for both) is left
    out: it holds for both or for neither on every context, so it never changes what differs.
    Two versions that differ elsewhere too decide each cube together the same way, each state
    reading only its own policy's constraints."""
    # Tests of decided values, and tests the whole cube passes or fails, are the same on every
    # piece: read them once, and split only on the rest.
    width = len(states)
    always: tuple[list[DiagnosticKey], ...] = tuple([] for _ in states)
    active = []
    for (decided, tests), key, owners in constraints:
        applies = tuple(
            owner and not isinstance(state, Outcome) and not any((state[3][subject] in accepted) is negate for subject, accepted, negate in decided)
            for owner, state in zip(owners, states)
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


class _SortKeys(dict):
    """:func:`diagnostic_sort` of each diagnostic, remembered (a dict lookup sorts faster than a
    Python key function: a diff sorts hundreds of thousands of them)."""

    def __missing__(self, key: DiagnosticKey) -> tuple[str, str, str]:
        value = self[key] = diagnostic_sort(key)
        return value


_SORT_KEYS = _SortKeys()


_OFF = frozenset([False])


def outcome_of(policy_set: Any, ctx: dict[str, Any]) -> Outcome:
    """The reference outcome of a normalised context, by the engine's own evaluator, as
    :class:`Outcome` (for tests and benchmarks; the diff itself never evaluates points)."""
    for name in policy_set.decisions:
        decision = policy_set.policy.decisions[name]
        if ctx[name] not in decision.requests:
            return rejected(name)
    if not ctx["features"] <= policy_set.features:
        return rejected("features")
    values, decided_by, diagnostics = policy_set.outcome(dict(ctx))
    return Outcome.of(values, decided_by, diagnostics, ctx["architecture"])


def _notice_key(notice: Any, decision: str) -> DiagnosticKey | None:
    return None if notice is None else (notice.id, notice.severity, decision)


def _member(cube: Cube, index: int, accepted: frozenset) -> bool:
    current = cube[index]
    if current <= accepted:
        return True
    if current.isdisjoint(accepted):
        return False
    raise Split(index, current & accepted)


def _uniform(cube: Cube, index: int, mapping: dict[Any, Any]) -> Any:
    """``mapping`` of the cube's values on a dimension, when it is the same for all of them."""
    current = cube[index]
    first = mapping[next(iter(current))]
    if len(current) > 1:
        same = frozenset(v for v in current if mapping[v] == first)
        if len(same) != len(current):
            raise Split(index, same)
    return first


def leaves_of(cube: Cube, evaluate: Any) -> Iterator[tuple[Any, ...]]:
    """The pieces ``evaluate`` (say, :meth:`Evaluator.evaluate`) returns for ``cube``, splitting it
    where it raises :class:`Split` and evaluating both parts again, the part inside first. Each
    piece is as ``evaluate`` makes it: (cube, outcome), or (cube, outcome, other) for two versions."""
    stack = [cube]
    while stack:
        current = stack.pop()
        try:
            pieces = evaluate(current)
        except Split as split:
            i = split.index
            rest = current[i] - split.inside
            stack.append(current[:i] + (rest,) + current[i + 1 :])
            stack.append(current[:i] + (split.inside,) + current[i + 1 :])
            continue
        yield from pieces
