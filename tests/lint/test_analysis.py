"""The analysis behind the precedence and safety rules is exact: on every policy it agrees with
brute force over the full domain (every context class, evaluated by the resolver)."""

from __future__ import annotations

import dataclasses
import itertools

import kvpolicy
import pytest
from hypothesis import HealthCheck, given, settings
from kvpolicy.evaluate.domain import domain_of
from kvpolicy.lint.analysis import analyse
from kvpolicy.read.loader import parse_policy
from kvpolicy.evaluate.resolver import compile_condition

from tests.engine.strategies import policies


def _without_adjustments(policy):
    """The policy as it decides, before the creation-time rewrites (adjustments run after every
    decision; the trace shows the rule that decided, then the adjustment that rewrote it)."""
    decisions = {name: dataclasses.replace(d, adjustments=()) for name, d in policy.decisions.items()}
    return dataclasses.replace(policy, decisions=decisions)


def _brute_force(policy):
    """Rules that decide (at the decision stage, or as an adjustment), requirements that hold
    (explicit value or not) and conditionals that hold under auto (over the values decided before
    any adjustment), constraints that fire, conflicts."""
    policy_set = kvpolicy.PolicySet(policy)
    deciding = kvpolicy.PolicySet(_without_adjustments(policy))
    adjustment_ids = {r.id for d in policy.decisions.values() for r in d.adjustments}
    names = frozenset(policy.decisions)
    decided, held, fired, conflicts = set(), set(), set(), set()
    tests = {}
    for decision in policy.decisions.values():
        for rule in (*decision.requirements, *decision.conditionals):
            tests[rule.id] = compile_condition(rule.when, names)
    implied = [(f.env, f.name) for f in policy.features.values() if f.env]
    for ctx in domain_of(policy).contexts():
        on = {feature for variable, feature in implied if ctx["env"].get(variable) == "1"}
        if not on <= ctx["features"]:
            ctx = {**ctx, "features": ctx["features"] | on}  # as resolve normalises it
        values, decided_by, diagnostics = policy_set.outcome(ctx)
        fired |= {d.id for d in diagnostics if d.id in {c.id for c in policy.constraints}}
        rewritten = {decided_by[n] for n in names if decided_by.get(n) in adjustment_ids}
        if rewritten:
            decided |= rewritten
            values, decided_by, _ = deciding.outcome(ctx)  # what decided before the rewrite
        for name, decision in policy.decisions.items():
            auto = ctx[name] in decision.undecided
            held_requirements = [r for r in decision.requirements if tests[r.id](ctx, values)]
            for first, second in itertools.combinations(held_requirements, 2):
                if first.value != second.value:
                    conflicts.add(tuple(sorted((first.id, second.id))))
            # A requirement acts on an explicit value too (an error when they differ): it holds there.
            held |= {r.id for r in held_requirements}
            if not auto:
                continue
            decided.update(decided_by[name].split("+"))  # agreeing requirements decide together
            held |= {r.id for r in decision.conditionals if tests[r.id](ctx, values)}
    return decided, held, fired, conflicts


def _analysed(policy):
    analysis = analyse(policy)
    decided, held = set(), set()
    for rule_id, stats in analysis.rules.items():
        ids = {r.id for r in analysis.row_classes.get(rule_id, [])} or {rule_id}
        if stats.decided is not None:
            decided |= ids
        if stats.held is not None and rule_id in {r.id for r in policy.rules()}:
            held |= ids
    held -= {d.default.id for d in policy.decisions.values()}
    held -= {r.id for d in policy.decisions.values() for r in d.adjustments}  # compared through `decided`
    return decided, held, set(analysis.constraints), set(analysis.conflicts)


def _compare(policy):
    decided, held, fired, conflicts = _brute_force(policy)
    held -= {d.default.id for d in policy.decisions.values()}
    held -= {r.id for d in policy.decisions.values() for r in d.adjustments}  # compared through `decided`
    got = _analysed(policy)
    assert got[0] == decided, "rules that decide"
    assert got[1] == held, "requirements and conditionals that hold under auto"
    assert got[2] == fired, "constraints that fire"
    assert got[3] == conflicts, "conflicting requirement pairs"


# The first and the newest shipped versions: the newest uses every construct the language has
# (requested.*, adjustments, env not-matchers); each walks its whole domain (up to millions of
# contexts). The random policies below cover the language exhaustively at small sizes.
@pytest.mark.parametrize("version", ["2026.07.09", "2026.09.10"])
def test_exact_on_shipped_policies(version):
    _compare(kvpolicy.load(version=version).policy)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies())
def test_exact_on_random_policies(text):
    _compare(parse_policy(text.encode(), "random.toml"))


#: An adjustment is the only rule that reads the architecture: it rewrites the manager for ArchA.
ADJUSTED_BY_MODEL_ONLY = """schema = 1
version = "2026.01.01"
summary = "s"
source = "s"
features = {}

[decisions.backend]
description = "b"
values = ["NIXL", "UCX"]
auto = "DEFAULT"
default = { id = "backend-default", value = "NIXL" }

[decisions.transceiver_runtime]
description = "r"
values = ["CPP", "PYTHON"]
auto = "auto"
inputs = ["backend"]
default = { id = "runtime-default", value = "CPP" }

[decisions.kv_cache_manager]
description = "m"
values = ["V1", "V2"]
auto = "auto"
inputs = ["transceiver_runtime"]
default = { id = "manager-default", value = "V1" }

[[decisions.kv_cache_manager.adjustment]]
id = "arch-a-v2"
when = { architecture = "ArchA" }
value = "V2"
"""


def test_an_adjustment_that_alone_reads_the_architecture_is_seen_to_decide():
    policy = parse_policy(ADJUSTED_BY_MODEL_ONLY.encode(), "adjusted.toml")
    assert kvpolicy.PolicySet(policy).resolve(architecture="ArchA", backend="NIXL").decided_by["kv_cache_manager"] == "arch-a-v2"
    _compare(policy)
