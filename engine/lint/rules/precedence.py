"""Precedence rules (KVP020-KVP024, KVP029): rules that never decide, or decide against each other, judged
by the exact analysis (:mod:`kvpolicy.lint.precedence`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from ...read.model import Condition, Matcher, Policy, Row, Rule
from ...read.source import Location
from ..precedence import context_of, describe_context
from .base import Finding, PolicyFile, counterexample, register


@register("KVP020", "duplicate-architecture", "precedence", "error", "One architecture listed twice in a preference table")
def duplicate_architecture(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a preference row for an architecture (and ``model_type``) that the same table
    already lists, with both locations, whether the values differ or not.

    ## Why is this bad?
    Only the first row is ever used. With different values the file does not load at all;
    with equal values the second row is dead weight that a later edit will make inconsistent.

    ## Example
    ```toml
    rows = [
      { architecture = "LlamaForCausalLM", value = "PYTHON" },
      { architecture = "LlamaForCausalLM", value = "PYTHON" },   # listed twice
    ]
    ```

    ## Fix
    Keep one row.
    """
    if file.policy is None:
        for problem in file.problems:
            if problem.check == "conflicting-rows":
                yield Finding("KVP020", problem.message, problem.location, "error")
        return
    for decision in file.policy.decisions.values():
        if decision.preference is None:
            continue
        seen: dict[tuple[str, str | None], Row] = {}
        for row in decision.preference.rows:
            key = (row.architecture, row.model_type)
            first = seen.get(key)
            if first is None:
                seen[key] = row
                continue
            first_at = file.anchor(first)
            yield Finding(
                "KVP020",
                f"{row.architecture} is listed twice in {decision.preference.id} (first at line {first_at.line}); only the first row is used: keep one",
                file.anchor(row),
                "error",
                related=((first_at, f"first {row.architecture} row"),),
            )


def _rule_items(policy: Policy) -> Iterator[tuple[Any, str]]:
    """Every rule and row, with how findings name it."""
    for decision in policy.decisions.values():
        for rule in decision.requirements:
            yield rule, f"requirement {rule.id}"
        if decision.preference is not None:
            for row in _first_rows(decision.preference.rows):
                yield row, f"preference row {row.id}"
        for rule in decision.conditionals:
            yield rule, f"conditional {rule.id}"
        yield decision.default, f"default {decision.default.id}"


def _first_rows(rows: tuple[Row, ...]) -> list[Row]:
    seen: set[tuple[str, str | None]] = set()
    first = []
    for row in rows:
        if (row.architecture, row.model_type) not in seen:
            seen.add((row.architecture, row.model_type))
            first.append(row)
    return first


def _stats(file: PolicyFile, item: Any) -> Any:
    analysis = file.analysis
    assert analysis is not None
    if isinstance(item, Row):
        rep = analysis.representative.get(item.id)
        return analysis.rules.get(rep) if rep is not None else None
    return analysis.rules.get(item.id)


def _higher(file: PolicyFile, item: Any) -> str:
    """Which rule wins where ``item``'s condition holds (for the message)."""
    stats = _stats(file, item)
    if stats is None or stats.held is None:
        return "another rule"
    assert file.policy is not None
    ctx = context_of(stats.held, file.policy)
    decision = item.decision if isinstance(item, Rule) else _row_decision(file.policy, item)
    _, decided_by, _ = file.policy_set.outcome(ctx)
    return decided_by.get(decision, "another rule")


def _row_decision(policy: Policy, row: Row) -> str:
    for decision in policy.decisions.values():
        if decision.preference is not None and any(r is row for r in decision.preference.rows):
            return decision.name
    return ""


