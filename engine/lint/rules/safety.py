"""Safety rules (KVP030): contexts that fail at start-up although another value would pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...read.model import Row
from ..precedence import Analysis, context_of, describe_context
from .base import Finding, PolicyFile, counterexample, register


@register("KVP030", "auto-rejected", "safety", "error", "An auto choice that a constraint rejects, where another value would pass")
def auto_rejected(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Finds contexts where the user left a decision to the policy (``auto``), the policy chose a
    value, an error constraint about that decision rejects it, and another value of the
    decision would have passed every check. Each family — the rule that chose, the constraint,
    and the values of the other decisions the constraint reads (e.g. the backend) — is
    reported once, at the rule that chose, with the smallest such context.

    ## Why is this bad?
    ``auto`` promises a working choice. Here it produces a configuration that fails at
    start-up although a working one exists: the user must find out and override by hand.

    ## Example
    Under 2026.08.24 a model preference is adopted verbatim:
    ```toml
    rows = [{ architecture = "LlamaForCausalLM", value = "PYTHON" }]
    ```
    With ``backend = "UCX"`` and ``transceiver_runtime = "auto"`` Llama resolves to PYTHON,
    which ``python-requires-nixl`` rejects; CPP would work.

    ## Fix
    Guard the rule (``adopt_when = { backend = "NIXL" }``), or add a conditional default that
    picks the working value first. Where a version reproduces an upstream behaviour on
    purpose, suppress the finding on that row with the reason.
    """
    policy = file.policy
    assert policy is not None
    analysis = file.analysis
    if analysis is None:
        return
    decisions = policy.decisions
    owners: dict[str, Any] = {r.id: r for r in policy.rules()}
    for row in policy.rows():
        owners.setdefault(row.id, row)
    constraints = {c.id: c for c in policy.constraints}
    outcome = file.policy_set.outcome
    # One finding per (rule that chose, decision): every constraint that rejects its choice and
    # every combination of the other decisions (e.g. each backend) where that happens, in one.
    grouped: dict[tuple[str, str], dict[str, list[tuple[str, str, str, dict[str, Any], dict[str, Any], Any]]]] = {}
    for (constraint_id, decision, rule_id, others), witnesses in sorted(analysis.rejected.items()):
        for witness in witnesses.smallest(64):
            ctx = context_of(witness, policy)
            values, _, _ = outcome(ctx)
            rejected = values[decision]
            working = None
            for alternative in decisions[decision].values:
                if alternative == rejected:
                    continue
                _, _, diagnostics = outcome({**ctx, decision: alternative})
                if not any(d.severity == "error" for d in diagnostics):
                    working = alternative
                    break
            if working is None:
                continue
            where = ", ".join(f"{k} {v}" for k, v in others)
            for target in _deciders(analysis, owners, rule_id):
                shown = ctx if target.id == rule_id else _with_architecture(ctx, target)
                by_constraint = grouped.setdefault((target.id, decision), {})
                by_constraint.setdefault(constraint_id, []).append((where, rejected, working, shown, witness, target))
            break
    for (target_id, decision), by_constraint in grouped.items():
        first_constraint, entries = next(iter(by_constraint.items()))
        _, rejected, working, shown, witness, target = entries[0]
        parts = []
        count = 0
        for constraint_id, found in by_constraint.items():
            wheres = list(dict.fromkeys(e[0] for e in found if e[0]))
            count += max(1, len(wheres))
            parts.append(
                f"constraint {constraint_id} rejects it{' with ' + '; '.join(wheres) if wheres else ''} (e.g. {describe_context(found[0][3], policy)})"
            )
        if len(by_constraint) == 1 and count == 1:
            where = entries[0][0]
            message = (
                f"auto resolves {decision} to {rejected} through {target_id}{' with ' + where if where else ''}, "
                f"which constraint {first_constraint} rejects; {decision} = {working} would pass "
                f"(e.g. {describe_context(shown, policy)})"
            )
        else:
            message = (
                f"auto resolves {decision} to {rejected} through {target_id}, which fails at start-up in {count} "
                f"contexts where {decision} = {working} would pass: {'; '.join(parts)}"
            )
        yield Finding(
            "KVP030",
            message,
            file.anchor(target),
            "error",
            related=tuple((file.anchor(constraints[c]), f"constraint {c}") for c in by_constraint),
            context=counterexample(file, _witness_of(shown, witness)),
        )


def _deciders(analysis: Analysis, owners: dict[str, Any], rule_id: str) -> list[Any]:
    """The rule a decided-by id names; for a row, every row of its architecture class."""
    rows = analysis.row_classes.get(rule_id)
    if rows:
        unique: dict[str, Row] = {}
        for row in rows:
            unique.setdefault(row.id, row)
        return sorted(unique.values(), key=lambda r: r.location.line)
    found = [owners.get(part) for part in rule_id.split("+")]  # agreeing requirements: a+b
    return [owner for owner in found if owner is not None]


def _with_architecture(ctx: dict[str, Any], row: Row) -> dict[str, Any]:
    return {**ctx, "architecture": row.architecture, "model_type": row.model_type or ctx["model_type"]}


def _witness_of(ctx: dict[str, Any], witness: dict[str, Any]) -> dict[str, Any]:
    return {**witness, "architecture": ctx["architecture"], "model_type": ctx["model_type"]}
