"""The analysis is exactly what its frozen, enumerate-everything predecessor returned.

``tests/lint/analysis_oracle.py`` is ``analyse`` as it was before its constraints stage was made
lazy: that stage tested every constraint in every combination of the free inputs of every final
state and kept every witness. Here both run on every shipped policy, on a policy built to hold
every case the lazy stage tells apart (ties, blocks of inputs, adjustments), and on generated
ones (the shared random policies, and richer ones with adjustments and features tied to
variables), and their results must be identical: every rule's witnesses, every constraint's and
conflict's, every KVP030 family with all its witnesses in order and their number, the row
classes, the state count, the order of every dict and of every witness's keys, and the refusal
(KVP029) where a budget is exceeded. What KVP030 reads (the first 64 witnesses of a family in a
stable sort by size) is compared through the path that builds only those.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kvpolicy.errors import PolicyError
from kvpolicy.lint import precedence
from kvpolicy.read.loader import parse_policy, shipped_root

from tests.support.strategies import policies
from tests.lint import analysis_oracle
from tests.lint.analysis_oracle import oracle_analyse
from tests.support.policies import three_decisions

SHIPPED = sorted(p for p in shipped_root().glob("*.toml") if not p.name.endswith(".cases.toml"))


def _witness(w: dict[str, Any] | None) -> Any:
    return None if w is None else list(w.items())  # key order included


def _snapshot(result: Any) -> dict[str, Any]:
    """Everything an analysis holds, as plain data (dict orders and witness key orders kept)."""
    return {
        "rules": [(k, _witness(s.held), _witness(s.decided)) for k, s in result.rules.items()],
        "constraints": [(k, _witness(w)) for k, w in result.constraints.items()],
        "conflicts": [(k, _witness(w)) for k, w in result.conflicts.items()],
        "rejected": [(k, len(ws), [_witness(w) for w in ws]) for k, ws in result.rejected.items()],
        "row_classes": [(k, [(r.id, r.architecture, r.model_type, r.value) for r in rows]) for k, rows in result.row_classes.items()],
        "representative": list(result.representative.items()),
        "states": result.states,
    }


def _run(function: Any, policy: Any) -> tuple[Any, Any]:
    """(result, its snapshot), or (None, the refusal)."""
    try:
        result = function(policy)
    except (precedence.AnalysisLimit, analysis_oracle.AnalysisLimit) as exc:
        return None, ("refused", str(exc))
    return result, _snapshot(result)


def _assert_same(policy: Any) -> None:
    oracle, expected = _run(oracle_analyse, policy)
    result, got = _run(precedence.analyse, policy)
    if isinstance(expected, dict) and isinstance(got, dict):
        for part in expected:  # part by part, for a readable failure
            assert got[part] == expected[part], part
    assert got == expected
    if result is None:
        return
    # What KVP030 reads: the first 64 of a stable sort by size, given without sorting them all.
    for family, witnesses in result.rejected.items():
        want = sorted(oracle.rejected[family], key=lambda w: w.get("#size", 0))[:64]
        assert [_witness(w) for w in witnesses.smallest(64)] == [_witness(w) for w in want], family


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_same_result_as_the_oracle_on_shipped_policies(path: Path) -> None:
    _assert_same(parse_policy(path.read_bytes(), str(path)))


#: Every case the constraints stage distinguishes, in one policy: free at the constraints, the
#: model type (options of weight 0: ties for the smallest witness, among firing assignments and
#: among the others), f4 with E4, the variable that turns it on (one block, outside the group of
#: the constraints that do not read them), and E3 whose options depend on f3, decided before
#: (a block its state restricts); variable values of equal weight where an adjustment decides;
#: the architecture decided before, so that a constraint fires as small in several states; two
#: adjustments first deciding in one state.
TIES_AND_BLOCKS = three_decisions(
    summary="ties and blocks",
    features={"f1": None, "f3": "E3", "f4": "E4"},
    backend_auto="DEFAULT",
    runtime_default="PYTHON",
    runtime_inputs=["backend"],
    manager_inputs=["backend", "transceiver_runtime"],
    backend="""
[[decisions.backend.conditional]]
id = "backend-env"
when = { env = { E1 = "1" } }
value = "UCX"
""",
    runtime="""
