"""``kvpolicy diff OLD NEW``: every context two policy versions resolve differently, grouped."""

from __future__ import annotations

import itertools
import json
from typing import Any

from ..diff import (
    ARCHITECTURE_SLOT,
    Diff,
    Group,
    Section,
    architectures_of,
    concrete_rule,
    describe_clauses,
    describe_cube,
    describe_group,
    describe_resolved,
    diff_policies,
)
from .common import fail
from .policies import load_policy_argument

__all__ = ["register", "render_text", "to_json"]


def register(sub: Any) -> None:
    """Add ``diff``."""
    summary = "show every context two policy versions resolve differently, grouped by how it changes"
    parser = sub.add_parser("diff", help=summary, description=summary + ".")
    parser.add_argument("old", metavar="OLD", help="a policy file, a folder (its newest version) or a shipped version id")
    parser.add_argument("new", metavar="NEW", help="the same, for the new side")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--exit-code", action="store_true", help="exit 1 when anything changed")
    parser.set_defaults(run=run)


def run(args: Any) -> int:
    """Load both sides, diff them, print the result."""
    old = load_policy_argument(args.old)
    if isinstance(old, str):
        return fail(f"OLD: {old}")
    new = load_policy_argument(args.new)
    if isinstance(new, str):
        return fail(f"NEW: {new}")
    result = diff_policies(old, new)
    if args.format == "json":
        print(json.dumps(to_json(result), indent=1))
    else:
        print(render_text(result))
    return 1 if args.exit_code and result else 0


def _rule(rule: str, group: Group | Section, result: Diff) -> str:
    if ARCHITECTURE_SLOT not in rule:
        return rule
    architectures = architectures_of(group, result.dimensions)
    return concrete_rule(rule, architectures[0]) if len(architectures) == 1 else rule.replace(ARCHITECTURE_SLOT, "<architecture>")


def _decision_lines(decisions: Any, owner: Group | Section, result: Diff) -> list[str]:
    for side, version, other in (("old", result.old.version, "new"), ("new", result.new.version, "old")):
        if decisions and all(getattr(d, side) is None for d in decisions):
            # One version rejects these contexts: a requested value it does not know.
            values = ", ".join(f"{d.decision} {getattr(d, other)}" for d in decisions)
            if side == "old":
                return [f"{version} rejects these contexts (a requested value or feature it does not know); now {values}"]
            return [f"{version} rejects these contexts (a requested value or feature it does not know); was {values}"]
    lines = []
    for d in decisions:
        old_rule, new_rule = _rule(d.old_rule, owner, result), _rule(d.new_rule, owner, result)
        if d.old != d.new:
            lines.append(f"{d.decision} {d.old} -> {d.new} (decided by {new_rule} instead of {old_rule})")
        else:
            lines.append(f"{d.decision} stays {d.new}, now decided by {new_rule} instead of {old_rule}")
    return lines


def _diagnostic(sign: str, key: Any) -> str:
    id_, severity, decision = key
    return f"{sign} {severity} {id_}" + (f" ({decision})" if decision else "")


def change_lines(group: Group, result: Diff) -> list[str]:
    """What changes for one group, one line per decision or diagnostic."""
    lines = _decision_lines(group.change.decisions, group, result)
    for sign, items in (("+", group.change.added), ("-", group.change.removed)):
        lines += [_diagnostic(sign, key) for key in items]
    return lines


def _clause_lines(clauses: list[list[str]], first: str, indent: str) -> list[str]:
    lines = []
    for index, clause in enumerate(clauses):
        label = first if index == 0 else " and"
        lines.append(f"{indent}{label} {clause[0]}")
        lines += [f"{indent}  or {text}" for text in clause[1:]]
    return lines


def _section_order(section: Section) -> tuple[Any, ...]:
    values_change = any(d.old != d.new for d in section.decisions)
    return (not values_change, not section.decisions, -section.count, [str(d) for d in section.decisions])