@register("KVP021", "shadowed-rule", "precedence", "warning", "A rule that can hold but never decides: a higher-precedence rule always wins")
def shadowed_rule(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a requirement, preference row, conditional default or default whose condition holds
    in some context, but that never decides any context: wherever it holds, a requirement, a
    preference row or an earlier conditional decides first (for a default: some earlier rule
    always decides). The analysis is exact over every class of contexts the policy can tell
    apart; the message names a rule that wins in a context where this one holds.

    ## Why is this bad?
    The rule looks like policy but changes nothing. Usually an earlier rule is broader than
    intended, or the rule belongs before it.

    ## Example
    ```toml
    [[decisions.transceiver_runtime.conditional]]
    id = "auto-cpp-off-nixl"
    when = { backend = { not = "NIXL" } }
    value = "CPP"

    [[decisions.transceiver_runtime.conditional]]
    id = "auto-cpp-on-ucx"           # shadowed: auto-cpp-off-nixl already covers UCX
    when = { backend = "UCX" }
    value = "CPP"
    ```

    ## Fix
    Delete the rule, narrow the rule that wins, or move this one before it.
    """
    policy = file.policy
    assert policy is not None
    if file.analysis is None:
        return
    for item, label in _rule_items(policy):
        stats = _stats(file, item)
        if stats is None or stats.held is None or stats.decided is not None:
            continue
        winner = _higher(file, item)
        yield Finding(
            "KVP021",
            f"{label} never decides: wherever it holds, {winner} decides first (e.g. {describe_context(context_of(stats.held, policy), policy)})",
            file.anchor(item),
            "warning",
            context=counterexample(file, stats.held),
        )


@register("KVP022", "unreachable-rule", "precedence", "warning", "A rule or constraint whose conditions can never hold")
def unreachable_rule(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a requirement, preference row (its architecture together with the table's
    ``adopt_when``), conditional default or constraint whose condition holds in no context the
    policy can produce: for example a condition on a decided value that no context reaches, or
    a conditional that reads a decision's value the decision never takes under ``auto``.

    ## Why is this bad?
    The rule is dead: it documents behaviour that never happens.

    ## Example
    ```toml
    [decisions.kv_cache_manager.preference]
    adopt_when = { backend = "NIXL", transceiver_runtime = "PYTHON" }
    # in a policy whose transceiver_runtime can never be PYTHON, every row is unreachable
    ```

    ## Fix
    Correct the condition, or delete the rule.
    """
    policy = file.policy
    assert policy is not None
    analysis = file.analysis
    if analysis is None:
        return
    for item, label in _rule_items(policy):
        if isinstance(item, Rule) and item.stage == "default":
            continue
        stats = _stats(file, item)
        if stats is not None and stats.held is not None:
            continue
        condition = _row_condition(policy, item) if isinstance(item, Row) else str(item.when)
        yield Finding(
            "KVP022",
            f"{label} can never hold: no context satisfies {condition}",
            file.anchor(item),
            "warning",
        )
    for constraint in policy.constraints:
        if constraint.id not in analysis.constraints:
            yield Finding(
                "KVP022",
                f"constraint {constraint.id} can never fire: no context satisfies {constraint.when}",
                file.anchor(constraint),
                "warning",
            )


def _row_condition(policy: Policy, row: Row) -> str:
    parts = [f"architecture is {row.architecture}"]
    if row.model_type:
        parts.append(f"model_type is {row.model_type}")
    for decision in policy.decisions.values():
        preference = decision.preference
        if preference is not None and any(r is row for r in preference.rows) and not preference.adopt_when.empty:
            parts.append(str(preference.adopt_when))
    return " and ".join(parts)


@register("KVP023", "conflicting-requirements", "precedence", "warning", "Two requirements that hold together and require different values")
def conflicting_requirements(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports two requirements of one decision (the same precedence: neither wins) that both hold
    in some context but require different values, with the smallest such context.

    ## Why is this bad?
    In that context the decision cannot be made: ``resolve`` reports ``requirements-conflict``
    (under ``auto``) or an error for the explicit value, at start-up, in front of a user.

    ## Example
    ```toml
    [[decisions.transceiver_runtime.requirement]]
    id = "serialized-state-requires-cpp"
    when = { features.serialized_state = true }
    value = "CPP"
    [[decisions.transceiver_runtime.requirement]]
    id = "pipelined-transfer-requires-python"   # conflicts when both features are on
    when = { features.pipelined_transfer = true }
    value = "PYTHON"
    ```

    ## Fix
    Make the conditions exclusive, or add a constraint that rejects the combination with a
    message saying which feature to turn off. Where the combination is impossible by design
    (two capabilities no runtime has together), suppress the finding with that reason.
    """
    policy = file.policy
    assert policy is not None
    if file.analysis is None:
        return
    rules = {r.id: r for d in policy.decisions.values() for r in d.requirements}
    for (first_id, second_id), witness in sorted(file.analysis.conflicts.items()):
        first, second = sorted((rules[first_id], rules[second_id]), key=lambda r: (r.location.line, r.id))
        ctx = context_of(witness, policy)
        yield Finding(
            "KVP023",
            f"requirement {second.id} ({second.value}) and {first.id} ({first.value}) both hold for "
            f"{describe_context(ctx, policy)}; {second.decision} cannot be decided there",
            file.anchor(second),
            "warning",
            related=((file.anchor(first), f"requirement {first.id}"),),
            context=counterexample(file, witness),
        )


@register("KVP024", "redundant-requirement", "precedence", "warning", "A requirement that another requirement already implies")
def redundant_requirement(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a requirement whose condition implies the condition of another requirement of the
    same decision that requires the same value: wherever it holds, the other one holds too and
    already forces the value. The check is syntactic (each test of the other condition is
    implied by a test of this one), so it never reports a requirement that adds something.

    ## Why is this bad?
    The requirement decides nothing the other one does not. Both notes are reported where both
    hold, and a later edit to one of them silently leaves the other in force.

    ## Example
    ```toml
    [[decisions.transceiver_runtime.requirement]]
    id = "serialized-state-requires-cpp"
    when = { features.serialized_state = true }
    value = "CPP"
    [[decisions.transceiver_runtime.requirement]]
    id = "serialized-state-on-ucx-requires-cpp"   # redundant: implied by the one above
    when = { backend = "UCX", features.serialized_state = true }
    value = "CPP"
    ```

    ## Fix
    Delete the narrower requirement (move its note or reason to the broader one), or make it
    require something the broader one does not.

    Each requirement meets only those an index of their tests says it could imply; past
    2,000,000 compared pairs in one file the rule stops, with a finding that says where.
    """
    policy = file.policy
    assert policy is not None
    budget = IMPLICATION_TESTS
    for decision in policy.decisions.values():
        requirements = decision.requirements
        candidates = _implication_index(requirements)
        for narrow in requirements:
            found = candidates(narrow)
            budget -= len(found)
            if budget < 0:
                yield Finding(
                    "KVP024",
                    f"redundancy not checked from requirement {narrow.id} on: this rule compares at most "
                    f"{IMPLICATION_TESTS:,} pairs of requirements per file; split the policy",
                    file.anchor(narrow),
                    "warning",
                )
                return
            for broad in found:
                if broad is narrow or broad.value != narrow.value or not _implies(narrow.when, broad.when):
                    continue
                # Two requirements with the same condition imply each other: report only the later one.
                if _implies(broad.when, narrow.when) and (narrow.location.line, narrow.id) < (broad.location.line, broad.id):
                    continue
                yield Finding(
                    "KVP024",
                    f"requirement {narrow.id} is redundant: wherever it holds, requirement {broad.id} also "
                    f"holds and requires {broad.value}; delete it or narrow what it requires",
                    file.anchor(narrow),
                    "warning",
                    related=((file.anchor(broad), f"requirement {broad.id}"),),
                )
                break


IMPLICATION_TESTS = 2_000_000
"""Most requirement pairs KVP024 compares in one file (each a few microseconds)."""


def _implication_index(requirements: list[Rule] | tuple[Rule, ...]) -> Callable[[Rule], list[Rule]]:
    """The requirements a given one might imply (:func:`_implies`), in their order, without comparing
    every pair. A broad condition is filed under one test any narrower condition must share: its
    first subject, ``requested`` or env matcher that is not negated (under each of its values: a
    narrower matcher holds a subset of them), else its first feature, else its timeout. One with
    none of these (negated matchers only, or empty) meets every narrow one."""
    order = {id(rule): i for i, rule in enumerate(requirements)}
    filed: dict[tuple[Any, ...], list[Rule]] = {}
    everywhere: list[Rule] = []
    for broad in requirements:
        keys = _anchor_keys(broad.when)
        if keys is None:
            everywhere.append(broad)
        for key in keys or ():
            filed.setdefault(key, []).append(broad)

    def candidates(narrow: Rule) -> list[Rule]:
        found = {id(r): r for r in everywhere}
        when = narrow.when
        for field_name in ("subjects", "requested", "env"):
            for name, matcher in getattr(when, field_name).items():
                if not matcher.negate:
                    if not matcher.values:  # (never holds: it implies anything)
                        return list(requirements)
                    for rule in filed.get((field_name, name, min(matcher.values)), ()):
                        found[id(rule)] = rule
        for name, on in when.features.items():
            for rule in filed.get(("features", name, on), ()):
                found[id(rule)] = rule
        for rule in filed.get(("timeout", when.timeout), ()) if when.timeout else ():
            found[id(rule)] = rule
        return sorted(found.values(), key=lambda r: order[id(r)])

    return candidates


def _anchor_keys(when: Condition) -> list[tuple[Any, ...]] | None:
    for field_name in ("subjects", "requested", "env"):
        for name, matcher in sorted(getattr(when, field_name).items()):
            if not matcher.negate:
                return [(field_name, name, value) for value in matcher.values]
    for name, on in sorted(when.features.items()):
        return [("features", name, on)]
    if when.timeout:
        return [("timeout", when.timeout)]
    return None


def _implies(narrow: Condition, broad: Condition) -> bool:
    """Whether ``narrow`` holding makes ``broad`` hold, judged field by field (sound, not complete)."""
    for name in (f.name for f in dataclasses.fields(broad)):
        want = getattr(broad, name)
        have = getattr(narrow, name)
        if not want:
            continue
        if isinstance(want, dict):
            if not isinstance(have, dict):
                return False
            for key, test in want.items():
                if key not in have:
                    return False
                if isinstance(test, Matcher):
                    if not isinstance(have[key], Matcher) or not _matcher_implies(have[key], test):
                        return False
                elif have[key] != test:
                    return False
        elif have != want:
            return False
    return True


def _matcher_implies(narrow: Matcher, broad: Matcher) -> bool:
    if not narrow.negate and not broad.negate:
        return narrow.values <= broad.values
    if not narrow.negate and broad.negate:
        return not (narrow.values & broad.values)
    if narrow.negate and broad.negate:
        return broad.values <= narrow.values
    return False  # "any value but X" never implies "one of Y": the values are open-ended


@register("KVP029", "analysis-limit", "precedence", "error", "The exact analysis could not run within its budget")
def analysis_limit(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a policy whose exact precedence and safety analysis (KVP021, KVP022, KVP023,
    KVP030) would need more evaluations than its budget, because too many inputs are read
    together. Those rules did not run, and no suppression of theirs is judged unused.

    ## Why is this bad?
    A gate that skips its analysis and stays green would pass an ``auto`` choice that fails at
    start-up. The run fails instead, so the skip is seen.

    ## Example
    Twenty features, each read by its own requirement of one decision: 2**20 combinations.

    ## Fix
    Split conditions, or fold features that always travel together into one. Where the policy
    is large on purpose, set ``analysis-limit = "warning"`` in ``[tool.kvpolicy]`` (or ignore
    KVP029) and accept that those rules do not run.
    """
    assert file.policy is not None
    if file.analysis is None:
        yield Finding(
            "KVP029",
            f"precedence and safety analysis skipped: {file.skipped_reason}; KVP021, KVP022, KVP023 and KVP030 did not run on this file",
            Location(file.path, 1, 1),
            "error",
        )
