"""``kvpolicy report``: one self-contained HTML page for a person reviewing a policy change.

The page shows, for every version of a policy folder, the decision matrix (architecture x
requested backend, see :mod:`kvpolicy.analyse.matrix`), the timeline of versions, the change between two
versions exactly as ``kvpolicy diff`` computes it (:mod:`kvpolicy.analyse.difftext`), and, when serving
configs are given, how each of them resolves before and after (:mod:`kvpolicy.analyse.impact`).

Everything is inline (CSS, SVG, a few lines of vanilla JavaScript for filtering): the file opens
offline and is what a CI job attaches as an artifact. Colour is never the only signal: every
runtime, failure and change is written out, tables are real tables with header scopes, and the
print style keeps the colours and drops the controls.
"""

from __future__ import annotations

import datetime as _dt
import html
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..analyse.diff import Diff, diff_policies
from ..analyse.evaluators import outcome_of
from ..analyse.outcomes import ARCHITECTURE_SLOT, Change
from ..analyse.difftext import CONTEXT_NOTE, Entry, edit_lines, entries, entry_of_group, headline
from ..analyse.matrix import BACKEND, Cell, Matrix, Provenance, cell_fields, decision_matrix
from ..evaluate.policyset import PolicySet
from .assets import SCRIPT, stylesheet
from ..wording import plural

__all__ = ["MatrixView", "ReportInput", "cell_change", "render_report"]

#: The decision whose value colours a cell.
RUNTIME = "transceiver_runtime"
#: Impact statuses, worst first, and the class that colours them.
_STATUSES = (
    ("starts failing", "bad"),
    ("fails differently", "bad"),
    ("malformed", "bad"),
    ("architecture unknown", "warn"),
    ("runtime changes", "warn"),
    ("backend changes", "warn"),
    ("changes", "warn"),
    ("new warning", "warn"),
    ("stops failing", "good"),
    ("still failing", "bad"),
    ("unchanged", "same"),
)
_SIDE_LABELS = {"context_servers": "context", "generation_servers": "generation", "server": "server"}

#: How :mod:`kvpolicy.evaluate.domain` stands for an environment value no policy names.
_OTHER_ENV_VALUE = "\x00other"

Link = Callable[[str, "int | None"], str]


@dataclass(frozen=True)
class ReportInput:
    """What a report shows: the timeline's versions (oldest first), the two versions compared
    (``old`` None: no comparison), and the impact on configs (None: none given)."""

    versions: Sequence[PolicySet]
    new: PolicySet
    old: PolicySet | None = None
    impact: Sequence[Any] | None = None
    link: Link | None = None
    """``link(path, line)``: the href of a config file (default: the path itself, ``#L<line>``)."""
    generator: str = "kvpolicy"
    root: str | None = None
    """The folder paths are shown relative to (the working directory, say; None: as given). A path
    outside it is shown as given; every shown path keeps its full form in a ``title``."""


@dataclass(frozen=True)
class MatrixView:
    """A matrix with the change of every cell against a base version (and, for the compared
    pair, the ``kvpolicy diff`` group each changed cell belongs to)."""

    key: str
    matrix: Matrix
    policy_set: PolicySet
    base: PolicySet | None
    changes: dict[tuple[int, int], Change]
    groups: dict[tuple[int, int], int]
    """(row, column) -> 1-based group number, as ``kvpolicy diff --format json`` numbers it."""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


_URL = re.compile(r"https?://[^\s<>\"')\]]+")


def _source(text: str | None) -> str:
    """An upstream source as HTML: escaped, with its URLs (a pull request, a commit) as links."""
    if not text:
        return "—"
    out, last = [], 0
    for match in _URL.finditer(text):
        url = match.group(0).rstrip(".,;:")
        out.append(_e(text[last : match.start()]))
        out.append(f'<a href="{_e(url)}" rel="noreferrer">{_e(url)}</a>')
        last = match.start() + len(url)
    out.append(_e(text[last:]))
    return "".join(out)


def _full(path: str, root: str | None) -> str:
    """``path`` as an absolute path (joined to ``root`` when relative and a root is known)."""
    if root is None or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(root, path))


def _relative(path: str, root: str | None) -> str:
    """``path`` relative to ``root`` when it lies inside it, else as given: absolute paths made a
    wide table wider and told a reviewer nothing the repository does not."""
    if root is None or not os.path.isabs(path):
        return path
    inside = os.path.relpath(path, root)
    return path if inside == os.pardir or inside.startswith(os.pardir + os.sep) else inside