[[decisions.transceiver_runtime.conditional]]
id = "runtime-f3"
when = { features = { f3 = true } }
value = "CPP"

[[decisions.transceiver_runtime.adjustment]]
id = "runtime-adjusted"
when = { features = { f1 = true } }
value = "CPP"
""",
    manager="""
[decisions.kv_cache_manager.preference]
id = "manager-preference"
rows = [{ architecture = "ArchA", value = "V2" }, { architecture = "ArchB", value = "V1" }]

[[decisions.kv_cache_manager.adjustment]]
id = "manager-adjusted"
when = { env = { E5 = ["x", "y"] } }
value = "V2"
""",
) + """
[[constraints]]
id = "a-model-type"
severity = "error"
when = { model_type = ["t1", "t2"], transceiver_runtime = "PYTHON" }
message = "no"
fix = "no"

[[constraints]]
id = "b-cancel"
severity = "error"
when = { features = { f4 = true }, transceiver_runtime = "PYTHON" }
message = "no"
fix = "no"

[[constraints]]
id = "c-variable-set"
severity = "error"
when = { env = { E4 = { not = "" } }, kv_cache_manager = "V1" }
message = "no"
fix = "no"

[[constraints]]
id = "d-warning"
severity = "warning"
when = { kv_cache_manager = "V2", backend = "UCX", env = { E4 = ["1", ""] } }
message = "no"
fix = "no"

