"""How a diff reads: the entries and lines ``kvpolicy diff`` prints.

Shared by the text output (:mod:`kvpolicy.cli.diff`) and the HTML report
(:mod:`kvpolicy.report`), so both show exactly the same entries, counts and words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from .wording import plural

from .diff import (
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
)

__all__ = ["Entry", "change_lines", "decision_lines", "diagnostic_line", "entries", "headline", "section_order"]

#: The second line of every text diff: what a context is.
CONTEXT_NOTE = (
    "(a context: architecture, backend with its environment, runtime, kv_cache_manager, timeout and features;"
    " what a line does not name may take any value)"
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
    groups: tuple[int, ...]
    """The 1-based numbers of its groups, as ``diff --format json`` numbers them."""

    @property
    def count(self) -> int:
        """How many contexts change this way."""
        return self.section.count


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
        if d.old != d.new:
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


def checkpoint_lines(result: Diff) -> list[str]:
    """How the two versions read checkpoints differently (their checkpoint rules), or nothing."""
    if not result.checkpoint_changes:
        return []
    return [
        "checkpoints are read differently (upstream's load-time rewrites by model_type):",
        *(f"  {sign} {text}" for sign, text in result.checkpoint_changes),
    ]


def headline(result: Diff, count: int) -> str:
    """``kvpolicy diff A -> B: X of Y contexts change, in N ways`` (or ``no change``)."""
    head = f"kvpolicy diff {result.old.version} -> {result.new.version}"
    if not result:
        return f"{head}: no change"
    return f"{head}: {result.changed:,} of {result.total:,} contexts change, in {plural(count, 'way')}"


def entries(result: Diff) -> list[Entry]:
    """Every section of the diff in reading order, with the lines the text output prints."""
    found = []
    sections = sorted(result.sections(), key=section_order)
    for number, section in enumerate(sections, 1):
        decisions = decision_lines(section.decisions, section, result) or ["decisions unchanged, diagnostics change"]
        lines = [f"    {line}" for line in decisions[1:]]
        if section.by_values is not None:
            where = describe_cube(section.by_values.restriction, result.dimensions)
            resolved = describe_resolved(section.by_values, result)
            who = "both versions resolve" if section.by_values.both else f"{result.old.version} resolves"
            lines.append(f"  when {where}")
            lines.append(f"   and {who} {resolved[0]}")
            lines += [f"    or {text}" for text in resolved[1:]]
        else:
            lines += clause_lines(describe_group(section, result.dimensions), "when", "  ")
        for change in section.diagnostics:
            text = diagnostic_line(change.sign, change.diagnostic)
            if change.restriction is not None:
                where = describe_cube(change.restriction, result.dimensions)
                lines.append(f"  {text}: where {where} ({change.count:,})")
            elif change.clauses is not None:
                lines.append(f"  {text}: in {change.count:,} of these contexts:")
                lines += clause_lines(describe_clauses(change.clauses, result.dimensions), "when", "      ")
            else:
                lines.append(f"  {text}: in all")
        groups = tuple(result.groups.index(g) + 1 for g in section.groups)
        found.append(Entry(number, section, decisions[0], tuple(lines), groups))
    return found
