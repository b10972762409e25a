"""The diff is exact: brute force over every point of the domain agrees with the reported groups."""

from __future__ import annotations

import itertools
import random
import tomllib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import tomlkit

import kvpolicy
from kvpolicy.analyse.cubes import points
from kvpolicy.analyse.describe import architectures_of
from kvpolicy.analyse.diff import diff_policies
from kvpolicy.analyse.evaluators import outcome_of
from kvpolicy.analyse.outcomes import Change, resolution_key
from kvpolicy.read.loader import parse_policy

from tests.support.domain import context_of
from tests.support.strategies import MODEL_TYPES, RANDOM_ARCHITECTURES, policies


def expand(cube: Any) -> Any:
    return itertools.product(*(sorted(values, key=repr) for values in cube))


def clause_points(clauses: Any, width: int) -> set[tuple[Any, ...]]:
    """Every point the clauses describe (one alternative of every clause)."""
    found: set[tuple[Any, ...]] = set()
    for choice in itertools.product(*(clause.alternatives for clause in clauses)):
        axes: list[Any] = [None] * width
        for clause, alternative in zip(clauses, choice):
            for dim, values in zip(clause.dims, alternative):
                axes[dim] = values
        found.update(expand(axes))
    return found


def check_sections(result: Any, outcomes: dict[tuple[Any, ...], Any] | None = None) -> None:
    """Sections describe their groups exactly, and say exactly where each diagnostic comes and
    goes; with ``outcomes`` (point -> (old, new)), descriptions by decided values are checked too."""
    width = len(result.dimensions)
    for section in result.sections():
        inside = {p for g in section.groups for c in g.cubes for p in expand(c)}
        assert len(inside) == section.count
        assert {p for c in section.cubes for p in expand(c)} == inside
        assert clause_points(section.clauses, width) == inside
        if section.by_values is not None and outcomes is not None:
            described = {
                p
                for p, (first, second) in outcomes.items()
                if all(v in r for v, r in zip(p, section.by_values.restriction))
                and resolution_key(first, section.by_values.with_rules) in section.by_values.resolved
                and (
                    not section.by_values.both
                    or resolution_key(second, section.by_values.with_rules) == resolution_key(first, section.by_values.with_rules)
                )
            }
            assert described == inside
        for change in section.diagnostics:
            attribute = "added" if change.sign == "+" else "removed"
            expected = {
                p for g in section.groups if change.diagnostic in getattr(g.change, attribute) for c in g.cubes for p in expand(c)
            }
            assert len(expected) == change.count
            if change.restriction is not None:
                assert {p for p in inside if all(v in r for v, r in zip(p, change.restriction))} == expected
            elif change.clauses is not None:
                assert clause_points(change.clauses, width) == expected
            else:
                assert expected == inside


def check_exact(old: kvpolicy.PolicySet, new: kvpolicy.PolicySet) -> Any:
    """Every point that changes is in exactly one group, of the right change; no other point is."""
    result = diff_policies(old, new)
    reported: dict[tuple[Any, ...], Change] = {}
    for group in result.groups:
        covered = 0
        for cube in group.cubes:
            for point in expand(cube):
                assert point not in reported, f"cubes overlap at {point}"
                reported[point] = group.change
                covered += 1
        assert covered == group.count
        # The clauses describe the same set as the cubes.
        assert clause_points(group.clauses, len(result.dimensions)) == {p for c in group.cubes for p in expand(c)}
    changed = 0
    outcomes = {}
    for point in points(result.dimensions):
        ctx = context_of(result.dimensions, point)
        first, second = outcome_of(old, ctx), outcome_of(new, ctx)
        outcomes[point] = (first, second)
        if first == second:
            assert point not in reported, f"unchanged context reported: {ctx}"
        else:
            changed += 1
            assert reported.get(point) == Change.between(first, second), f"missed or wrong: {ctx}"
    assert changed == len(reported) == result.changed
    check_sections(result, outcomes)
    return result


