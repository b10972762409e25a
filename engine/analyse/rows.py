"""A decision's preference rows by model: which row the resolver picks for a model, and what the
diff compares of it.

A row's rule id names its architecture; its *key* (:func:`row_key`) keeps the id as a template
(see :func:`kvpolicy.analyse.outcomes.canonical_rule`), so models whose rows give the same value
have equal keys and resolve alike wherever the rows decide. :func:`row_index` makes finding every
model's row linear in rows.
"""

from __future__ import annotations

from ..read.model import Decision, Row
from .outcomes import canonical_rule

__all__ = ["RowIndex", "row_index", "row_key"]


#: Per architecture: its first plain row and its first row of each model_type (file order).
RowIndex = dict[str, tuple["Row | None", dict[str, Row]]]


def row_key(decision: Decision, architecture: str | None, model_type: str | None, index: RowIndex | None = None) -> tuple[str, str] | None:
    """What a model's preference row gives: (value, rule id as :func:`canonical_rule` makes it),
    or None when no row applies. Models with equal keys resolve alike wherever the rows decide."""
    row = _row_for(decision, architecture, model_type, index)
    return None if row is None else (row.value, canonical_rule(row.id, architecture))


def row_index(decision: Decision) -> RowIndex:
    """The preference rows of a decision by architecture, built in one pass over the rows, so
    that finding every model's row is linear in rows rather than quadratic."""
    index: RowIndex = {}
    if decision.preference is None:
        return index
    for row in decision.preference.rows:
        plain, qualified = index.get(row.architecture, (None, {}))
        if row.model_type is not None:
            qualified.setdefault(row.model_type, row)
        elif plain is None:
            plain = row
        index[row.architecture] = (plain, qualified)
    return index


def _row_for(decision: Decision, architecture: str | None, model_type: str | None, index: RowIndex | None = None) -> Row | None:
    """The preference row the resolver picks: a model_type-qualified row first, then the plain one
    (the first of each in file order). ``index`` (from :func:`row_index`) makes it a lookup."""
    if architecture is None or decision.preference is None:
        return None
    if index is not None:
        plain, qualified = index.get(architecture, (None, {}))
        return qualified.get(model_type, plain) if model_type is not None else plain
    plain = None
    for row in decision.preference.rows:
        if row.architecture != architecture:
            continue
        if row.model_type is not None:
            if row.model_type == model_type:
                return row
        elif plain is None:
            plain = row
    return plain
