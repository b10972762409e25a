"""``kvpolicy diff OLD NEW``: every context two policy versions resolve differently, grouped."""

from __future__ import annotations

import itertools
import json
from typing import Any

from ..diff import Diff, describe_group, diff_policies
from ..difftext import CONTEXT_NOTE, change_lines, checkpoint_lines, decision_lines, entries, headline, section_order
from ..wording import plural
from .common import POLICIES_DEFAULT, choose_policies, fail
from .policies import load_policy_argument

__all__ = ["register", "render_text", "to_json"]


def register(sub: Any) -> None:
    """Add ``diff``."""
    summary = "show every context two policy versions resolve differently, grouped by how it changes"
    parser = sub.add_parser("diff", help=summary, description=summary + ".")
    parser.add_argument("old", metavar="OLD", help="a policy file, a folder (its newest version) or a version id of --policy")
    parser.add_argument("new", metavar="NEW", help="the same, for the new side")
    parser.add_argument("--policy", metavar="DIR", help=f"the policy folder version ids are looked up in ({POLICIES_DEFAULT})")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--exit-code", action="store_true", help="exit 1 when anything changed")
    parser.set_defaults(run=run)


def run(args: Any) -> int:
    """Load both sides, diff them, print the result."""
    source = choose_policies(args.policy)
    if isinstance(source, int):
        return source
    old = load_policy_argument(args.old, source.path)
    if isinstance(old, str):
        return fail(f"OLD: {old}")
    new = load_policy_argument(args.new, source.path)
    if isinstance(new, str):
        return fail(f"NEW: {new}")
    result = diff_policies(old, new)
    if args.format == "json":
        print(json.dumps({"policies": source.to_dict(), **to_json(result)}, indent=1))
    else:
        print(source.describe())
        print(render_text(result))
    return 1 if args.exit_code and result else 0


def render_text(result: Diff) -> str:
    """The change for a person: one entry per way the decisions change, with where it happens
    and which diagnostics come and go where."""
    found = entries(result)
    lines = [headline(result, len(found))]
    lines += checkpoint_lines(result)
    if not result.groups:
        return "\n".join(lines)
    lines.append(CONTEXT_NOTE)
    for entry in found:
        lines += ["", f"[{entry.number}] {plural(entry.count, 'context', grouped=True)}: {entry.title}", *entry.lines]
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
    for section in sorted(result.sections(), key=section_order):
        entry: dict[str, Any] = {
            "summary": decision_lines(section.decisions, section, result) or ["decisions unchanged, diagnostics change"],
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
        "checkpoint_rules": [{"change": sign, "rule": text} for sign, text in result.checkpoint_changes],
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
