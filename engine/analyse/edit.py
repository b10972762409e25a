"""What changed in the files between two policy versions, as a reviewer reads it.

A policy diff (:mod:`kvpolicy.analyse.diff`) says which contexts resolve differently; this module says what
was edited to get there: preference rows, rules, constraints, adjustments, decisions, features and
checkpoint rules added, removed or changed, each with its old and new fields, its reason, its
upstream source and where it is written. It reads the policy model only, never a resolution, so it
costs one pass over the two files' parts (linear in rows, also at 10,000 of them).

Parts are matched by what identifies them to the resolver, not by their place in the file: a
preference row by (decision, architecture, model_type), a rule by (decision, stage, id), a
decision's default by its decision (its id may change with its value), a constraint by id, a
feature by name, a checkpoint rule by id. Where order decides (conditional rules and adjustments:
the first that holds wins; checkpoint rules: the first that matches), a new order is a change too.

:attr:`EditChange.names` are the rule and diagnostic ids the part can decide or raise; the diff
uses them to attach each way contexts change to the parts of the edit that cause it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..read.model import CheckpointRule, Condition, Constraint, Decision, Notice, Policy, Row, Rule
from ..read.policyfile import display_path
from ..wording import plural

__all__ = ["EditChange", "PolicyEdit", "UNKNOWN_VALUE_OF", "edit_between"]

#: The name a rejected context's diagnostic goes by in :attr:`EditChange.names`: ``unknown-value``
#: of a decision (or of ``features``), whose accepted values an edit of the decision changes.
UNKNOWN_VALUE_OF = "unknown-value:{}"

#: Kinds in reading order, with the noun the headline counts them by.
_KINDS = {
    "decision": "decision",
    "requirement": "requirement",
    "preference": "preference",
    "row": "row",
    "conditional": "conditional rule",
    "default": "default",
    "adjustment": "adjustment",
    "constraint": "constraint",
    "feature": "feature",
    "checkpoint rule": "checkpoint rule",
}
_SIGNS = {"~": "changed", "+": "added", "-": "removed"}


@dataclass(frozen=True)
class EditChange:
    """One part of a policy added (``+``), removed (``-``) or changed (``~``)."""

    sign: str
    kind: str
    """``row``, ``requirement``, ``conditional``, ``default``, ``adjustment``, ``preference``,
    ``decision``, ``constraint``, ``feature`` or ``checkpoint rule``."""
    id: str
    """The rule, row, constraint or checkpoint rule id; the decision's or feature's name."""
    decision: str | None
    fields: tuple[tuple[str, Any, Any], ...]
    """(field, old, new): for ``~`` the fields that differ; for ``+`` / ``-`` what the part says
    (old or new is None)."""
    reason: str | None = None
    source: str | None = None
    location: str | None = None
    """``file:line`` of the part in NEW (in OLD for a removed one)."""
    names: frozenset[str] = field(default=frozenset(), compare=False)
    """Rule and diagnostic ids this part decides or raises, in either version."""

    def text(self) -> str:
        """``~ row runtime-preference[GptOssForCausalLM]: value PYTHON -> CPP``."""
        head = f"{self.sign} {self.kind} {self.id}"
        if self.decision is not None and self.kind not in ("row", "decision"):
            head += f" ({self.decision})"
        shown = []
        for name, old, new in self.fields:
            if name in ("reason", "source"):
                continue  # their own lines
            label = "" if name == "reads" else f"{name} "  # a checkpoint rule reads as a sentence
            if self.sign == "~":
                shown.append(f"{label}{_shown(old)} -> {_shown(new)}")
            else:
                shown.append(f"{label}{_shown(new if self.sign == '+' else old)}")
        return f"{head}: {'; '.join(shown)}" if shown else head

    def detail_lines(self) -> list[str]:
        """``reason: ...`` and ``source: ...`` (with what they were, where they changed)."""
        lines = []
        before = {name: old for name, old, _ in self.fields}
        for name in ("reason", "source"):
            value = getattr(self, name)
            if self.sign == "~" and name in before:
                lines.append(f"{name}: {_shown(value)} (was: {_shown(before[name])})")
            elif value:
                lines.append(f"{name}: {value}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "change": self.sign,
            "kind": self.kind,
            "id": self.id,
            "decision": self.decision,
            "fields": [{"field": name, "old": _plain(old), "new": _plain(new)} for name, old, new in self.fields],
            "reason": self.reason,
            "source": self.source,
            "location": self.location,
            "text": self.text(),
        }


@dataclass(frozen=True)
class PolicyEdit:
    """Every part two policy versions write differently, in reading order."""

    old_version: str
    new_version: str
    changes: tuple[EditChange, ...]

    def __bool__(self) -> bool:
        return bool(self.changes)

    def summary(self) -> str:
        """``1 row changed``, ``2 rows added, 1 constraint changed``; ``nothing changed in the rules``."""
        counts: dict[tuple[str, str], int] = {}
        for change in self.changes:
            counts[(change.kind, change.sign)] = counts.get((change.kind, change.sign), 0) + 1
        parts = [f"{plural(counts[(kind, sign)], noun)} {_SIGNS[sign]}" for kind, noun in _KINDS.items() for sign in _SIGNS if (kind, sign) in counts]
        return ", ".join(parts) if parts else "nothing changed in the rules"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (changes numbered ``E1``, ``E2``, ... as the text numbers them)."""
        return {
            "summary": self.summary(),
            "changes": [{"edit": f"E{i}", **c.to_dict()} for i, c in enumerate(self.changes, 1)],
        }