def render_text(result: Diff) -> str:
    """The change for a person: one entry per way the decisions change, with where it happens
    and which diagnostics come and go where."""
    head = f"kvpolicy diff {result.old.version} -> {result.new.version}"
    if not result:
        return f"{head}: no change"
    sections = sorted(result.sections(), key=_section_order)
    lines = [
        f"{head}: {result.changed:,} of {result.total:,} contexts change, in {len(sections)} way(s)",
        "(a context: architecture, backend with its environment, runtime, kv_cache_manager, timeout and features;"
        " what a line does not name may take any value)",
    ]
    for number, section in enumerate(sections, 1):
        decisions = _decision_lines(section.decisions, section, result) or ["decisions unchanged, diagnostics change"]
        lines += ["", f"[{number}] {section.count:,} contexts: {decisions[0]}"]
        lines += [f"    {line}" for line in decisions[1:]]
        if section.by_values is not None:
            where = describe_cube(section.by_values.restriction, result.dimensions)
            resolved = describe_resolved(section.by_values, result)
            who = "both versions resolve" if section.by_values.both else f"{result.old.version} resolves"
            lines.append(f"  when {where}")
            lines.append(f"   and {who} {resolved[0]}")
            lines += [f"    or {text}" for text in resolved[1:]]
        else:
            lines += _clause_lines(describe_group(section, result.dimensions), "when", "  ")
        for change in section.diagnostics:
            text = _diagnostic(change.sign, change.diagnostic)
            if change.restriction is not None:
                where = describe_cube(change.restriction, result.dimensions)
                lines.append(f"  {text}: where {where} ({change.count:,})")
            elif change.clauses is not None:
                lines.append(f"  {text}: in {change.count:,} of these contexts:")
                lines += _clause_lines(describe_clauses(change.clauses, result.dimensions), "when", "      ")
            else:
                lines.append(f"  {text}: in all")
    return "\n".join(lines)


def _json_value(value: Any) -> Any:
    return "<another value>" if value == "\x00other" else value


def to_json(result: Diff) -> dict[str, Any]:
    """Every changed context, with its group, for scripts.

    A context lists the value of every field; fields named in ``any`` may take any value (the one
    shown is the default)."""
    dimensions = result.dimensions
    groups = []
    contexts = []
    for number, group in enumerate(result.groups, 1):
        groups.append(
            {
                "group": number,
                "count": group.count,
                "change": group.change.to_dict(),
                "summary": change_lines(group, result),
                "description": describe_group(group, dimensions),
                "cubes": [
                    {d.name: [_json_value(v) for v in d.values if v in values] for d, values in zip(dimensions, cube)
                     if len(values) != len(d.values)}
                    for cube in group.cubes
                ],
            }
        )
        for cube in group.cubes:
            free = [d.name for d, values in zip(dimensions, cube) if len(values) == len(d.values)]
            axes = [
                [v for v in d.values if v in values] if len(values) != len(d.values) else [d.values[0]]
                for d, values in zip(dimensions, cube)
            ]
            for point in itertools.product(*axes):
                contexts.append({**_context(dimensions, point), "any": free, "group": number})
    sections = []
    for section in sorted(result.sections(), key=_section_order):
        entry: dict[str, Any] = {
            "summary": _decision_lines(section.decisions, section, result) or ["decisions unchanged, diagnostics change"],
            "count": section.count,
            "groups": [result.groups.index(g) + 1 for g in section.groups],
            "description": describe_group(section, dimensions),
            "diagnostics": [
                {
                    "change": change.sign,
                    "id": change.diagnostic[0],
                    "severity": change.diagnostic[1],
                    "decision": change.diagnostic[2],
                    "count": change.count,
                }
                for change in section.diagnostics
            ],
        }
        sections.append(entry)
    return {
        "old": {"version": result.old.version, "digest": result.old.digest, "path": result.old.path},
        "new": {"version": result.new.version, "digest": result.new.digest, "path": result.new.path},
        "total": result.total,
        "changed": result.changed,
        "sections": sections,
        "groups": groups,
        "contexts": contexts,
    }


def _context(dimensions: Any, point: tuple[Any, ...]) -> dict[str, Any]:
    ctx: dict[str, Any] = {"features": [], "env": {}}
    for dimension, value in zip(dimensions, point):
        name = dimension.name
        if name == "model":
            ctx["architecture"], ctx["model_type"] = value
        elif name.startswith("feature:"):
            if value:
                ctx["features"].append(name[8:])
        elif name.startswith("env:"):
            if value != "":
                ctx["env"][name[4:]] = _json_value(value)
        else:
            ctx[name] = value
    return ctx