def _shorten(text: str, root: str | None) -> str:
    """Free text (a location, a message) with the root's own prefix taken off the paths it names."""
    folder = (root or "").rstrip(os.sep)
    return text.replace(folder + os.sep, "") if folder else text  # never for "/": every slash would go


def _path(path: str, root: str | None) -> str:
    """A path as HTML: short where a root allows, whole on hover."""
    return f'<span title="{_e(_full(path, root))}">{_breakable(_relative(path, root))}</span>'


def _breakable(path: str) -> str:
    """A path as HTML that may wrap after each slash (a narrow column breaks it between folders)."""
    return _e(path).replace("/", "/<wbr>")


def cell_change(cell: Cell, policy_set: PolicySet, base: PolicySet) -> Change | None:
    """How the cell's context resolves differently under ``base`` (None: alike), compared as
    ``kvpolicy diff`` compares contexts (values, deciding rules, diagnostics)."""
    context = policy_set.normalise(**cell_fields(policy_set.policy, cell.architecture, cell.model_type, cell.column))
    new, old = outcome_of(policy_set, context), outcome_of(base, context)
    return None if new == old else Change.between(old, new)


def _point(cell: Cell, policy_set: PolicySet, result: Diff) -> tuple[Any, ...] | None:
    """The cell's context as a point of the diff's dimensions (None: outside them)."""
    context = policy_set.normalise(**cell_fields(policy_set.policy, cell.architecture, cell.model_type, cell.column))
    point = []
    for dimension in result.dimensions:
        name = dimension.name
        if name == "model":
            value: Any = (context["architecture"], context.get("model_type"))
        elif name.startswith("env:"):
            value = context["env"].get(name[4:], "")
            if value not in dimension.values:  # a value no policy names: its stand-in, else unset
                value = _OTHER_ENV_VALUE if _OTHER_ENV_VALUE in dimension.values else ""
        elif name.startswith("feature:"):
            value = name[8:] in context["features"]
        else:
            value = context.get(name)
        if value not in dimension.values:
            return None
        point.append(value)
    return tuple(point)


def _view(key: str, policy_set: PolicySet, base: PolicySet | None, result: Diff | None) -> MatrixView:
    matrix = decision_matrix(policy_set)
    changes: dict[tuple[int, int], Change] = {}
    groups: dict[tuple[int, int], int] = {}
    # A cell names the way it changes as the diff numbers it (the entry of its exact group).
    numbers = entry_of_group(result, entries(result)) if result is not None else {}
    for at, cell in matrix.cells.items():
        if base is None:
            continue
        change = cell_change(cell, policy_set, base)
        if change is not None:
            changes[at] = change
        if result is not None:
            point = _point(cell, policy_set, result)
            group = result.group_of(point) if point is not None else None
            if group is not None:
                groups[at] = numbers[result.groups.index(group)]
    return MatrixView(key, matrix, policy_set, base, changes, groups)


def _date(policy_set: PolicySet) -> _dt.date | None:
    """The day a version reproduces: its id when it is a date, else a date in its ``source``."""
    for text in (policy_set.version, policy_set.policy.source):
        match = re.search(r"(\d{4})[.-](\d{2})[.-](\d{2})", text)
        if match:
            try:
                return _dt.date(*map(int, match.groups()))
            except ValueError:
                continue
    return None


def _same(a: PolicySet, b: PolicySet) -> bool:
    return a.version == b.version and a.digest == b.digest


# -- page --------------------------------------------------------------------------------------------


#: The most a page may weigh before the matrices of versions not compared are shown compact.
BUDGET = 2 * 1024 * 1024


def render_report(data: ReportInput, *, budget: int = BUDGET) -> str:
    """The whole page as one string of HTML.

    When the page would weigh more than ``budget`` bytes (a folder with many versions), the
    matrices of the versions not compared keep their labels, marks and hover text but lose the
    per-cell rule lists (their rules tables stay); the page says so."""
    prepared = _prepare(data)
    page = _render(data, prepared, compact=False)
    if len(page.encode("utf-8")) > budget:
        page = _render(data, prepared, compact=True)
    if len(page.encode("utf-8")) > budget:  # many versions: compact cells lose their hover text too
        page = _render(data, prepared, compact=True, titles=False)
    return page


@dataclass(frozen=True)
class _Prepared:
    versions: list[PolicySet]
    result: Diff | None
    found: list[Entry]
    views: list[MatrixView]
    current: MatrixView