def edit_between(old: Any, new: Any) -> PolicyEdit:
    """What changed in the files from ``old`` to ``new`` (``Policy`` or ``PolicySet``)."""
    old = getattr(old, "policy", old)
    new = getattr(new, "policy", new)
    changes: list[tuple[tuple, EditChange]] = []
    order = {name: i for i, name in enumerate([*new.decision_order(), *(n for n in old.decision_order() if n not in new.decisions)])}
    for name in order:
        a, b = old.decisions.get(name), new.decisions.get(name)
        rank = order[name]
        changes += [((0, rank, *key), c) for key, c in _decision_changes(name, a, b)]
    changes += [((1, 0, *key), c) for key, c in _constraint_changes(old.constraints, new.constraints)]
    changes += [((2, 0, *key), c) for key, c in _feature_changes(old, new)]
    changes += [((3, 0, *key), c) for key, c in _checkpoint_changes(old.checkpoint_rules, new.checkpoint_rules)]
    changes.sort(key=lambda item: item[0])
    return PolicyEdit(old.version, new.version, tuple(c for _, c in changes))


# -- parts -----------------------------------------------------------------------------------------

_STAGE_RANK = {"decision": 0, "requirement": 1, "preference": 2, "row": 3, "conditional": 4, "default": 5, "adjustment": 6}


def _decision_changes(name: str, a: Decision | None, b: Decision | None) -> list[tuple[tuple, EditChange]]:
    found: list[tuple[tuple, EditChange]] = []
    unknown = frozenset([UNKNOWN_VALUE_OF.format(name)])
    if a is None or b is None:
        present = _present(a, b)
        sign = "+" if a is None else "-"
        fields: tuple[tuple[str, Any, Any], ...] = (("values", *_sides(sign, ", ".join(present.values))),)
        found.append(((0, 0, ""), EditChange(sign, "decision", name, name, fields, location=_where(present.location), names=unknown)))
        return found  # its rules come and go with it
    fields = _differing(
        ("values", ", ".join(a.values), ", ".join(b.values)),
        ("auto", a.auto, b.auto),
        ("null", a.null, b.null),
        ("null decides", a.null_decides, b.null_decides),
        ("left out", a.left_out, b.left_out),
        ("inputs", ", ".join(a.inputs), ", ".join(b.inputs)),
    )
    if fields:
        found.append(((0, 0, ""), EditChange("~", "decision", name, name, fields, location=_where(b.location), names=unknown)))
    for stage, before, after in (
        ("requirement", a.requirements, b.requirements),
        ("conditional", a.conditionals, b.conditionals),
        ("adjustment", a.adjustments, b.adjustments),
    ):
        found += [((_STAGE_RANK[stage], *key), c) for key, c in _rule_changes(stage, name, before, after)]
    found += [((_STAGE_RANK["default"], 0, ""), c) for c in _default_change(name, a.default, b.default)]
    found += _preference_changes(name, a, b)
    return found