[[constraints]]
id = "e-variable-three"
severity = "error"
when = { env = { E3 = ["1", "z"] }, transceiver_runtime = "CPP" }
message = "no"
fix = "no"
"""


def test_same_result_as_the_oracle_on_ties_and_blocks() -> None:
    policy = parse_policy(TIES_AND_BLOCKS.encode(), "ties.toml")
    _assert_same(policy)
    result = precedence.analyse(policy)
    assert {"runtime-adjusted", "manager-adjusted"} <= set(result.rules)
    assert {c.id for c in policy.constraints} == set(result.constraints)
    assert len(result.rejected) >= 4
    plans = _plans(policy)
    assert any(("env:E4", "feature:f4") in plan.others[group] for plan in plans for group in plan.groups), "f4 and E4 free together"
    assert all("model_type" in plan.blocks[-1] and "architecture" not in plan.blocks[0] for plan in plans)


def _plans(policy: Any) -> list[Any]:
    plans: list[Any] = []
    original = precedence._Plan.__init__

    def spy(self: Any, *args: Any) -> None:
        original(self, *args)
        plans.append(self)

    precedence._Plan.__init__ = spy  # type: ignore[method-assign]
    try:
        precedence.analyse(policy)
    finally:
        precedence._Plan.__init__ = original  # type: ignore[method-assign]
    return plans


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies())
def test_same_result_as_the_oracle_on_random_policies(text: str) -> None:
    _assert_same(parse_policy(text.encode(), "random.toml"))


ENV_VALUES = ("1", "", "x")


def _rich_condition(reads: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """A condition over any input: unlike the shared random policies', it reads the variable that
    turns a feature on (E2 for f2, E1 for f3, E4 for f4), requested values and every decision in
    ``reads``."""

    def matcher(values):
        return st.one_of(
            st.sampled_from(values),
            st.lists(st.sampled_from(values), min_size=1, max_size=2, unique=True),
            st.builds(lambda v: {"not": v}, st.sampled_from(values)),
        )

    requests = {"backend": ("DEFAULT", "NIXL", "UCX"), "transceiver_runtime": ("auto", "CPP", "PYTHON"), "kv_cache_manager": ("auto", "V1", "V2")}
    decided = {"backend": ("NIXL", "UCX", "MPI"), "transceiver_runtime": ("CPP", "PYTHON"), "kv_cache_manager": ("V1", "V2")}
    parts: dict[str, st.SearchStrategy[Any]] = {
        "architecture": matcher(("ArchA", "ArchB", "ArchC")),
        "model_type": matcher(("t1",)),
        "kv_transfer_timeout_ms": st.sampled_from(("finite", "null")),
        "features": st.dictionaries(st.sampled_from(("f1", "f2", "f3", "f4")), st.booleans(), min_size=1, max_size=2),
        "env": st.dictionaries(st.sampled_from(("E1", "E2", "E4")), matcher(ENV_VALUES), min_size=1, max_size=2),
        "requested": st.sampled_from(tuple(requests)).flatmap(lambda d: st.fixed_dictionaries({d: matcher(requests[d])})),
    }
    for decision in reads:
        parts[decision] = matcher(decided[decision])
    return st.fixed_dictionaries({}, optional=parts)


@st.composite
def _with_adjustments(draw: Any) -> str:
    """A random policy with adjustments and constraints over every input (so that each
    constraint reads inputs the others leave free), and features tied to variables, one of them
    (f4) read by nothing before the constraints, so that it and its variable are free together."""
    data = tomlkit.parse(draw(policies())).unwrap()
    if draw(st.booleans()):  # nothing before the constraints reads the model: architecture and model type stay free
        for decision in data["decisions"].values():
            decision.pop("preference", None)
            for stage in ("requirement", "conditional"):
                for rule in decision.get(stage, []):
                    rule["when"].pop("architecture", None)
                    rule["when"].pop("model_type", None)
    data["features"]["f3"] = {"description": "three", "env": "E1"}
    data["features"]["f4"] = {"description": "four, read by constraints and adjustments only", "env": "E4"}
    decisions = data["decisions"]
    every = ("backend", "transceiver_runtime", "kv_cache_manager")
    for name, values in (("backend", ("NIXL", "UCX")), ("transceiver_runtime", ("CPP", "PYTHON")), ("kv_cache_manager", ("V1", "V2"))):
        rules = []
        for i in range(draw(st.integers(0, 2))):
            rules.append({"id": f"{name}-adj-{i}", "when": draw(_rich_condition(every)), "value": draw(st.sampled_from(values))})
        if rules:
            decisions[name]["adjustment"] = rules
    constraints = data.setdefault("constraints", [])
    for i in range(draw(st.integers(0, 3))):
        when = draw(_rich_condition(every))
        if not any(d in when for d in every):  # a decided value, so that an error constraint has families
            name = draw(st.sampled_from(every[1:]))
            when[name] = "PYTHON" if name == "transceiver_runtime" else "V2"
        if draw(st.booleans()):  # a feature and the variable that turns it on: free together, they form one block
            feature, variable = draw(st.sampled_from((("f2", "E2"), ("f3", "E1"), ("f4", "E4"), ("f4", "E4"))))
            when["features"] = {feature: draw(st.booleans())}
            when["env"] = {variable: draw(st.sampled_from(ENV_VALUES))}
        constraint = {"id": f"extra-{i}", "severity": draw(st.sampled_from(("warning", "error", "error"))), "when": when,
                      "message": "runtime {transceiver_runtime} on {backend}.", "fix": "change it"}
        if draw(st.booleans()):
            constraint["decision"] = draw(st.sampled_from(every))
        constraints.append(constraint)
    if not constraints:
        del data["constraints"]
    return tomlkit.dumps(data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_with_adjustments())
def test_same_result_as_the_oracle_on_policies_with_adjustments(text: str) -> None:
    try:
        policy = parse_policy(text.encode(), "adjusted.toml")
    except PolicyError:  # a combination the loader refuses
        assume(False)
    _assert_same(policy)


def test_same_refusal_as_the_oracle_when_over_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = parse_policy(SHIPPED[-1].read_bytes(), str(SHIPPED[-1]))
    for limit in (1_000, 200_000, 2_000_000):
        monkeypatch.setattr(precedence, "RULE_TEST_LIMIT", limit)
        monkeypatch.setattr(analysis_oracle, "RULE_TEST_LIMIT", limit)
        _assert_same(policy)


def test_witness_sequences_behave_as_lists() -> None:
    policy = parse_policy(SHIPPED[-1].read_bytes(), str(SHIPPED[-1]))
    oracle = oracle_analyse(policy).rejected
    got = precedence.analyse(policy).rejected
    assert got, "the newest policy has KVP030 families"
    for family, witnesses in got.items():
        expected = oracle[family]
        assert witnesses == expected and list(witnesses) == expected and len(witnesses) == len(expected)
        for index in (0, 1, len(expected) // 2, -1):
            assert witnesses[index] == expected[index]
        assert witnesses[2:7] == expected[2:7]
        assert list(itertools.islice(witnesses.smallest(), 5)) == sorted(expected, key=lambda w: w["#size"])[:5]
        assert list(witnesses.smallest(0)) == []