def _load(text: str, name: str) -> kvpolicy.PolicySet:
    return kvpolicy.PolicySet(parse_policy(text.encode(), name))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies("2026.01.01"), policies("2026.02.01"), st.booleans())
def test_diff_is_exact_for_random_policies(old_text: str, new_text: str, same: bool) -> None:
    old = _load(old_text, "old.toml")
    new = _load(old_text if same else new_text, "new.toml")
    result = check_exact(old, new)
    check_leaves(result, old, new)
    if same:
        assert not result


def check_leaves(result: Any, old: kvpolicy.PolicySet, new: kvpolicy.PolicySet) -> None:
    """``leaves`` partitions the whole domain into cubes on which both versions are constant,
    with the outcomes brute force finds, and ``leaf_groups`` names each changed leaf's group."""
    seen: set[tuple[Any, ...]] = set()
    for (cube, first, second), group in zip(result.leaves, result.leaf_groups, strict=True):
        for point in expand(cube):
            assert point not in seen, f"leaves overlap at {point}"
            seen.add(point)
            ctx = context_of(result.dimensions, point)
            assert (outcome_of(old, ctx), outcome_of(new, ctx)) == (first, second), ctx
        assert (group == -1) == (first == second)
        if group != -1:
            assert result.groups[group].change == Change.between(first, second)
    assert len(seen) == result.total


@st.composite
def row_edits(draw: Any, text: str) -> str:
    """``text`` with only its preference rows edited: values flipped, rows added, dropped or
    qualified by model_type (the case the diff evaluates only where rows changed)."""
    data = tomllib.loads(text)
    data["version"] = "2026.02.01"
    for decision in data["decisions"].values():
        values = decision["values"]
        preference = decision.get("preference")
        if preference is None:
            continue
        rows = []
        taken: set[tuple[str, str | None]] = set()
        for row in preference["rows"]:
            action = draw(st.sampled_from(("keep", "keep", "flip", "drop", "qualify")))
            if action == "flip":
                row = {**row, "value": draw(st.sampled_from(values))}
            elif action == "qualify":
                row = {**row, "model_type": MODEL_TYPES[0]}
            key = (row["architecture"], row.get("model_type"))
            # A qualified row may meet one already there: the loader refuses an architecture listed twice.
            if action != "drop" and key not in taken:
                rows.append(row)
                taken.add(key)
        for architecture in RANDOM_ARCHITECTURES:
            if (architecture, None) not in taken and draw(st.integers(0, 3)) == 0:
                rows.append({"architecture": architecture, "value": draw(st.sampled_from(values))})
        if rows:
            preference["rows"] = rows
        else:
            del decision["preference"]
    return tomlkit.dumps(data)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_diff_is_exact_when_only_preference_rows_change(data: Any) -> None:
    """Where two versions differ only in rows, the diff evaluates only the models whose rows
    changed; it must still be exact, and its leaves, read later, must still cover the domain."""
    old_text = data.draw(policies("2026.01.01"))
    old = _load(old_text, "old.toml")
    new = _load(data.draw(row_edits(old_text)), "new.toml")
    result = check_exact(old, new)
    check_leaves(result, old, new)


def test_rows_only_edit_evaluates_only_the_changed_models() -> None:
    """A flipped row of the shipped policy: the evaluated part holds that architecture only, and
    the rest of the domain is left for when something reads it."""
    from kvpolicy.read.loader import shipped_root

    old = kvpolicy.load(version="2026.09.10")
    text = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")
    row = '{ architecture = "LlamaForCausalLM", value = "PYTHON"'
    assert text.count(row) == 1
    newer = text.replace(row, '{ architecture = "LlamaForCausalLM", value = "CPP"')
    new = _load(newer.replace('version = "2026.09.10"', 'version = "2026.09.11"'), "new.toml")
    result = diff_policies(old, new)
    assert result.groups and result.unchanged is not None
    index = [d.name for d in result.dimensions].index("model")
    evaluated_architectures = {model[0] for cube, _, _ in result.evaluated for model in cube[index]}
    assert evaluated_architectures == {"LlamaForCausalLM"}
    assert {a for g in result.groups for a in architectures_of(g, result.dimensions)} == {"LlamaForCausalLM"}
    assert "leaves" not in result.__dict__  # nothing has read the rest yet
    assert sum(size(cube) for cube, _, _ in result.leaves) == result.total


