"""Exactly where two policy versions resolve differently, grouped so a person can read it.

:func:`diff_policies` takes the joint partition of the two versions' input domain
(:mod:`kvpolicy.analyse.partition`, over the symbolic evaluators of
:mod:`kvpolicy.analyse.evaluators`): cubes on which both are constant, the changed ones exactly
where they resolve differently.

Changed cubes are grouped by *how* they change (the values, deciding rules and diagnostics that
differ) and merged into as few cubes as a greedy merge finds; every cube describes exactly the
contexts in it, so every printed line is true of every context it names and of no other. Where a
group is a product (say, of some architectures and backends with some feature combinations), it
is also written as one: clauses of alternatives. :meth:`Diff.sections` gathers the groups whose
decisions change alike and says where, within them, each diagnostic comes or goes; where the
contexts of a section read shorter by what they resolve to, it says that instead
(:class:`kvpolicy.analyse.outcomes.ByValues`). The words are :mod:`kvpolicy.analyse.describe`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..evaluate.domain import Dimension, Domain, domain_of
from ..read.model import Policy
from .cubes import Cube, bounding_box, cube_order, intersect, merge, size_of
from .describe import Seen, checkpoint_rule_changes, describe_clauses, describe_resolved
from .edit import PolicyEdit, edit_between
from .outcomes import ByValues, Change, Clause, DiagnosticChange, Group, Outcome, Section, diagnostic_sort, resolution_key
from .partition import Unchanged, evaluate_cubes, partition, policy_and_order

__all__ = ["Diff", "diff_policies"]


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
    preference rows; see :func:`kvpolicy.analyse.partition.partition`). Their outcomes are exact
    in values and deciding rules; diagnostics that both versions share may be left out."""
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
        """The groups gathered by how their decisions change (see :class:`kvpolicy.analyse.outcomes.Section`)."""
        return list(self._sections)

    @cached_property
    def _sections(self) -> tuple[Section, ...]:
        return tuple(_sections(self))

    @cached_property
    def outcomes(self) -> frozenset[Outcome]:
        """Every distinct outcome either version has anywhere in the domain."""
        return frozenset(o for _, first, second in self.leaves for o in (first, second))

    def leaf_keys(self, with_rules: bool) -> list[tuple[Any, Any]]:
        """(OLD, NEW) resolution keys of every leaf (see
        :func:`kvpolicy.analyse.outcomes.resolution_key`), computed once."""
        cache = self.__dict__.setdefault("_leaf_keys", {})
        if with_rules not in cache:
            keys = {o: resolution_key(o, with_rules) for o in self.outcomes}
            cache[with_rules] = [(keys[first], keys[second]) for _, first, second in self.leaves]
        return cache[with_rules]

    def evaluated_keys(self, with_rules: bool) -> list[tuple[Any, Any]]:
        """(OLD, NEW) resolution keys of every evaluated leaf, computed once per diff. Equal keys are
        one object (a leaf's outcomes are shared among leaves), so callers may compare them with ``is``:
        every section asks, and hashing each leaf's outcomes again cost seconds on structural diffs."""
        cache = self.__dict__.setdefault("_evaluated_keys", {})
        if with_rules not in cache:
            by_id: dict[int, Any] = {}
            interned: dict[Any, Any] = {}
            pairs = []
            for _, first, second in self.evaluated:
                keys = []
                for outcome in (first, second):
                    key = by_id.get(id(outcome))
                    if key is None:
                        key = resolution_key(outcome, with_rules)
                        key = by_id[id(outcome)] = interned.setdefault(key, key)
                    keys.append(key)
                pairs.append((keys[0], keys[1]))
            cache[with_rules] = pairs
        return cache[with_rules]

    def resolutions_seen(self, with_rules: bool) -> Seen:
        """Per decision, every (value, rule) either version decides anywhere, and the rules of each
        value (rules None unless ``with_rules``): what :func:`kvpolicy.analyse.describe.describe_resolved`
        reads, computed once per diff."""
        cache = self.__dict__.setdefault("_resolutions_seen", {})
        if with_rules not in cache:
            every: dict[str, set[Any]] = {}
            rules_of: dict[tuple[str, Any], set[Any]] = {}
            keys = {key for pair in self.evaluated_keys(with_rules) for key in pair}
            if self.unchanged is not None:
                keys |= self.unchanged.resolution_keys(with_rules)
            for key in keys:
                for name, value, rule in key:
                    every.setdefault(name, set()).add((value, rule))
                    rules_of.setdefault((name, value), set()).add(rule)
            cache[with_rules] = (every, rules_of)
        return cache[with_rules]

    def group_of(self, point: tuple[Any, ...]) -> Group | None:
        """The group holding a point, or None when it does not change."""
        for group in self.groups:
            for cube in group.cubes:
                if self.contains(cube, point):
                    return group
        return None