_T = TypeVar("_T")


def _present(first: _T | None, second: _T | None) -> _T:
    """The side that has it, where only one does (the other is None)."""
    present = first if first is not None else second
    assert present is not None, "neither version has it"
    return present


def _rule_changes(stage: str, decision: str, before: Iterable[Rule], after: Iterable[Rule]) -> list[tuple[tuple, EditChange]]:
    old = {r.id: r for r in before}
    new = {r.id: r for r in after}
    found: list[tuple[tuple, EditChange]] = []
    for rule_id in old.keys() | new.keys():
        a, b = old.get(rule_id), new.get(rule_id)
        if a is None or b is None:
            present = _present(a, b)
            sign = "+" if a is None else "-"
            fields = tuple((n, *_sides(sign, v)) for n, v in _rule_fields(present) if v is not None)
            change = EditChange(sign, stage, rule_id, decision, fields, present.reason, present.source, _where(present.location), _rule_names(a, b))
            found.append(((_line(present), rule_id), change))
            continue
        fields = _differing(*((n, x, y) for (n, x), (_, y) in zip(_rule_fields(a), _rule_fields(b))), *_provenance(a, b))
        if fields:
            found.append(
                (
                    (_line(b), rule_id),
                    EditChange("~", stage, rule_id, decision, fields, b.reason, b.source, _where(b.location), _names_if_decisive(fields, _rule_names(a, b))),
                )
            )
    if stage in ("conditional", "adjustment"):  # the first that holds decides: order is meaning
        kept_old = [r.id for r in before if r.id in new]
        kept_new = [r.id for r in after if r.id in old]
        if kept_old != kept_new:
            names = frozenset(n for r in (*before, *after) for n in _rule_names(r, None))
            change = EditChange("~", stage, "order", decision, (("order", ", ".join(kept_old), ", ".join(kept_new)),), names=names)
            found.append(((0, ""), change))
    return found


def _default_change(decision: str, a: Rule, b: Rule) -> list[EditChange]:
    fields = _differing(("id", a.id, b.id), *((n, x, y) for (n, x), (_, y) in zip(_rule_fields(a), _rule_fields(b))), *_provenance(a, b))
    if not fields:
        return []
    return [EditChange("~", "default", b.id, decision, fields, b.reason, b.source, _where(b.location), _names_if_decisive(fields, _rule_names(a, b)))]


