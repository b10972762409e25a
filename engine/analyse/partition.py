"""The input domain of two policy versions partitioned into cubes on which both are constant.

Both versions decide each cube together (see :mod:`kvpolicy.analyse.evaluators`): a cube is split
where either reads a dimension it is not uniform on, and then the constraints of both are split once,
each version reading its own (:func:`~kvpolicy.analyse.evaluators.joint_constraints`). That gives
cubes on which both are constant; those where they differ are the change, exactly. (Evaluating NEW
inside every leaf of OLD gives the same change on 35x more cubes: OLD's constraint pieces cut NEW's
cubes even where NEW has the same constraint.)

Two refinements keep the cost near what changed. Models that both policies cannot tell apart are
evaluated once, as one class (:func:`model_classes`). And when two versions differ only in
preference rows (the usual edit), only the models whose rows differ are evaluated jointly; the rest,
where they provably resolve alike, is evaluated only if a description asks about it
(:class:`Unchanged`; see :func:`partition`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..evaluate.domain import Dimension, Domain, domain_of
from ..read.model import Condition, Policy
from .cubes import Cube
from .evaluators import Evaluator, joint_constraints, leaves_of, split_constraints
from .outcomes import Outcome, resolution_key
from .rows import RowIndex, row_index, row_key

__all__ = ["Unchanged", "evaluate_cubes", "model_classes", "partition", "policy_and_order"]


def evaluate_cubes(old: Any, new: Any, domain: Domain | None = None) -> Iterator[tuple[Cube, Outcome, Outcome]]:
    """Partition the joint domain of two policies (``Policy`` or ``PolicySet``) into cubes on
    which both are constant: (cube, old outcome, new outcome), cubes aligned with
    ``domain.dimensions()``."""
    evaluated, unchanged = partition(old, new, domain)
    yield from evaluated
    if unchanged is not None:
        yield from unchanged.leaves()


def partition(old: Any, new: Any, domain: Domain | None, *, shared: bool = True) -> tuple[Iterator[tuple[Cube, Outcome, Outcome]], Unchanged | None]:
    """The joint partition in two parts: leaves where the versions may differ, evaluated with
    both, and (when there is one) a function giving the leaves of the rest, where they provably
    resolve alike, evaluated with OLD alone.

    When two versions differ only in preference rows (the common edit, and a 10,000-row file
    with 1% of rows changed), their evaluators are the same function of everything but a model's
    row keys: every other part they read compiles to equal tests and values. On a model whose
    row keys are equal in both, the two therefore return equal outcomes on every cube, so only the
    models whose row keys differ need the joint evaluation; the cost follows the rows that
    changed, not the size of the policies.

    With ``shared`` False, the outcomes leave out the diagnostics of a constraint both versions
    have where it applies to both: the changes are the same, on far fewer cubes
    (what :func:`kvpolicy.analyse.diff.diff_policies` needs; :func:`evaluate_cubes` gives whole
    outcomes)."""
    old, old_order = policy_and_order(old)
    new, new_order = policy_and_order(new)
    domain = domain or domain_of(old, new)
    dimensions = domain.dimensions()
    row_indexes = _row_indexes_of((old, new))
    members, reduced = model_classes((old, new), dimensions, row_indexes)
    first = Evaluator(old, old_order, reduced, row_indexes)
    second = Evaluator(new, new_order, reduced, row_indexes)
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

    constraints = joint_constraints(first, second) if first.diagnose else ()

    def both(cube: Cube) -> list[tuple[Cube, Outcome | None, Outcome | None]]:
        # Decide with both, and split the constraints of both once.
        mine = first.decide(cube)
        if differ is not None and not first.read_rows:
            # Versions that differ only in rows, and OLD read no row here: NEW takes the very
            # same steps, so they agree on all of the cube. Its constraints are split only if
            # something reads the region.
            return [(cube, None, None)]
        theirs = second.decide(cube)
        if not constraints:
            return [(cube, first.finish(mine, ()), second.finish(theirs, ()))]
        return [
            (piece, first.finish(mine, found), second.finish(theirs, other))
            for piece, (found, other) in split_constraints(constraints, cube, (mine, theirs), shared)
        ]

    def evaluated() -> Iterator[tuple[Cube, Outcome, Outcome]]:
        if not joint:
            return
        for cube, outcome, other in leaves_of((joint, *rest), both):
            if outcome is None:
                region.append(cube)
            else:
                yield (expand(cube[0]), *cube[1:]), outcome, other

    return evaluated(), Unchanged(first, region, members, expand)


class Unchanged:
    """The part of a joint domain where two versions provably resolve alike (see
    :func:`partition`), evaluated with OLD, and only as far as a question needs."""

    def __init__(self, evaluator: Evaluator, cubes: list[Cube], members: dict[Any, frozenset], expand: Callable) -> None:
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
            for cube, outcome in leaves_of(region, self._evaluator.evaluate):
                yield (self._expand(cube[0]), *cube[1:]), outcome, outcome

    def _resolutions(self, within: Cube | None) -> Iterator[Outcome]:
        for region in self._cubes:
            if within is not None:
                models = frozenset(r for r in region[0] if not self._members[r].isdisjoint(within[0]))
                region = (models, *(a & b for a, b in zip(region[1:], within[1:])))
                if not all(region):
                    continue
            for _, outcome in leaves_of(region, self._resolver.evaluate):
                yield outcome

    def resolution_keys(self, with_rules: bool) -> frozenset:
        """Every resolution (see :func:`kvpolicy.analyse.outcomes.resolution_key`) of a context of
        the region."""
        if with_rules not in self._keys:
            self._keys[with_rules] = frozenset(resolution_key(o, with_rules) for o in self._resolutions(None))
        return self._keys[with_rules]

    def resolves_in(self, within: Cube, keys: set, with_rules: bool) -> bool:
        """Whether some context of the region inside ``within`` resolves to one of ``keys``."""
        return any(resolution_key(o, with_rules) in keys for o in self._resolutions(within))


def _conditions(policy: Policy) -> Iterator[Condition]:
    """Every condition of a policy."""
    for decision in policy.decisions.values():
        for rule in (*decision.requirements, *decision.conditionals, decision.default, *decision.adjustments):
            yield rule.when
        if decision.preference is not None:
            yield decision.preference.adopt_when
    for constraint in policy.constraints:
        yield constraint.when


def _row_indexes_of(policies: tuple[Policy, ...]) -> dict[int, RowIndex]:
    """:func:`row_index` of every decision with preference rows, by ``id`` of the decision (the
    policies must outlive the result)."""
    return {
        id(decision): row_index(decision)
        for policy in policies
        for decision in policy.decisions.values()
        if decision.preference is not None and decision.preference.rows
    }


def model_classes(
    policies: tuple[Policy, ...], dimensions: tuple[Dimension, ...], row_indexes: dict[int, RowIndex] | None = None
) -> tuple[dict[Any, frozenset], tuple[Dimension, ...]]:
    """The models both policies cannot tell apart, as classes: (members of each class by its
    representative, the dimensions with one representative per class on the model dimension).

    The evaluators read a model only through the architecture and model_type tests of conditions
    and through its preference row (value and canonical rule id), so models that agree on all of
    those behave identically in both policies: evaluating one representative per class is exact,
    and the number of leaves no longer grows with the number of rows."""
    models: tuple[tuple[str | None, str | None], ...] = dimensions[0].values
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
            tuple(row_key(decision, *model, index=index) for decision, index in indexes),
            tuple(matcher.matches(model[position]) for position, matcher in tests),
        )
        classes.setdefault(signature, []).append(model)
    members = {group[0]: frozenset(group) for group in classes.values()}
    reduced = (Dimension(dimensions[0].name, tuple(m for m in models if m in members)), *dimensions[1:])
    return members, reduced


def policy_and_order(item: Any) -> tuple[Policy, tuple[str, ...]]:
    """The policy of a ``Policy`` or ``PolicySet``, and an order of its decisions in which every
    input comes first (the policy set's own, when it has one)."""
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
