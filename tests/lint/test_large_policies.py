"""A policy as large as the loader accepts (100,000 rows, 10,000 rules per list) is hostile input
too: the rules whose work grows faster than the file bound it, and say so, or index instead of
comparing every pair; what they report is unchanged."""

from __future__ import annotations

import random

import pytest
from kvpolicy.lint import precedence
from kvpolicy.lint.rules import precedence as precedence_rules
from kvpolicy.lint.rules import reference as reference_rules
from kvpolicy.lint.runner import lint_files, load_policy_bytes
from kvpolicy.read.loader import shipped_root

NEWEST = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")
ANCHOR = "[decisions.transceiver_runtime.preference]"
FEATURES = ("inflight_cancel", "sync_timing_output", "serialized_state", "pipelined_transfer")


def _with_requirements(count: int, seed: int) -> bytes:
    """The newest shipped policy with ``count`` random requirements: architecture and backend
    matchers (some negated), features, the timeout, in every combination."""
    rng = random.Random(seed)
    extra = []
    for i in range(count):
        parts = []
        if rng.random() < 0.7:
            names = ", ".join(f'"{a}ForCausalLM"' for a in rng.sample("ABCDE", rng.randint(1, 3)))
            parts.append(f"architecture = {{ not = [{names}] }}" if rng.random() < 0.2 else f"architecture = [{names}]")
        if rng.random() < 0.3:
            backends = ", ".join(f'"{b}"' for b in rng.sample(["NIXL", "UCX", "MPI"], rng.randint(1, 2)))
            parts.append(f"backend = {{ not = [{backends}] }}" if rng.random() < 0.3 else f"backend = [{backends}]")
        for feature in rng.sample(FEATURES, rng.randint(0, 2)):
            parts.append(f"features.{feature} = {rng.choice(['true', 'false'])}")
        if rng.random() < 0.3:
            parts.append(f'kv_transfer_timeout_ms = "{rng.choice(["finite", "null"])}"')
        extra.append(
            f'[[decisions.transceiver_runtime.requirement]]\nid = "synthetic-{i}"\nwhen = {{ {", ".join(parts)} }}\n'
            f'value = "{rng.choice(["CPP", "PYTHON"])}"\nreason = "generated"\nsource = "test"\n'
        )
    return NEWEST.replace(ANCHOR, "\n".join(extra) + "\n" + ANCHOR, 1).encode()


def _all_pairs(file):
    """KVP024 as it was defined: every requirement against every other of its decision."""
    found = []
    for decision in file.policy.decisions.values():
        for narrow in decision.requirements:
            for broad in decision.requirements:
                if broad is narrow or broad.value != narrow.value or not precedence_rules._implies(narrow.when, broad.when):
                    continue
                if precedence_rules._implies(broad.when, narrow.when) and (narrow.location.line, narrow.id) < (broad.location.line, broad.id):
                    continue
                found.append((narrow.id, broad.id))
                break
    return found


@pytest.mark.parametrize("seed", range(6))
def test_redundant_requirements_are_found_by_index_exactly_as_by_all_pairs(seed):
    file = load_policy_bytes(_with_requirements(120, seed), "many.toml")
    assert file.policy is not None, file.problems
    expected = _all_pairs(file)
    assert len(expected) > 10, "the generated requirements should imply each other often"
    got = [(f.message.split()[1], f.related[0][1].split()[1]) for f in precedence_rules.redundant_requirement(file)]
    assert got == expected


def test_redundancy_check_stops_at_its_budget_and_says_so(monkeypatch):
    monkeypatch.setattr(precedence_rules, "IMPLICATION_TESTS", 200)
    file = load_policy_bytes(_with_requirements(120, 0), "many.toml")
    findings = list(precedence_rules.redundant_requirement(file))
    assert "redundancy not checked from requirement" in findings[-1].message
    assert findings[-1].location.line > 1
    assert len(findings) < len(_all_pairs(file)) + 1


def _with_unknown_architectures(names: list[str]) -> bytes:
    rows = "".join(f'  {{ architecture = "{n}", value = "PYTHON", reason = "generated", source = "test" }},\n' for n in names)
    return NEWEST.replace("\n]\n\n[decisions.kv_cache_manager]", "\n" + rows + "]\n\n[decisions.kv_cache_manager]", 1).encode()


def test_near_miss_check_compares_a_bounded_number_of_names_and_says_so(monkeypatch):
    monkeypatch.setattr(reference_rules, "NEAR_MISS_CHECKS", 3)
    names = ["LLamaForCausalLM", "Synth0ForCausalLM", "Synth1ForCausalLM", "Synth2ForCausalLM", "Synth3ForCausalLM", "QWen2ForCausalLM"]
    file = load_policy_bytes(_with_unknown_architectures(names), "unknown.toml")
    messages = [f.message for f in reference_rules.unknown_architecture(file)]
    assert messages[0] == "unknown architecture 'LLamaForCausalLM'; did you mean 'LlamaForCausalLM'?"
    assert "3 more architecture names were not compared" in messages[-1]
    assert not any("QWen2" in m for m in messages), "past the bound: not compared"
    monkeypatch.setattr(reference_rules, "NEAR_MISS_CHECKS", 100)
    messages = [f.message for f in reference_rules.unknown_architecture(file)]
    assert any("did you mean 'Qwen2ForCausalLM'" in m for m in messages) and not any("not compared" in m for m in messages)


def test_analysis_refuses_a_step_whose_rule_tests_exceed_the_budget_before_running_it(monkeypatch):
    policy = load_policy_bytes(NEWEST.encode(), "newest.toml").policy
    precedence.analyse(policy)  # within both budgets as shipped
    monkeypatch.setattr(precedence, "RULE_TEST_LIMIT", 1_000)
    with pytest.raises(precedence.AnalysisLimit, match="rule tests"):
        precedence.analyse(policy)
    result = lint_files([load_policy_bytes(NEWEST.encode(), "newest.toml")])
    assert [f.code for f in result.findings] == ["KVP029"] and "rule tests" in result.findings[0].message


def _levels_pairwise(policy, order):
    """Architecture classes as first defined: each name against every condition and table."""
    names = [None, *policy.architectures()]
    tables_of = {name: precedence.preference_table(policy.decisions[name]) for name in order}
    out = []
    for level in range(len(order) + 1):
        conditions, tables = precedence.level_inputs(policy, order[level:], tables_of)
        matchers = [c.subjects["architecture"].values for c in conditions if "architecture" in c.subjects]
        classes = {}
        for name in names:
            key = (tuple(name in m for m in matchers), tuple(tuple(sorted(t.get(name, []), key=lambda e: (e[0] or "", e[1]))) if name else () for t in tables))
            classes.setdefault(key, []).append(name)
        out.append(sorted(sorted(n or "" for n in group) for group in classes.values()))
    return out


@pytest.mark.parametrize("version", ["2026.07.09", "2026.08.18", "2026.09.10", "generated"])
def test_architecture_classes_match_their_pairwise_definition(version):
    raw = _with_requirements(60, 1) if version == "generated" else (shipped_root() / f"{version}.toml").read_bytes()
    policy = load_policy_bytes(raw, "p.toml").policy
    order = policy.decision_order()
    _, members_at = precedence._architecture_levels(policy, order)
    got = [sorted(sorted([n or "" for n in names] + ([""] if rep is None else [])) for rep, names in members.items()) for members in members_at]
    assert got == _levels_pairwise(policy, order)