def _preference_changes(name: str, a: Decision, b: Decision) -> list[tuple[tuple, EditChange]]:
    found: list[tuple[tuple, EditChange]] = []
    pa, pb = a.preference, b.preference
    rows_a = _rows(pa.rows if pa is not None else ())
    rows_b = _rows(pb.rows if pb is not None else ())
    # A row that is not adopted raises the preference's notice: adding or changing one may too.
    notices = frozenset(n.id for n in (pa and pa.on_not_adopted, pb and pb.on_not_adopted) if n is not None)
    if (pa is None) != (pb is None) or (pa is not None and pb is not None):
        fields = _differing(
            ("adopt when", _condition(pa.adopt_when) if pa else None, _condition(pb.adopt_when) if pb else None),
            ("if not adopted", _notice(pa.on_not_adopted) if pa else None, _notice(pb.on_not_adopted) if pb else None),
            *(_provenance(pa, pb) if pa is not None and pb is not None else ()),
        )
        if fields:
            preference = _present(pb, pa)
            sign = "~" if pa is not None and pb is not None else ("+" if pa is None else "-")
            # Whether any row is adopted changes with these: every row's decisions may change.
            names = frozenset(r.id for r in (*rows_a.values(), *rows_b.values()))
            names |= notices
            found.append(
                (
                    (_STAGE_RANK["preference"], 0, ""),
                    EditChange(
                        sign,
                        "preference",
                        preference.id,
                        name,
                        fields,
                        preference.reason,
                        preference.source,
                        _where(preference.location),
                        _names_if_decisive(fields, names),
                    ),
                )
            )
    for key in rows_a.keys() | rows_b.keys():
        ra, rb = rows_a.get(key), rows_b.get(key)
        if ra is not None and rb is not None and (ra.value, ra.reason, ra.source) == (rb.value, rb.reason, rb.source):
            continue  # the usual case, 9,900 times in 10,000 rows: no tuples of fields to build
        if ra is None or rb is None:
            row = _present(ra, rb)
            sign = "+" if ra is None else "-"
            change = EditChange(
                sign, "row", row.id, name, (("value", *_sides(sign, row.value)),), row.reason, row.source, _where(row.location), notices | {row.id}
            )
            found.append(((_STAGE_RANK["row"], _line(row), row.id), change))
            continue
        fields = _differing(("value", ra.value, rb.value), *_provenance(ra, rb))
        if fields:
            change = EditChange(
                "~", "row", rb.id, name, fields, rb.reason, rb.source, _where(rb.location), _names_if_decisive(fields, notices | {ra.id, rb.id})
            )
            found.append(((_STAGE_RANK["row"], _line(rb), rb.id), change))
    return found


def _rows(rows: Iterable[Row]) -> dict[tuple[str, str | None], Row]:
    """The row the resolver uses for each (architecture, model_type): the first in file order."""
    found: dict[tuple[str, str | None], Row] = {}
    for row in rows:
        found.setdefault((row.architecture, row.model_type), row)
    return found


def _constraint_changes(before: Iterable[Constraint], after: Iterable[Constraint]) -> list[tuple[tuple, EditChange]]:
    old = {c.id: c for c in before}
    new = {c.id: c for c in after}
    found: list[tuple[tuple, EditChange]] = []

    def fields_of(c: Constraint) -> tuple[tuple[str, Any], ...]:
        return (("severity", c.severity), ("decision", c.decision), ("when", _condition(c.when)), ("message", c.message), ("fix", c.fix))

    for constraint_id in old.keys() | new.keys():
        a, b = old.get(constraint_id), new.get(constraint_id)
        if a is None or b is None:
            present = _present(a, b)
            sign = "+" if a is None else "-"
            fields = tuple((n, *_sides(sign, v)) for n, v in fields_of(present) if n in ("severity", "when"))
            found.append(
                (
                    (_line(present), constraint_id),
                    EditChange(
                        sign,
                        "constraint",
                        constraint_id,
                        present.decision,
                        fields,
                        present.reason,
                        present.source,
                        _where(present.location),
                        frozenset([constraint_id]),
                    ),
                )
            )
            continue
        fields = _differing(*((n, x, y) for (n, x), (_, y) in zip(fields_of(a), fields_of(b))), *_provenance(a, b))
        if fields:
            found.append(
                (
                    (_line(b), constraint_id),
                    EditChange(
                        "~",
                        "constraint",
                        constraint_id,
                        b.decision,
                        fields,
                        b.reason,
                        b.source,
                        _where(b.location),
                        _names_if_decisive(fields, frozenset([constraint_id])),
                    ),
                )
            )
    return found


def _feature_changes(old: Policy, new: Policy) -> list[tuple[tuple, EditChange]]:
    found: list[tuple[tuple, EditChange]] = []
    names = frozenset([UNKNOWN_VALUE_OF.format("features")])
    for feature in sorted(old.features.keys() | new.features.keys()):
        a, b = old.features.get(feature), new.features.get(feature)
        if a is None or b is None:
            present = _present(a, b)
            sign = "+" if a is None else "-"
            found.append(((0, feature), EditChange(sign, "feature", feature, None, (), location=_where(present.location), names=names)))
            continue
        fields = _differing(("env", a.env, b.env), ("config field", a.config_field, b.config_field))
        if fields:
            found.append(((0, feature), EditChange("~", "feature", feature, None, fields, location=_where(b.location))))
    return found