def _sections(result: Diff) -> list[Section]:
    # Groups whose decisions change alike share a section; where only diagnostics change, each
    # way they change is its own section (they rarely have anything else in common).
    by_decisions: dict[Any, list[Group]] = {}
    for group in result.groups:
        by_decisions.setdefault(group.change.decisions or group.change, []).append(group)
    blocks = _blocks(result.dimensions)
    sections = []
    for decisions, groups in by_decisions.items():
        cubes = merge([c for g in groups for c in g.cubes])
        count = sum(g.count for g in groups)
        box = bounding_box(cubes)
        changes = []
        for sign, attribute in (("+", "added"), ("-", "removed")):
            keys = sorted({d for g in groups for d in getattr(g.change, attribute)}, key=diagnostic_sort)
            for key in keys:
                members = [g for g in groups if key in getattr(g.change, attribute)]
                subset = [c for g in members for c in g.cubes]
                subset_count = sum(g.count for g in members)
                if subset_count == count:
                    changes.append(DiagnosticChange(sign, key, subset_count))
                    continue
                restriction = bounding_box(subset)
                if sum(size_of(intersect(c, restriction)) for c in cubes) == subset_count:
                    # Show only what narrows the section: full on every dimension the section
                    # already bounds the same way.
                    shown = tuple(r if r != b else frozenset(d.values) for r, b, d in zip(restriction, box, result.dimensions))
                    changes.append(DiagnosticChange(sign, key, subset_count, restriction=shown))
                else:
                    merged = merge(subset)
                    changes.append(DiagnosticChange(sign, key, subset_count, clauses=_factor(merged, blocks)))
        clauses = _factor(cubes, blocks)
        by_values = None
        outcomes = frozenset().union(*(g.resolved for g in groups))
        lines = sum(len(alternatives) for alternatives in describe_clauses(clauses, result.dimensions))
        both = not groups[0].change.decisions
        for with_rules in (False, True):
            if lines <= 2:
                break
            indices = {result.groups.index(g) for g in groups}
            candidate = _by_values(result, cubes, indices, outcomes, with_rules, both)
            if candidate is not None:
                size = len(describe_resolved(candidate, result.resolutions_seen(with_rules))) + 1
                if size < lines:
                    by_values, lines = candidate, size
        key = decisions if isinstance(decisions, tuple) else ()
        sections.append(Section(key, tuple(groups), tuple(cubes), count, clauses, tuple(changes), by_values))
    return sections


def _by_values(result: Diff, cubes: list[Cube], members: set[int], outcomes: frozenset, with_rules: bool, both: bool) -> ByValues | None:
    """The contexts as (a cube of inputs) x (what OLD, or both versions alike, resolve), if exact.

    The contexts of a box that resolve so are exactly the section's when the box holds the whole
    section (the bounding box does, and widening keeps it) and no *other* context that resolves
    so lies in the box. Start from the bounding box and widen one dimension at a time to every
    value while that holds: widening a dimension adds the slab of the box's complement on it,
    and is refused when some other context resolving alike lies in that slab."""
    resolved = {resolution_key(o, with_rules) for o in outcomes}
    found: dict[int, bool] = {}  # by id of a key: whether it is one of ``resolved``
    others = []
    for (cube, _, _), (first, second), group in zip(result.evaluated, result.evaluated_keys(with_rules), result.evaluated_groups):
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

    box = list(bounding_box(cubes))
    if alike_in(tuple(box)):
        return None  # another context resolving alike lies in the box: not exact
    for index in reversed(range(len(box))):
        full = frozenset(result.dimensions[index].values)
        if box[index] == full:
            continue
        if not alike_in((*box[:index], full - box[index], *box[index + 1 :])):
            box[index] = full
    return ByValues(tuple(box), tuple(sorted(resolved, key=repr)), with_rules, both)


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
        shapes = {frozenset(merge(alternatives)) for alternatives in table.values()}
        if len(shapes) != 1:
            continue
        (shape,) = shapes
        clauses.append(Clause(tuple(rest[p] for p in inside), tuple(sorted(shape, key=cube_order))))
        current = merge(list(table))
        rest = tuple(rest[p] for p in outside)
    clauses.insert(0, Clause(rest, tuple(current)))
    return tuple(clauses)


def diff_policies(old: Any, new: Any) -> Diff:
    """Every context on which two policies (``Policy`` or ``PolicySet``) resolve differently."""
    old_policy, _ = policy_and_order(old)
    new_policy, _ = policy_and_order(new)
    domain = domain_of(old_policy, new_policy)
    dimensions = domain.dimensions()
    by_change: dict[Change, list[Cube]] = {}
    resolved: dict[Change, set[Any]] = {}
    memo: dict[tuple[Outcome, Outcome], Change | None] = {}
    evaluated, unchanged = partition(old, new, domain, shared=False)
    leaves = tuple(evaluated)
    leaf_changes = []
    for cube, first, second in leaves:
        key = (first, second)
        if key in memo:
            change = memo[key]
        else:
            change = memo[key] = None if first == second else Change.between(first, second)
        leaf_changes.append(change)
        if change is not None:
            by_change.setdefault(change, []).append(cube)
            resolved.setdefault(change, set()).add(first)
    groups = []
    blocks = _blocks(dimensions)
    for change, cubes in by_change.items():
        merged = merge(cubes)
        groups.append(Group(change, tuple(merged), sum(size_of(c) for c in merged), _factor(merged, blocks), frozenset(resolved[change])))
    # Value changes first; groups with the same decision change next to each other.
    groups.sort(key=lambda g: (not g.change.values_change, [str(d) for d in g.change.decisions], not g.change.starts_failing, -g.count, g.change.summary()))
    total = size_of(tuple(frozenset(d.values) for d in dimensions))
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
