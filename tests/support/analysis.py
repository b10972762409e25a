"""Lint's exact analysis (kvpolicy.lint.precedence) against brute force over a policy's whole domain
(every context class, evaluated by the resolver)."""

from __future__ import annotations

import dataclasses
import itertools

import kvpolicy
from kvpolicy.evaluate.domain import domain_of
from kvpolicy.evaluate.interpreter import compile_condition
from kvpolicy.lint.precedence import analyse


def without_adjustments(policy):
    """The policy as it decides, before the creation-time rewrites (adjustments run after every
    decision; the trace shows the rule that decided, then the adjustment that rewrote it)."""
    decisions = {name: dataclasses.replace(d, adjustments=()) for name, d in policy.decisions.items()}
    return dataclasses.replace(policy, decisions=decisions)


def brute_force(policy):
    """Rules that decide (at the decision stage, or as an adjustment), requirements that hold
    (explicit value or not) and conditionals that hold under auto (over the values decided before
    any adjustment), constraints that fire, conflicts."""
    policy_set = kvpolicy.PolicySet(policy)
    deciding = kvpolicy.PolicySet(without_adjustments(policy))
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


def analysed(policy):
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


def compare(policy):
    """The analysis of ``policy`` agrees with brute force over its whole domain (assertions)."""
    decided, held, fired, conflicts = brute_force(policy)
    held -= {d.default.id for d in policy.decisions.values()}
    held -= {r.id for d in policy.decisions.values() for r in d.adjustments}  # compared through `decided`
    got = analysed(policy)
    assert got[0] == decided, "rules that decide"
    assert got[1] == held, "requirements and conditionals that hold under auto"
    assert got[2] == fired, "constraints that fire"
    assert got[3] == conflicts, "conflicting requirement pairs"