def _checkpoint_changes(before: tuple[CheckpointRule, ...], after: tuple[CheckpointRule, ...]) -> list[tuple[tuple, EditChange]]:
    old = {r.id: r for r in before}
    new = {r.id: r for r in after}
    found: list[tuple[tuple, EditChange]] = []

    def reads(rule: CheckpointRule) -> str:
        kind = {True: " (composite checkpoints)", False: " (text-only checkpoints)", None: ""}[rule.multimodal]
        return f"model_type {' or '.join(rule.model_type)}{kind} loads as {rule.architecture}"

    for rule_id in sorted(old.keys() | new.keys()):
        a, b = old.get(rule_id), new.get(rule_id)
        if a is None or b is None:
            present = _present(a, b)
            sign = "+" if a is None else "-"
            found.append(
                (
                    (1, rule_id),
                    EditChange(
                        sign,
                        "checkpoint rule",
                        rule_id,
                        None,
                        (("reads", *_sides(sign, reads(present))),),
                        present.reason,
                        present.source,
                        _where(present.location),
                    ),
                )
            )
            continue
        fields = _differing(("reads", reads(a), reads(b)), *_provenance(a, b))
        if fields:
            found.append(((1, rule_id), EditChange("~", "checkpoint rule", rule_id, None, fields, b.reason, b.source, _where(b.location))))
    kept_old = [r.id for r in before if r.id in new]
    kept_new = [r.id for r in after if r.id in old]
    if kept_old != kept_new:  # the first that matches wins
        found.append(((0, ""), EditChange("~", "checkpoint rule", "order", None, (("order", ", ".join(kept_old), ", ".join(kept_new)),))))
    return found


# -- fields ----------------------------------------------------------------------------------------


def _rule_fields(rule: Rule) -> tuple[tuple[str, Any], ...]:
    return (("value", rule.value), ("when", _condition(rule.when)), ("notice", _notice(rule.notice)))


def _rule_names(a: Rule | None, b: Rule | None) -> frozenset[str]:
    """A rule's ids, the parts of agreeing requirements' joint id, and its notice's id."""
    names: set[str] = set()
    for rule in (a, b):
        if rule is not None:
            names.add(rule.id)
            if rule.notice is not None:
                names.add(rule.notice.id)
    return frozenset(names)


#: Fields that never change how a context resolves: a part changed only in these causes nothing.
_WORDING = frozenset(["reason", "source", "message", "fix"])


def _names_if_decisive(fields: tuple[tuple[str, Any, Any], ...], names: frozenset[str]) -> frozenset[str]:
    """``names`` when a changed field can change a resolution, else none (a reworded reason)."""
    return names if any(name not in _WORDING for name, _, _ in fields) else frozenset()


def _provenance(a: Any, b: Any) -> tuple[tuple[str, Any, Any], ...]:
    return (("reason", a.reason, b.reason), ("source", a.source, b.source))


def _differing(*fields: tuple[str, Any, Any]) -> tuple[tuple[str, Any, Any], ...]:
    return tuple(f for f in fields if f[1] != f[2])


def _sides(sign: str, value: Any) -> tuple[Any, Any]:
    return (None, value) if sign == "+" else (value, None)


def _condition(condition: Condition) -> str:
    return str(condition)


def _notice(notice: Notice | None) -> str | None:
    return None if notice is None else f"{notice.severity} {notice.id}"


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, (str, int, bool)) else str(value)


def _line(part: Any) -> int:
    location = getattr(part, "location", None)
    return location.line if location is not None else 0


def _where(location: Any) -> str | None:
    """``file:line``, the file relative to the working directory when it lies under it."""
    if location is None:
        return None
    return f"{display_path(Path(location.path))}:{location.line}"
