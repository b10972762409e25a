"""``kvpolicy diff OLD NEW``: what changed in the files, then every context two policy versions
resolve differently, grouped and attached to the part of the edit that causes it."""

from __future__ import annotations

import itertools
import json
from typing import Any

from ..analyse.describe import describe_group
from ..analyse.diff import Diff, diff_policies
from ..analyse.difftext import CONTEXT_NOTE, Entry, change_lines, decision_lines, edit_lines, entries, entry_of_group, headline
from ..wording import plural
from .common import POLICIES_DEFAULT, choose_policies, fail
from .policies import load_policy_argument

__all__ = ["register", "render_text", "to_json"]


def register(sub: Any) -> None:
    """Add ``diff``."""
    summary = "show what changed between two policy versions: the edit, then every context that resolves differently, grouped"
    parser = sub.add_parser("diff", help=summary, description=summary + ".")
    parser.add_argument("old", metavar="OLD", help="a policy file, a folder (its newest version) or a version id of --policy")
    parser.add_argument("new", metavar="NEW", help="the same, for the new side")
    parser.add_argument("--policy", metavar="DIR", help=f"the policy folder version ids are looked up in ({POLICIES_DEFAULT})")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--contexts",
        action="store_true",
        help="with --format json: also list every changed context and the exact sub-groups (grows with the contexts an edit touches)",
    )
    parser.add_argument("--exit-code", action="store_true", help="exit 1 when any context resolves differently")
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
    body, changed = _diffed(old, new, args.format, args.contexts)
    if args.format == "json":
        print(json.dumps({"policies": source.to_dict(), **body}, indent=1))
    else:
        print(source.describe())
        print(body)
    return 1 if args.exit_code and changed else 0


def _diffed(old: Any, new: Any, fmt: str, contexts: bool) -> tuple[Any, bool]:
    """The rendered diff of two versions and whether any context changes, from the results cache
    when the same two files (by content and path) were diffed by this same code before: a diff
    depends on nothing else, and computing one costs tenths of a second on the shipped history and
    seconds on large generated policies (more with ``--contexts``)."""
    from ..read.cache import cached_entry, code_fingerprint, digest, remember_entry

    key = digest(old.digest, new.digest, str(old.path), str(new.path), fmt, str(contexts), code_fingerprint())
    hit = cached_entry(_CACHE_KIND, key)
    if isinstance(hit, dict) and isinstance(hit.get("changed"), bool) and (isinstance(hit.get("text"), str) or isinstance(hit.get("json"), dict)):
        return (hit["json"] if fmt == "json" else hit["text"]), hit["changed"]
    result = diff_policies(old, new)
    body: Any = to_json(result, contexts=contexts) if fmt == "json" else render_text(result)
    remember_entry(_CACHE_KIND, key, {"changed": bool(result), ("json" if fmt == "json" else "text"): body})
    return body, bool(result)


_CACHE_KIND = "diff-1"


def render_text(result: Diff) -> str:
    """The change for a person: the edit first (what changed in the files), then one entry per
    way the decisions change, with the part of the edit it comes from, where it happens and which
    diagnostics come and go where."""
    found = entries(result)
    lines = [headline(result, len(found))]
    lines += edit_lines(result.edit, found)
    if not result.groups:
        return "\n".join(lines)
    lines.append(CONTEXT_NOTE)
    for entry in found:
        lines += ["", f"[{entry.number}] {plural(entry.count, 'context', grouped=True)}: {entry.title}", *entry.lines]
    return "\n".join(lines)


def _json_value(value: Any) -> Any:
    return "<another value>" if value == "\x00other" else value


def to_json(result: Diff, *, contexts: bool = False) -> dict[str, Any]:
    """The edit and the ways contexts change, for scripts: its size follows the edit, not the
    number of contexts it touches. ``contexts``: also every changed context (``contexts``) and the
    exact sub-groups they fall in (``subgroups``; one per way diagnostics come and go).

    A context lists the value of every field; fields named in ``any`` may take any value (the one
    shown is the default)."""
    dimensions = result.dimensions
    found = entries(result)
    edit = result.edit.to_dict()
    for entry in found:
        for number in entry.edits:
            edit["changes"][number - 1].setdefault("groups", []).append(entry.number)
    data: dict[str, Any] = {
        "old": {"version": result.old.version, "digest": result.old.digest, "path": result.old.path},
        "new": {"version": result.new.version, "digest": result.new.digest, "path": result.new.path},
        "headline": headline(result, len(found)),
        "edit": edit,
        "total": result.total,
        "changed": result.changed,
        "checkpoint_rules": [{"change": sign, "rule": text} for sign, text in result.checkpoint_changes],
        "sections": [_section(entry, result) for entry in found],
        "groups": [_group(entry, result, contexts) for entry in found],
    }
    if contexts:
        data["subgroups"], data["contexts"] = _subgroups(result, found, dimensions)
    return data


def _section(entry: Entry, result: Diff) -> dict[str, Any]:
    return {
        "section": entry.number,
        "edits": [f"E{n}" for n in entry.edits],
        "summary": decision_lines(entry.section.decisions, entry.section, result) or [entry.title],
        "count": entry.count,
        "groups": [entry.number],
        "lines": [entry.title, *entry.lines],
        "description": describe_group(entry.section, result.dimensions),
        "diagnostics": [
            {
                "change": change.sign,
                "id": change.diagnostic[0],
                "severity": change.diagnostic[1],
                "decision": change.diagnostic[2],
                "count": change.count,
            }
            for change in entry.section.diagnostics
        ],
    }


def _group(entry: Entry, result: Diff, contexts: bool) -> dict[str, Any]:
    """A way contexts change, as ``kvpolicy diff`` numbers it: one per section (contexts that
    differ only in which diagnostics come and go, which the section says where, are one group;
    ``--contexts`` lists the exact sub-groups)."""
    group: dict[str, Any] = {
        "group": entry.number,
        "count": entry.count,
        "edits": [f"E{n}" for n in entry.edits],
        "summary": decision_lines(entry.section.decisions, entry.section, result) or [entry.title],
        "starts_failing": entry.starts_failing,
        "stops_failing": entry.stops_failing,
    }
    if contexts:
        group["subgroups"] = list(entry.subgroups)
    return group


def _subgroups(result: Diff, found: list[Entry], dimensions: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every exact sub-group with its cubes, and every changed context (the leaves)."""
    owner = entry_of_group(result, found)
    subgroups = []
    contexts = []
    for index, group in enumerate(result.groups):
        number = index + 1
        subgroups.append(
            {
                "subgroup": number,
                "group": owner[index],
                "count": group.count,
                "change": group.change.to_dict(),
                "summary": change_lines(group, result),
                "description": describe_group(group, dimensions),
                "cubes": [
                    {d.name: [_json_value(v) for v in d.values if v in values] for d, values in zip(dimensions, cube) if len(values) != len(d.values)}
                    for cube in group.cubes
                ],
            }
        )
        for cube in group.cubes:
            free = [d.name for d, values in zip(dimensions, cube) if len(values) == len(d.values)]
            axes = [[v for v in d.values if v in values] if len(values) != len(d.values) else [d.values[0]] for d, values in zip(dimensions, cube)]
            for point in itertools.product(*axes):
                contexts.append({**_context(dimensions, point), "any": free, "group": owner[index], "subgroup": number})
    return subgroups, contexts


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
