"""What a policy version decides for every architecture it names on every backend: the decision
matrix behind ``kvpolicy table`` and ``kvpolicy report``.

Rows and columns come from the policy model, never from a list kept here: the rows are the
architectures the policy names (preference rows and conditions; an architecture whose rows are
qualified by ``model_type`` also gets one row per model type) plus "any other architecture"; the
columns are the backend decision's ``auto`` request (``DEFAULT``) alone, ``DEFAULT`` with each
environment route its conditional defaults take (``TRTLLM_USE_UCX_KVCACHE=1``), and every
explicit backend, in the order of those routes. Every cell resolves with every other decision
``auto``, the default timeout and no features, as the serving config leaves them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..read.model import Condition, Constraint, Matcher, Policy, Preference, Row, Rule
from ..evaluate.policyset import PolicySet
from ..evaluate.resolution import Diagnostic, Resolution

__all__ = ["Cell", "Column", "Matrix", "Provenance", "cell_fields", "columns_of", "decision_matrix", "provenance_of", "rows_of"]

#: The decision whose request the columns vary.
BACKEND = "backend"


@dataclass(frozen=True)
class Column:
    """One requested backend, with the environment a ``DEFAULT`` request reads."""

    backend: str
    env: tuple[tuple[str, str], ...] = ()
    route: str | None = None
    """The id of the backend rule whose environment condition this column satisfies."""

    @property
    def label(self) -> str:
        """``NIXL``, ``DEFAULT``, ``DEFAULT + TRTLLM_USE_UCX_KVCACHE=1``."""
        return " + ".join([self.backend, *(f"{k}={v}" for k, v in self.env)])

    @property
    def env_label(self) -> str:
        """The environment alone (``''`` without one)."""
        return ", ".join(f"{k}={v}" for k, v in self.env)


@dataclass(frozen=True)
class Provenance:
    """Where a decision or diagnostic comes from: the rule, row or constraint, and why."""

    id: str
    kind: str
    """A rule's stage (``requirement``, ``conditional``, ``default``, ``adjustment``, ...), or
    ``preference``, ``constraint``, ``explicit``."""
    reason: str | None = None
    source: str | None = None
    location: str | None = None


@dataclass(frozen=True)
class Cell:
    """One architecture on one column: what the policy resolves."""

    architecture: str | None
    model_type: str | None
    column: Column
    resolution: Resolution
    provenance: Mapping[str, Provenance] = field(default_factory=dict)
    """Per decision: the rule that decided it."""

    @property
    def values(self) -> Mapping[str, str | None]:
        """The decided value of every decision."""
        return self.resolution.values

    @property
    def fails(self) -> bool:
        """Whether a server with this context cannot start (the resolution has errors)."""
        return not self.resolution.ok

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        """The errors that stop it from starting."""
        return self.resolution.errors


@dataclass(frozen=True)
class Matrix:
    """A policy version's decisions over architectures x requested backends."""

    version: str
    decisions: tuple[str, ...]
    values: Mapping[str, tuple[str, ...]]
    """Per decision, every value it can take (in the policy's order)."""
    rows: tuple[tuple[str | None, str | None], ...]
    """(architecture, model_type); (None, None) is every architecture the policy does not name."""
    columns: tuple[Column, ...]
    cells: Mapping[tuple[int, int], Cell]
    """(row index, column index) -> cell."""

    def cell(self, row: int, column: int) -> Cell:
        """The cell at a row and column index."""
        return self.cells[(row, column)]

    @property
    def failing(self) -> int:
        """How many cells cannot start."""
        return sum(1 for cell in self.cells.values() if cell.fails)


def _satisfying(matcher: Matcher) -> str:
    """A value the matcher accepts ("1" where it may: what people set these variables to)."""
    if not matcher.negate:
        return "1" if "1" in matcher.values else sorted(matcher.values)[0]
    for candidate in ("1", "0", "true", "false"):
        if candidate not in matcher.values:
            return candidate
    return "x" + max(matcher.values, key=len)


def _env_of(condition: Condition) -> tuple[tuple[str, str], ...]:
    return tuple((name, _satisfying(matcher)) for name, matcher in sorted(condition.env.items()))