def size(cube: Any) -> int:
    count = 1
    for values in cube:
        count *= len(values)
    return count


VERSIONS = tuple(kvpolicy.load().versions())
#: Every adjacent pair (each one upstream change), and the whole history at once.
PAIRS = [*zip(VERSIONS, VERSIONS[1:]), (VERSIONS[0], VERSIONS[-1])]


@pytest.mark.parametrize("old_version, new_version", PAIRS)
def test_diff_of_shipped_versions_samples(old_version: str, new_version: str) -> None:
    """The shipped domains are too large to brute-force in a unit test: check random points,
    and random points of every group."""
    old, new = kvpolicy.load(version=old_version), kvpolicy.load(version=new_version)
    result = diff_policies(old, new)
    rng = random.Random(f"{old_version}{new_version}")
    samples = [tuple(rng.choice(d.values) for d in result.dimensions) for _ in range(400)]
    for group in result.groups:
        for _ in range(20):
            cube = rng.choice(group.cubes)
            samples.append(tuple(rng.choice(sorted(values, key=repr)) for values in cube))
    for point in samples:
        ctx = context_of(result.dimensions, point)
        first, second = outcome_of(old, ctx), outcome_of(new, ctx)
        group = result.group_of(point)
        if first == second:
            assert group is None, ctx
        else:
            assert group is not None and group.change == Change.between(first, second), ctx


# Checking a section expands its cubes point by point: two pairs of moderate size, one early and
# one late (the random policies above check sections exactly on every run).
@pytest.mark.parametrize("old_version, new_version", [("2026.07.09", "2026.08.11"), ("2026.09.02", "2026.09.10")])
def test_sections_of_shipped_versions_are_exact(old_version: str, new_version: str) -> None:
    check_sections(diff_policies(kvpolicy.load(version=old_version), kvpolicy.load(version=new_version)))


def test_a_value_only_one_version_accepts_is_reported_as_rejected() -> None:
    from kvpolicy.read.loader import shipped_root

    text = (shipped_root() / "2026.08.24.toml").read_text(encoding="utf-8")
    newer = text.replace('values = ["NIXL", "UCX", "MPI", "MOONCAKE"]', 'values = ["NIXL", "UCX", "MPI", "MOONCAKE", "LIBFABRIC"]')
    assert newer != text
    old, new = _load(text, "old.toml"), _load(newer.replace('version = "2026.08.24"', 'version = "2026.08.25"'), "new.toml")
    result = diff_policies(old, new)
    assert result.groups
    for group in result.groups:
        assert group.change.removed == (("unknown-value", "error", "backend"),)
        for cube in group.cubes:
            assert cube[1] == frozenset(["LIBFABRIC"])


def test_a_feature_only_the_new_version_declares_is_reported_as_rejected_before() -> None:
    from kvpolicy.read.loader import shipped_root

    text = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")
    newer = text.replace(
        "[features.serialized_state]",
        '[features.kda_state]\ndescription = "Recurrent KDA state."\n\n'
        '[[decisions.transceiver_runtime.requirement]]\nid = "kda-requires-python"\n'
        'when = { features.kda_state = true }\nvalue = "PYTHON"\n\n[features.serialized_state]',
        1,
    ).replace('version = "2026.09.10"', 'version = "2026.09.11"')
    old, new = _load(text, "old.toml"), _load(newer, "new.toml")
    result = diff_policies(old, new)
    names = [d.name for d in result.dimensions]
    kda = names.index("feature:kda_state")
    assert result.groups
    for group in result.groups:
        assert group.change.removed == (("unknown-value", "error", "features"),)
        assert all(cube[kda] == frozenset([True]) for cube in group.cubes)