def _prepare(data: ReportInput) -> _Prepared:
    """Everything the page shows, resolved once."""
    versions = list(data.versions)
    if not any(_same(v, data.new) for v in versions):
        versions.append(data.new)
    old = data.old
    result = diff_policies(old, data.new) if old is not None else None
    found = entries(result) if result else []
    views: list[MatrixView] = []
    for index, policy_set in enumerate(versions):
        if _same(policy_set, data.new):
            views.append(_view(f"m{index}", policy_set, old, result))
        else:
            views.append(_view(f"m{index}", policy_set, versions[index - 1] if index else None, None))
    if old is not None and not any(_same(v, old) for v in versions):
        views.insert(0, _view("base", old, None, None))
    current = next(v for v in views if _same(v.policy_set, data.new))
    return _Prepared(versions, result, found, views, current)


def _render(data: ReportInput, prepared: _Prepared, *, compact: bool, titles: bool = True) -> str:
    versions, result, found, views, current = (prepared.versions, prepared.result, prepared.found, prepared.views, prepared.current)
    old = data.old
    title = f"kvpolicy report: {old.version} → {data.new.version}" if old is not None else f"kvpolicy report: {data.new.version}"
    parts = [
        "<!doctype html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta name="generator" content="{_e(data.generator)}">',
        f"<title>{_e(title)}</title>",
        f"<style>{stylesheet(max(len(v.matrix.values.get(RUNTIME, ())) for v in views))}</style>",
        "</head>",
        "<body>",
        '<a class="skip" href="#matrix">Skip to the decision matrix</a>',
        "<header>",
        f"<h1>{_e(title)}</h1>",
        '<nav aria-label="Sections"><ul>'
        '<li><a href="#summary">Summary</a></li><li><a href="#matrix">Decision matrix</a></li>'
        '<li><a href="#timeline">History</a></li>'
        + ('<li><a href="#diff">Diff</a></li>' if result is not None else "")
        + ('<li><a href="#impact">Impact</a></li>' if data.impact is not None else "")
        + "</ul></nav>",
        "</header>",
        "<main>",
        _summary(data, current, result, len(found)),
        _matrices(views, current, compact, old, titles),
        _timeline(versions, data.new, old),
    ]
    if result is not None:
        parts.append(_diff(result, found))
    if data.impact is not None and old is not None:
        parts.append(_impact(data.impact, old.version, data.new.version, data.link, data.root))
    parts += [
        "</main>",
        f"<footer><p>Generated by {_e(data.generator)}. Every cell resolves with runtime and KV-cache manager "
        "<code>auto</code>, the default timeout and no features; <code>kvpolicy explain --arch NAME --backend B</code> "
        "prints every step of one.</p></footer>",
        f"<script>{SCRIPT}</script>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


def _summary(data: ReportInput, current: MatrixView, result: Diff | None, sections: int) -> str:
    m = current.matrix
    items = [("policy", f"{data.new.version} ({data.new.digest[:12]}), {_path(str(data.new.path), data.root)}")]
    if data.old is not None:
        items.insert(0, ("compared with", f"{data.old.version} ({data.old.digest[:12]}), {_path(str(data.old.path), data.root)}"))
    items.append(
        ("matrix", f"{len(m.rows)} architectures × {len(m.columns)} requested backends; <strong>{m.failing}</strong> of {len(m.cells)} cells cannot start")
    )
    if result is not None:
        items.append(("diff", _e(headline(result, sections))))
        values = sum(1 for c in current.changes.values() if c.values_change)
        items.append(
            (
                "matrix changes",
                f"{len(current.changes)} cells resolve differently from {data.old.version}"  # type: ignore[union-attr]  # a diff result exists only when data.old does
                f" ({values} change a value)",
            )
        )
    if data.impact is not None and data.old is not None:
        items.append(("impact", _e(_impact_counts(data.impact)) or "no configs read"))
    rows = "".join(f"<div><dt>{label}</dt><dd>{text}</dd></div>" for label, text in items)
    return f'<section id="summary" aria-labelledby="summary-h"><h2 id="summary-h">Summary</h2><dl class="summary">{rows}</dl></section>'


#: Horizontal room per version on the timeline. Labels alternate above and below the axis, so a
#: label may use two steps: 15 versions fit a 1,000 px window; more scroll inside their own box.
_TIMELINE_STEP = 58
_TIMELINE_AXIS = 62


def _timeline(versions: list[PolicySet], new: PolicySet, old: PolicySet | None) -> str:
    count = len(versions)
    step = _TIMELINE_STEP if count > 6 else 2 * _TIMELINE_STEP  # few versions: room to spare
    width = max(640, 128 + step * (count - 1))
    axis = _TIMELINE_AXIS
    svg = [
        f'<svg class="timeline" viewBox="0 0 {width} {2 * axis}" width="{width}" height="{2 * axis}" role="img" aria-labelledby="timeline-t">',
        f'<title id="timeline-t">Timeline of {count} policy versions, oldest first</title>',
        f'<line x1="24" y1="{axis}" x2="{width - 24}" y2="{axis}" class="axis"/>',
    ]
    for index, policy_set in enumerate(versions):
        x = 64 + index * step
        role = "to" if _same(policy_set, new) else "from" if old is not None and _same(policy_set, old) else ""
        date = _date(policy_set)
        # The day only where the version id does not already say it.
        day = date.isoformat() if date and date.isoformat() != policy_set.version.replace(".", "-") else ""
        above = index % 2 == 0
        version_y, date_y = (axis - 38, axis - 22) if above else (axis + 32, axis + 48)
        tick = (axis - 16, axis - 10) if above else (axis + 10, axis + 16)
        svg.append(
            f'<a href="#version-{index}" data-version="{_e(policy_set.version)}">'
            f'<line x1="{x}" y1="{tick[0]}" x2="{x}" y2="{tick[1]}" class="tick"/>'
            f'<circle cx="{x}" cy="{axis}" r="{9 if role else 6}" class="dot {role}"/>'
            f'<text x="{x}" y="{version_y}" text-anchor="middle" class="v">{_e(policy_set.version)}</text>'
            f'<text x="{x}" y="{date_y}" text-anchor="middle" class="d">{_e(" · ".join(filter(None, (day, role))))}</text></a>'
        )
    svg.append("</svg>")
    items = []
    for index, policy_set in enumerate(versions):
        date = _date(policy_set)
        role = " (compared: to)" if _same(policy_set, new) else " (compared: from)" if old is not None and _same(policy_set, old) else ""
        items.append(
            f'<li id="version-{index}"><strong>{_e(policy_set.version)}</strong>{_e(role)}'
            + (f' <time datetime="{date.isoformat()}">{date.isoformat()}</time>' if date else "")
            + f'<br>{_e(policy_set.policy.summary)}<br><span class="src">upstream: {_source(policy_set.policy.source)}</span>'
            f' <a href="#matrix-{_key_of(index)}" data-show="{_key_of(index)}">matrix</a></li>'
        )
    return (
        '<section id="timeline" aria-labelledby="timeline-h"><h2 id="timeline-h">History of the policy</h2>'
        f'<div class="scroll timeline-box" tabindex="0" role="group" aria-label="timeline (scrolls sideways when narrow)">'
        f'{"".join(svg)}</div><ol class="versions">{"".join(items)}</ol></section>'
    )


def _key_of(index: int) -> str:
    return f"m{index}"


def _matrices(views: list[MatrixView], current: MatrixView, compact: bool, old: PolicySet | None, titles: bool = True) -> str:
    options = "".join(
        f'<option value="{v.key}"{" selected" if v is current else ""}>{_e(v.matrix.version)}{" (base)" if v.key == "base" else ""}</option>' for v in views
    )
    runtime_values = current.matrix.values.get(RUNTIME, ())
    legend = "".join(
        f'<li><span class="swatch rt-{i}" aria-hidden="true"></span>{_e(value)}: runtime {_e(value)}</li>' for i, value in enumerate(runtime_values)
    )
    legend += (
        '<li><span class="mark fail">✖ fails</span>: cannot start (an error in the resolution)</li>'
        '<li><span class="mark chg">▲ was …</span>: a value differs from the version named above the table</li>'
        '<li><span class="mark chg-minor">▲ rule changed</span>: same values, another deciding rule or other notes</li>'
        "<li><em>on UCX</em>: the effective backend a DEFAULT request resolves to</li>"
    )
    controls = (
        '<form class="controls" onsubmit="return false">'
        f'<label>Version <select id="version-select">{options}</select></label>'
        '<label>Architecture <input id="arch-filter" type="search" placeholder="filter, e.g. Llama"></label>'
        '<label><input id="only-changed" type="checkbox"> only rows that change</label>'
        '<label><input id="only-failing" type="checkbox"> only rows that cannot start somewhere</label>'
        "</form>"
    )
    compared = {id(current)} | {id(v) for v in views if old is not None and _same(v.policy_set, old)}
    body = "".join(_matrix(v, v is current, compact and id(v) not in compared, titles) for v in views)
    return (
        '<section id="matrix" aria-labelledby="matrix-h"><h2 id="matrix-h">Decision matrix</h2>'
        "<p>What each version resolves for every architecture it names on every requested backend: the runtime "
        "(colour and name), the KV-cache manager, and a mark where the server cannot start. Open a cell for the "
        "rules that decided it; hover for the upstream change behind each (the rules table has the full sources).</p>"
        f'{controls}<ul class="legend" aria-label="Legend">{legend}</ul>{body}</section>'
    )


def _matrix(view: MatrixView, current: bool, compact: bool = False, titles: bool = True) -> str:
    m = view.matrix
    rules: dict[str, Provenance] = {}
    for cell in m.cells.values():
        for provenance in cell.provenance.values():
            rules.setdefault(provenance.id, provenance)
    for cell in m.cells.values():
        for error in cell.errors:
            rules.setdefault(error.id, Provenance(error.id, "constraint", error.message, None, error.location))
    # Constraints carry their upstream source in the model; look them up once.
    index = {c.id: c for c in view.policy_set.policy.constraints}
    for rule_id, provenance in list(rules.items()):
        if provenance.kind == "constraint" and rule_id in index:
            c = index[rule_id]
            rules[rule_id] = Provenance(rule_id, "constraint", c.reason or provenance.reason, c.source, str(c.location))
    anchors = {rule_id: f"{view.key}-r{i}" for i, rule_id in enumerate(rules)}
    if view.base is None:
        caption_change = "no earlier version to compare with"
    else:
        caption_change = f"changes marked against {view.base.version}"
    autos = [f"{name} {view.policy_set.policy.decisions[name].auto}" for name in m.decisions if name != BACKEND]
    caption = (
        f"Policy {_e(m.version)}: {', '.join(map(_e, autos))}, default timeout, no features; "
        f"{_e(caption_change)}. {m.failing} of {len(m.cells)} cells cannot start."
        + (
            (
                " Shown compact to keep the page small: hover a cell for the rules that decided it; the table below has their sources."
                if titles
                else " Shown compact to keep the page small: the table below lists the rules behind these cells."
            )
            if compact
            else ""
        )
    )
    auto_columns = [c for c in m.columns if c.backend == view.policy_set.policy.decisions[BACKEND].auto]
    head1 = ['<th scope="col" rowspan="2">architecture</th>']
    if auto_columns:
        head1.append(f'<th scope="colgroup" colspan="{len(auto_columns)}">{_e(auto_columns[0].backend)} (no backend set), by environment</th>')
    head1 += [f'<th scope="col" rowspan="2">{_e(c.backend)}</th>' for c in m.columns if c not in auto_columns]
    head2 = [f'<th scope="col" class="env">{_wrap(c.env_label) if c.env else "no variable set"}</th>' for c in auto_columns]
    body = []
    for r, (architecture, model_type) in enumerate(m.rows):
        name = architecture or "any other architecture"
        label = _e(name) + (f"<br><small>model_type {_e(model_type)}</small>" if model_type else "")
        cells = [_cell(view, r, c, anchors, compact, titles) for c in range(len(m.columns))]
        changed = any((r, c) in view.changes for c in range(len(m.columns)))
        fails = any(m.cell(r, c).fails for c in range(len(m.columns)))
        body.append(
            f'<tr data-arch="{_e(name)}" data-model-type="{_e(model_type or "")}" data-changed="{int(changed)}" data-fails="{int(fails)}">'
            f'<th scope="row">{label}</th>{"".join(cells)}</tr>'
        )
    rule_rows = "".join(
        f'<tr id="{anchors[p.id]}"><th scope="row"><code>{_e(p.id)}</code></th><td>{_e(p.kind)}</td>'
        f"<td>{_e(p.reason or '—')}</td><td>{_source(p.source)}</td><td><code>{_e(p.location or '')}</code></td></tr>"
        for p in rules.values()
    )
    return (
        f'<div class="version-matrix" id="matrix-{view.key}" data-key="{view.key}" data-version="{_e(m.version)}"'
        f' data-current="{int(current)}" data-compact="{int(compact)}">'
        f'<h3>Version {_e(m.version)}</h3><div class="scroll"><table class="matrix">'
        f"<caption>{caption}</caption><thead><tr>{''.join(head1)}</tr><tr>{''.join(head2)}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
        f'<details class="rules"><summary>Rules and constraints behind these cells ({len(rules)})</summary>'
        '<table><thead><tr><th scope="col">id</th><th scope="col">kind</th><th scope="col">reason</th>'
        f'<th scope="col">upstream source</th><th scope="col">where</th></tr></thead><tbody>{rule_rows}</tbody></table>'
        "</details></div>"
    )


def _wrap(text: str) -> str:
    """Allow long variable names to break after underscores."""
    return _e(text).replace("_", "_<wbr>")


def _cell(view: MatrixView, r: int, c: int, anchors: dict[str, str], compact: bool = False, titles: bool = True) -> str:
    m = view.matrix
    cell = m.cell(r, c)
    values = cell.values
    runtime = values.get(RUNTIME)
    runtime_values = m.values.get(RUNTIME, ())
    colour = runtime_values.index(runtime) if runtime in runtime_values else "none"
    change = view.changes.get((r, c))
    group = view.groups.get((r, c))
    classes = ["cell", f"rt-{colour}"] + (["fails"] if cell.fails else [])
    if change is not None:
        classes.append("changed" if change.values_change else "touched")
    attributes = {
        "data-backend": cell.column.backend,
        "data-env": cell.column.env_label,
        "data-errors": " ".join(d.id for d in cell.errors),
        **{f"data-d-{name}": "" if value is None else value for name, value in values.items()},
    }
    if change is not None:
        attributes["data-change"] = _change_kind(change)
    if group is not None:
        attributes["data-group"] = str(group)
    # The upstream change only (the source up to its first ": "): the full source stands once in the
    # rules table under the matrix, not in each of thousands of cells (the page stays under 2 MB).
    # A compact matrix names the rule only (its rules table below has the rest).
    hover = [
        f"{name} {value} by {p.id}" + (f" ({_change_cited(p.source)})" if p.source and not compact else "")
        for name, value in values.items()
        if (p := cell.provenance.get(name)) is not None and not (compact and name == BACKEND)
    ]  # compact: the column names the backend already
    hover += [f"cannot start: {d.id}" for d in cell.errors]
    if titles or not compact:
        attributes["title"] = "\n".join(hover)
    summary = [f'<b class="rt">{_e(runtime or "off")}</b>']
    for name in m.decisions:
        if name not in (BACKEND, RUNTIME) and values.get(name) is not None:
            summary.append(f'<span class="kvm">{_e(values[name])}</span>')
    if cell.column.backend == view.policy_set.policy.decisions[BACKEND].auto and values.get(BACKEND):
        summary.append(f'<em class="eff">on {_e(values[BACKEND])}</em>')
    if cell.fails:
        summary.append('<span class="mark fail">✖ fails</span>')
    if change is not None:
        kind = "chg" if change.values_change else "chg-minor"
        summary.append(f'<span class="mark {kind}">▲ {_e(_change_label(change, view.base.version))}</span>')  # type: ignore[union-attr]  # a change exists only against a base version
    why = [
        f'<li>{_e(name)} <b>{_e(value)}</b> by <a href="#{anchors[p.id]}">{_e(p.id)}</a> <small>({_e(p.kind)})</small></li>'
        if p.id in anchors
        else f"<li>{_e(name)} <b>{_e(value)}</b> ({_e(p.id)})</li>"
        for name, value in values.items()
        if (p := cell.provenance.get(name)) is not None
    ]
    why += [f'<li class="err">✖ <a href="#{anchors[d.id]}">{_e(d.id)}</a>: {_e(d.message)}</li>' for d in cell.errors]
    if change is not None:
        # Rule ids are compared as templates; in one cell the architecture is known.
        lines = [line.replace(ARCHITECTURE_SLOT, cell.architecture or "?") for line in change.summary()]
        why += [f'<li class="chg">since {_e(view.base.version)}: {_e(line)}</li>' for line in lines]  # type: ignore[union-attr]  # a change exists only against a base version
    if group is not None:
        why.append(f'<li>diff group <a href="#diff-group-{group}">[{group}]</a></li>')
    attrs = "".join(f' {k}="{_e(v)}"' for k, v in attributes.items())
    if compact:
        return f'<td class="{" ".join(classes)}"{attrs}>{" ".join(summary)}</td>'
    return f'<td class="{" ".join(classes)}"{attrs}><details><summary>{" ".join(summary)}</summary><ul class="why">{"".join(why)}</ul></details></td>'


def _change_cited(source: str) -> str:
    """The upstream change a source cites, as short as it reads: ``#16164 (merged 2026-07-16)``."""
    cited = source.split(": ", 1)[0]
    return cited.removeprefix("NVIDIA/TensorRT-LLM ")


def _change_kind(change: Change) -> str:
    if change.values_change:
        return "value"
    if change.starts_failing or change.stops_failing:
        return "start-up"
    return "rule" if change.decisions else "notes"


def _change_label(change: Change, base: str) -> str:
    if change.values_change:
        was = "/".join(str(d.old) for d in change.decisions if d.old != d.new)
        return f"was {was}"
    if change.starts_failing:
        return f"fails since {base}"
    if change.stops_failing:
        return "no longer fails"
    return "rule changed" if change.decisions else "notes changed"


def _diff(result: Diff, found: list[Entry]) -> str:
    head = f'<p class="headline">{_e(headline(result, len(found)))}</p>'
    edit = edit_lines(result.edit, found)
    if edit:
        # What changed in the files, as ``kvpolicy diff`` prints it first.
        head += f'<pre class="edit">{_e(chr(10).join(edit))}</pre>'
    if not result.groups:
        return f'<section id="diff" aria-labelledby="diff-h"><h2 id="diff-h">Diff</h2>{head}</section>'
    articles = []
    for entry in found:
        articles.append(
            f'<article class="entry" id="diff-entry-{entry.number}" data-count="{entry.count}">'
            f"<h3>[{entry.number}] {plural(entry.count, 'context', grouped=True)}: {_e(entry.title)}</h3>"
            f'<pre class="where">{_e(chr(10).join(entry.lines))}</pre>'
            f'<ul class="groups">{_group(entry)}</ul>'
            "</article>"
        )
    return (
        f'<section id="diff" aria-labelledby="diff-h"><h2 id="diff-h">Diff {_e(result.old.version)} → {_e(result.new.version)}</h2>'
        f'{head}<p class="note">{_e(CONTEXT_NOTE)}</p>{"".join(articles)}</section>'
    )


def _group(entry: Entry) -> str:
    # One group per entry, as ``kvpolicy diff --format json`` numbers them (what matrix cells link
    # to): how many of its contexts start or stop failing, which its lines say only per diagnostic.
    failing = [f"{entry.starts_failing:,} gain an error"] if entry.starts_failing else []
    failing += [f"{entry.stops_failing:,} lose an error"] if entry.stops_failing else []
    text = ", ".join(failing) or "none gains or loses an error"
    return (
        f'<li id="diff-group-{entry.number}" data-group="{entry.number}" data-count="{entry.count}">'
        f"<b>[{entry.number}]</b> {plural(entry.count, 'context', grouped=True)}: {_e(text)}</li>"
    )


def _used(section: Any) -> str:
    """The config fields read for a section (what :mod:`kvpolicy.serving.layouts` reports), for hover."""
    used = getattr(section, "used", ())
    return ("fields read:\n" + "\n".join(map(str, used))) if used else ""


def _impact_counts(results: Sequence[Any]) -> str:
    counts = Counter(r.status for r in results if not r.skipped)
    return ", ".join(f"{counts[s]} {s}" for s, _ in _STATUSES if counts[s])


def _severity(result: Any) -> int:
    """A config's place in the impact table: its status's position in ``_STATUSES`` (worst first)."""
    order = [status for status, _ in _STATUSES]
    return order.index(result.status) if result.status in order else len(order)


def _impact_rows(result: Any, old: str, new: str, link: Link, root: str | None) -> list[str]:
    """The table rows of one config: a row per server, then its problems and side mismatches."""
    classes = dict(_STATUSES)
    config = _e(_full(result.path, root))
    architecture = result.architecture or "unknown"
    if result.model_type:
        architecture += f" ({result.model_type})"
    rows, first = [], True
    span = max(len(result.sections), 1)
    for section in result.sections:
        status = section.status
        errors = [d for d in (section.new.resolution.errors if section.new.resolution else ())]
        why = "; ".join(f"{d.id}: {d.message}" for d in errors) or (section.new.invalid or "")
        if len(section.possibilities) > 1:
            # Never a green "unchanged" for a model kvpolicy could not identify: every status it may get.
            why = "the model is unknown: " + "; ".join(f"{s} for {', '.join(m)}" for s, m in section.possibilities)
        head = ""
        if first:
            head = (
                f'<th scope="rowgroup" rowspan="{span}" class="config"><a href="{_e(link(result.path, None))}"'
                f' title="{config}">{_breakable(_relative(result.path, root))}</a>'
                f"<br><small>{_e(architecture)}, from {_e(_shorten(result.architecture_source, root))}</small></th>"
            )
        side = getattr(section, "role", None) or _SIDE_LABELS.get(section.name, section.name)
        rows.append(
            f'<tr data-status="{_e(status)}" data-config="{config}">{head}<td class="side">'
            f'<a href="{_e(link(result.path, section.line))}" title="{_e(_used(section))}">{_e(side)}'
            f"{', line ' + str(section.line) if section.line else ''}</a></td>"
            f"<td>{_e(section.old.short())}</td><td>{_e(section.new.short())}</td>"
            f'<td class="status {classes.get(status, "same")}">{_e(status)}</td><td class="why">{_e(_shorten(why, root))}</td></tr>'
        )
        first = False
    for problem in result.problems:
        rows.append(
            f'<tr data-status="malformed" data-config="{config}"><th scope="row" class="config">'
            f'<a href="{_e(link(problem.path, problem.line))}" title="{_e(_full(problem.path, root))}">'
            f"{_breakable(_shorten(problem.location, root))}</a></th><td>—</td><td></td><td></td>"
            f'<td class="status bad">malformed</td><td class="why">{_e(_shorten(problem.message, root))}</td></tr>'
        )
    for label, mismatch in ((old, result.mismatch_old), (new, result.mismatch_new)):
        if mismatch:
            rows.append(
                f'<tr data-status="{_e(result.status)}" data-config="{config}"><th scope="row" class="config"'
                f' title="{config}">{_breakable(_relative(result.path, root))}</th><td>both</td>'
                f'<td colspan="2">under {_e(label)}</td><td class="status bad">{_e(result.status)}</td>'
                f'<td class="why">{_e(_shorten(mismatch, root))}</td></tr>'
            )
    return rows


def _impact_table(rows: list[str], old: str, new: str) -> str:
    # Fixed column widths (report_assets): long paths and messages wrap inside their cells instead
    # of pushing the status and the reasons off the page; only a phone scrolls the box.
    return (
        '<div class="scroll"><table class="impact"><colgroup><col class="c-config"><col class="c-side"><col class="c-version">'
        '<col class="c-version"><col class="c-status"><col class="c-why"></colgroup>'
        '<thead><tr><th scope="col">config</th><th scope="col">side</th>'
        f'<th scope="col">{_e(old)}</th><th scope="col">{_e(new)}</th><th scope="col">status</th>'
        f'<th scope="col">why ({_e(new)})</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
    )


def _impact(results: Sequence[Any], old: str, new: str, link: Link | None, root: str | None = None) -> str:
    """The impact section: configs worst first; the unchanged ones last, folded away."""
    link = link or (lambda path, line: path + (f"#L{line}" if line else ""))
    read = sorted((r for r in results if not r.skipped), key=_severity)  # stable: path order within a status
    moved = [r for r in read if r.status != "unchanged"]
    same = [r for r in read if r.status == "unchanged"]
    table = ""
    if moved:
        table = _impact_table([row for r in moved for row in _impact_rows(r, old, new, link, root)], old, new)
    elif read:
        table = '<p class="note">No config resolves differently.</p>'
    if same:
        servers = sum(max(len(r.sections), 1) for r in same)
        table += (
            f'<details class="unchanged" id="impact-unchanged" data-count="{len(same)}"><summary>'
            f"{plural(len(same), 'unchanged config')} ({plural(servers, 'server')}: same runtime, backend and values)"
            f"</summary>{_impact_table([row for r in same for row in _impact_rows(r, old, new, link, root)], old, new)}"
            "</details>"
        )
    skipped = len(results) - len(read)
    note = f" {plural(skipped, 'file')} skipped (no cache_transceiver_config)." if skipped else ""
    return (
        '<section id="impact" aria-labelledby="impact-h"><h2 id="impact-h">Impact on serving configs</h2>'
        f"<p>{plural(len(read), 'config')}: {_e(_impact_counts(results)) or 'none read'}.{_e(note)} "
        'Worst first. <span class="mark fail">!</span> after a value: cannot start; /V2: KV-cache manager V2.</p>'
        f"{table}</section>"
    )