def columns_of(policy: Policy, *, routes: bool = True) -> tuple[Column, ...]:
    """The requested backends: ``auto`` alone, ``auto`` with each environment route the backend
    decision's rules take (``routes``), then every explicit backend, ordered as those routes
    reach them (the default's value next, the rest as declared)."""
    decision = policy.decisions[BACKEND]
    rules = [rule for rule in policy.rules() if rule.decision == BACKEND]  # every stage, in precedence order
    columns = [Column(decision.auto)]
    if routes:
        seen: set[tuple[tuple[str, str], ...]] = set()
        for rule in rules:
            env = _env_of(rule.when)
            if env and env not in seen:
                seen.add(env)
                columns.append(Column(decision.auto, env, rule.id))
    reached = [rule.value for rule in rules if rule.value in decision.values]
    ordered = list(dict.fromkeys([*reached, *decision.values]))
    columns += [Column(value) for value in ordered]
    return tuple(columns)


def rows_of(policy: Policy, *, model_types: bool = True) -> tuple[tuple[str | None, str | None], ...]:
    """Every architecture the policy names, each followed by the model types its rows qualify
    (``model_types``), then (None, None) for any other architecture."""
    qualified: dict[str, set[str]] = {}
    for row in policy.rows():
        if row.model_type is not None:
            qualified.setdefault(row.architecture, set()).add(row.model_type)
    rows: list[tuple[str | None, str | None]] = []
    for architecture in policy.architectures():
        rows.append((architecture, None))
        if model_types:
            rows += [(architecture, t) for t in sorted(qualified.get(architecture, ()))]
    rows.append((None, None))
    return tuple(rows)


def _index(policy: Policy) -> dict[str, Rule | Row | Preference | Constraint]:
    found: dict[str, Any] = {}
    for rule in policy.rules():
        found[rule.id] = rule
    for decision in policy.decisions.values():
        if decision.preference is not None:
            found[decision.preference.id] = decision.preference
            for row in decision.preference.rows:
                found[row.id] = row
    for constraint in policy.constraints:
        found[constraint.id] = constraint
    return found


def provenance_of(policy: Policy, rule_id: str, index: Mapping[str, Any] | None = None) -> Provenance:
    """The rule, preference row or constraint ``rule_id`` names, with its reason and upstream
    source (a row without its own falls back to its table's); ``explicit`` and unknown ids get
    a bare :class:`Provenance`."""
    item = (index if index is not None else _index(policy)).get(rule_id)
    if item is None:
        return Provenance(rule_id, "explicit" if rule_id == "explicit" else "other")
    if isinstance(item, Row):
        table = next(d.preference for d in policy.decisions.values() if d.preference and item in d.preference.rows)
        return Provenance(rule_id, "preference", item.reason or table.reason, item.source or table.source, str(item.location))
    kind = item.stage if isinstance(item, Rule) else "preference" if isinstance(item, Preference) else "constraint"
    return Provenance(rule_id, kind, item.reason, item.source, str(item.location))


def cell_fields(policy: Any, architecture: str | None, model_type: str | None, column: Any) -> dict[str, Any]:
    """The context of one cell as ``resolve`` takes it: the column's backend and environment, the
    row's model, and every other decision on auto, written out (from TensorRT-LLM 1.4, #17495, a
    field left out is not auto)."""
    fields: dict[str, Any] = {BACKEND: column.backend, "env": dict(column.env)}
    fields.update({name: d.auto for name, d in policy.decisions.items() if name != BACKEND})
    if model_type is not None:
        fields["pretrained_config"] = {"architectures": [architecture], "model_type": model_type}
    else:
        fields["architecture"] = architecture
    return fields


def decision_matrix(
    policy_set: PolicySet,
    *,
    columns: tuple[Column, ...] | None = None,
    rows: tuple[tuple[str | None, str | None], ...] | None = None,
) -> Matrix:
    """Resolve every row on every column (defaults: :func:`rows_of`, :func:`columns_of`)."""
    policy = policy_set.policy
    columns = columns_of(policy) if columns is None else columns
    rows = rows_of(policy) if rows is None else rows
    index = _index(policy)
    cells: dict[tuple[int, int], Cell] = {}
    for r, (architecture, model_type) in enumerate(rows):
        for c, column in enumerate(columns):
            resolution = policy_set.resolve(**cell_fields(policy, architecture, model_type, column))
            provenance = {name: provenance_of(policy, rule, index) for name, rule in resolution.decided_by.items()}
            cells[(r, c)] = Cell(architecture, model_type, column, resolution, provenance)
    return Matrix(
        policy_set.version,
        tuple(policy_set.decisions),
        {name: tuple(d.values) for name, d in policy.decisions.items()},
        rows,
        columns,
        cells,
    )
