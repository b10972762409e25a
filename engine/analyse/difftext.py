"""How a diff reads: the edit first, then the entries and lines ``kvpolicy diff`` prints.

The edit (:mod:`kvpolicy.analyse.edit`: what changed in the files) comes first; each entry (a way the
decisions change) names the parts of the edit it comes from, found by the rule and diagnostic ids
its contexts are decided by or gain or lose, and the entries follow the edit's order. Shared by the
text output (:mod:`kvpolicy.cli.diff`), its JSON, the HTML report (:mod:`kvpolicy.report.page`) and
``kvpolicy impact``, so all show exactly the same headline, entries, counts and words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .describe import architectures_of, describe_clauses, describe_cube, describe_group, describe_resolved
from .diff import Diff
from .outcomes import ARCHITECTURE_SLOT, UNKNOWN_VALUE, Group, Section, concrete_rule
from .edit import UNKNOWN_VALUE_OF, PolicyEdit
from ..wording import plural

__all__ = [
    "Entry",
    "change_lines",
    "decision_lines",
    "diagnostic_line",
    "edit_lines",
    "entries",
    "entry_of_group",
    "headline",
    "section_order",
]

#: The second line of every text diff: what a context is.
CONTEXT_NOTE = (
    "(a context: architecture, backend with its environment, runtime, kv_cache_manager, timeout and features; what a line does not name may take any value)"
)


@dataclass(frozen=True)
class Entry:
    """One way the decisions change: a section of the diff as a person reads it."""

    number: int
    """1-based, in reading order (as ``kvpolicy diff`` numbers it)."""
    section: Section
    title: str
    """``transceiver_runtime CPP -> PYTHON (decided by ...)``: the first decision line."""
    lines: tuple[str, ...]
    """Every further line, indented as the text output indents it."""
    edits: tuple[int, ...]
    """The parts of the edit that cause it: 1-based positions in :attr:`Diff.edit` (``E1`` ...)."""
    subgroups: tuple[int, ...]
    """The 1-based numbers of its exact sub-groups (one per way diagnostics come and go), as
    ``diff --format json --contexts`` numbers them."""

    @property
    def count(self) -> int:
        """How many contexts change this way."""
        return self.section.count

    @property
    def starts_failing(self) -> int:
        """How many of its contexts gain an error."""
        return sum(g.count for g in self.section.groups if g.change.starts_failing)

    @property
    def stops_failing(self) -> int:
        """How many of its contexts lose an error."""
        return sum(g.count for g in self.section.groups if g.change.stops_failing)


def _rule(rule: str, group: Group | Section, result: Diff) -> str:
    if ARCHITECTURE_SLOT not in rule:
        return rule
    architectures = architectures_of(group, result.dimensions)
    return concrete_rule(rule, architectures[0]) if len(architectures) == 1 else rule.replace(ARCHITECTURE_SLOT, "<architecture>")


def decision_lines(decisions: Any, owner: Group | Section, result: Diff) -> list[str]:
    """One line per decision that changes (value or deciding rule)."""
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
        if d.old != d.new and d.old_rule == d.new_rule:
            # The same rule decides both: what changed is its value (a row's, say), not the rule.
            lines.append(f"{d.decision} {d.old} -> {d.new} (still decided by {new_rule}, whose value changed)")
        elif d.old != d.new:
            lines.append(f"{d.decision} {d.old} -> {d.new} (decided by {new_rule} instead of {old_rule})")
        else:
            lines.append(f"{d.decision} stays {d.new}, now decided by {new_rule} instead of {old_rule}")
    return lines


def diagnostic_line(sign: str, key: Any) -> str:
    """``+ error python-requires-nixl (transceiver_runtime)``."""
    id_, severity, decision = key
    return f"{sign} {severity} {id_}" + (f" ({decision})" if decision else "")


def change_lines(group: Group, result: Diff) -> list[str]:
    """What changes for one group, one line per decision or diagnostic."""
    lines = decision_lines(group.change.decisions, group, result)
    for sign, items in (("+", group.change.added), ("-", group.change.removed)):
        lines += [diagnostic_line(sign, key) for key in items]
    return lines


def clause_lines(clauses: list[list[str]], first: str, indent: str) -> list[str]:
    """Clauses as ``when A`` / ``  or B`` / `` and C`` lines."""
    lines = []
    for index, clause in enumerate(clauses):
        label = first if index == 0 else " and"
        lines.append(f"{indent}{label} {clause[0]}")
        lines += [f"{indent}  or {text}" for text in clause[1:]]
    return lines


def section_order(section: Section) -> tuple[Any, ...]:
    """Reading order: value changes first, then rule changes, then diagnostics only; larger first."""
    values_change = any(d.old != d.new for d in section.decisions)
    return (not values_change, not section.decisions, -section.count, [str(d) for d in section.decisions])


def headline(result: Diff, count: int) -> str:
    """``kvpolicy diff A -> B: 1 row changed; X of Y contexts change, in N ways`` (or ``no change``):
    what changed in the files first, then what it does."""
    head = f"kvpolicy diff {result.old.version} -> {result.new.version}"
    edit = result.edit
    if not result and not edit:
        return f"{head}: no change"
    what = f"{edit.summary()}; " if edit else ""
    if not result.groups:
        return f"{head}: {what}no context resolves differently"
    return f"{head}: {what}{result.changed:,} of {result.total:,} contexts change, in {plural(count, 'way')}"


def edit_lines(edit: PolicyEdit, found: list[Entry] | None = None, limit: int | None = None, details: bool = True) -> list[str]:
    """What changed in the files, one part at a time (``E1 ~ row ...: value PYTHON -> CPP``), each
    with its reason and source (``details``) and, given the diff's entries, the ways it changes
    contexts. ``limit``: at most that many parts, then how many more there are."""
    if not edit:
        return []
    ways: dict[int, list[int]] = {}
    for entry in found or ():
        for number in entry.edits:
            ways.setdefault(number, []).append(entry.number)
    lines = [f"the edit (what changed in the files): {edit.summary()}"]
    shown = edit.changes if limit is None else edit.changes[:limit]
    for number, change in enumerate(shown, 1):
        label = f"E{number}"
        where = f" ({change.location})" if change.location else ""
        lines.append(f"  {label} {change.text()}{where}")
        pad = " " * (len(label) + 3)
        if details:
            lines += [f"{pad}{line}" for line in change.detail_lines()]
        if number in ways:
            lines.append(f"{pad}changes contexts in {_numbers(ways[number], '[{}]')}")
    if len(shown) < len(edit.changes):
        lines.append(f"  and {len(edit.changes) - len(shown):,} more (kvpolicy diff lists them all)")
    return lines


def _numbers(numbers: list[int], form: str) -> str:
    """``[1]-[4]``, ``E1, E3 and E5-E7``: runs of consecutive numbers as ranges."""
    runs: list[tuple[int, int]] = []
    for n in sorted(set(numbers)):
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    parts = [form.format(a) if a == b else f"{form.format(a)}-{form.format(b)}" for a, b in runs]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _names(section: Section, result: Diff) -> set[str]:
    """The rule and diagnostic ids a section's contexts are decided by or gain or lose, with
    ``{architecture}`` templates written out for each architecture of the section."""
    names: set[str] = set()
    architectures: list[str | None] | None = None
    for d in section.decisions:
        for rule in (d.old_rule, d.new_rule):
            for part in rule.split("+"):  # agreeing requirements decide together
                if ARCHITECTURE_SLOT in part:
                    if architectures is None:
                        architectures = architectures_of(section, result.dimensions)
                    names.update(concrete_rule(part, a) for a in architectures if a is not None)
                elif part:
                    names.add(part)
    for change in section.diagnostics:
        id_, _, decision = change.diagnostic
        names.add(UNKNOWN_VALUE_OF.format(decision) if id_ == UNKNOWN_VALUE else id_)
    return names


def _causes(section: Section, result: Diff, index: dict[str, list[int]]) -> tuple[int, ...]:
    """The parts of the edit (0-based) whose rules decide the section's contexts in either
    version, or whose diagnostics come or go there."""
    found: set[int] = set()
    for name in _names(section, result):
        found.update(index.get(name, ()))
    return tuple(sorted(found))


def _from_line(numbers: tuple[int, ...], edit: PolicyEdit) -> str:
    if not numbers:
        return "  from the edit as a whole (no part of it decides these contexts on its own)"
    if len(numbers) == 1:
        change = edit.changes[numbers[0] - 1]
        return f"  from E{numbers[0]} ({change.kind} {change.id})"
    return f"  from {_numbers(list(numbers), 'E{}')} ({plural(len(numbers), 'part')} of the edit)"


def entry_of_group(result: Diff, found: list[Entry]) -> dict[int, int]:
    """The entry number of each exact group (by its 0-based index in ``result.groups``): the
    group a matrix cell or a listed context belongs to, as the diff numbers its ways."""
    return {sub - 1: entry.number for entry in found for sub in entry.subgroups}


def entries(result: Diff) -> list[Entry]:
    """Every section of the diff in reading order (by the part of the edit that causes it, then
    value changes first, larger first), with the lines the text output prints (worked out once
    per diff: the text, the JSON and the report's matrix all ask)."""
    found = result.__dict__.get("_entries")
    if found is None:
        found = result.__dict__["_entries"] = tuple(_entries(result))
    return list(found)


def _entries(result: Diff) -> list[Entry]:
    edit = result.edit
    index: dict[str, list[int]] = {}
    for position, change in enumerate(edit.changes):
        for name in change.names:
            index.setdefault(name, []).append(position)
    caused = [(section, _causes(section, result, index)) for section in result.sections()]
    caused.sort(key=lambda item: (item[1][:1] or (len(edit.changes),), section_order(item[0])))
    group_numbers = {id(g): n for n, g in enumerate(result.groups, 1)}
    found = []
    for number, (section, causes) in enumerate(caused, 1):
        decisions = decision_lines(section.decisions, section, result) or ["decisions unchanged, diagnostics change"]
        lines = [f"    {line}" for line in decisions[1:]]
        edits = tuple(c + 1 for c in causes)
        if edit:
            lines.append(_from_line(edits, edit))
        if section.by_values is not None:
            where = describe_cube(section.by_values.restriction, result.dimensions)
            resolved = describe_resolved(section.by_values, result.resolutions_seen(section.by_values.with_rules))
            who = "both versions resolve" if section.by_values.both else f"{result.old.version} resolves"
            lines.append(f"  when {where}")
            lines.append(f"   and {who} {resolved[0]}")
            lines += [f"    or {text}" for text in resolved[1:]]
        else:
            lines += clause_lines(describe_group(section, result.dimensions), "when", "  ")
        for diagnostic in section.diagnostics:
            text = diagnostic_line(diagnostic.sign, diagnostic.diagnostic)
            if diagnostic.restriction is not None:
                where = describe_cube(diagnostic.restriction, result.dimensions)
                lines.append(f"  {text}: where {where} ({diagnostic.count:,})")
            elif diagnostic.clauses is not None:
                lines.append(f"  {text}: in {diagnostic.count:,} of these contexts:")
                lines += clause_lines(describe_clauses(diagnostic.clauses, result.dimensions), "when", "      ")
            else:
                lines.append(f"  {text}: in all")
        subgroups = tuple(sorted(group_numbers[id(g)] for g in section.groups))
        found.append(Entry(number, section, decisions[0], tuple(lines), edits, subgroups))
    return found
