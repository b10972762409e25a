"""Canonical formatting of policy files (``kvpolicy fmt``), keeping every comment.

The canonical form:

- keys in a fixed order per kind of table (``schema, version, summary, source`` at the top;
  ``id, when, value, notice, reason, source`` in rules; ``architecture, model_type, value,
  reason, source`` in preference rows; ...), unknown keys after the known ones in their order;
- preference ``rows`` sorted by architecture, then model_type (stable, so the first of two
  duplicates stays first), one row per line with its trailing comment;
- ``key = value`` spacing, inline tables as ``{ a = 1, b = 2 }``, short arrays on one line;
- one blank line before each table header, none elsewhere, no trailing spaces, one final newline.

Tables keep their order: the order of conditional defaults is meaningful. Comments stay attached
to the key, row or table header they precede (or follow, on the same line). Values keep their
spelling (quotes, numbers) as written. The formatter is built on tomlkit's parse tree and checked
by tests: it never changes the TOML data (except the order of rows) and is idempotent.
"""

from __future__ import annotations

import difflib
from typing import Any

import tomlkit
from tomlkit import items as tk
from tomlkit.container import Container
from tomlkit.exceptions import TOMLKitError

__all__ = ["FormatError", "diff", "format_text"]

#: Arrays longer than this go one element per line.
_WIDTH = 100

_RULE = ("id", "when", "value", "notice", "reason", "source")
_ORDER: dict[str, tuple[str, ...]] = {
    "top": ("$schema", "schema", "version", "summary", "source"),
    "feature": ("description", "env", "config_field"),
    "decision": ("description", "values", "auto", "null", "omitted", "inputs", "default"),
    "rule": _RULE,
    "preference": ("id", "adopt_when", "on_not_adopted", "reason", "source", "rows"),
    "row": ("architecture", "model_type", "value", "reason", "source"),
    "constraint": ("id", "decision", "severity", "when", "message", "fix", "reason", "source"),
    "checkpoint_rule": ("id", "model_type", "multimodal", "architecture", "reason", "source"),
    "notice": ("id", "severity", "message"),
    "case": ("name", "context", "expect", "starts", "decided_by", "diagnostics"),
}


class FormatError(ValueError):
    """The text is not TOML; nothing to format."""


def format_text(text: str) -> str:
    """The canonical form of a policy file's text (raises :class:`FormatError` if not TOML)."""
    try:
        document = tomlkit.parse(text)
    except (TOMLKitError, ValueError) as exc:  # tomlkit's parse errors, and bad escapes or dates
        raise FormatError(str(exc)) from None
    out: list[str] = []
    trailing = _trim(_container(document, (), out, first=True))
    if trailing:
        _blank(out)
        out += trailing
    while out and out[-1] == "":
        out.pop()
    return "\n".join(line.rstrip() for line in out) + "\n"


def diff(path: str, before: str, after: str) -> str:
    """A unified diff between a file's text and its canonical form."""
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"{path}", f"{path} (formatted)"))


def _kind(path: tuple[str, ...]) -> str:
    """Which key order a table at ``path`` follows (array indices are dropped from ``path``)."""
    if not path:
        return "top"
    if path[0] == "features" and len(path) == 2:
        return "feature"
    if path[0] == "constraints" and len(path) == 1:
        return "constraint"
    if path[0] == "checkpoint_rules" and len(path) == 1:
        return "checkpoint_rule"
    if path[0] == "case" and len(path) == 1:
        return "case"
    if path[0] == "decisions":
        if len(path) == 2:
            return "decision"
        if len(path) == 3 and path[2] in ("requirement", "conditional", "default", "adjustment"):
            return "rule"
        if len(path) == 3 and path[2] == "preference":
            return "preference"
        if len(path) == 4 and path[2] == "preference" and path[3] == "rows":
            return "row"
    if path[-1] in ("notice", "on_not_adopted"):
        return "notice"
    return ""


def _rank(kind: str, key: str) -> tuple[int, int]:
    order = _ORDER.get(kind, ())
    return (order.index(key), 0) if key in order else (len(order), 0)


def _key(key: Any) -> str:
    return key.as_string().strip()


def _comment(item: Any) -> str:
    trivia = getattr(item, "trivia", None)
    comment = trivia.comment.strip() if trivia is not None and trivia.comment else ""
    return f"  {comment}" if comment else ""


def _container(container: Container | Any, path: tuple[str, ...], out: list[str], first: bool = False, lead: list[str] | None = None) -> list[str]:
    """Emit a table's keys (canonical order) and then its sub-tables (authored order).

    Returns the comment lines after its last key: they lead the next table header."""
    body = container.body if isinstance(container, Container) else container.value.body
    pending: list[str] = list(lead or [])
    values: list[tuple[str, list[str], str]] = []
    tables: list[tuple[str, list[str], Any]] = []
    for key, item in body:
        if key is None:
            if isinstance(item, tk.Comment):
                pending.append(item.as_string().strip())
            elif isinstance(item, tk.Whitespace) and pending and pending[-1] and item.as_string().count("\n") >= 1:
                pending.append("")  # a blank line after a comment block separates it from what follows
            continue
        name = _key(key)
        if key.is_dotted() and isinstance(item, tk.Table):
            # ``a.b = 1`` written as a dotted key: keep it a dotted key-value line.
            for index, line in enumerate(_dotted_lines(item, name + ".")):
                values.append((name, pending if index == 0 else [], line))
        elif isinstance(item, (tk.Table, tk.AoT)):
            tables.append((name, pending, item))
        else:
            values.append((name, pending, f"{name} = {_value(item, path + (name,))}{_comment(item)}"))
        pending = []
    kind = _kind(path)
    if first and values and values[0][1]:
        # The comments before a file's first key are the file's header: they stay on top.
        out += _trim(values[0][1])
        values[0] = (values[0][0], [], values[0][2])
    values.sort(key=lambda entry: _rank(kind, entry[0]))
    for _, comments, line in values:
        out += _trim(comments)
        out.append(line)
    lead = pending
    for name, comments, item in tables:
        lead = _table(name, lead + comments, item, path, out)
    return lead


def _trim(lines: list[str]) -> list[str]:
    """Comment lines without leading blank lines or runs of blank lines; one trailing blank
    line is kept (it separates a comment block from the key or header below)."""
    out: list[str] = []
    for line in lines:
        if line == "" and (not out or out[-1] == ""):
            continue
        out.append(line)
    return out


def _table(name: str, lead: list[str], item: Any, path: tuple[str, ...], out: list[str]) -> list[str]:
    here = path + (name,)
    header = ".".join(here)  # each part as written, quotes included
    if isinstance(item, tk.AoT):
        for table in item.body:
            _blank(out)
            out += _trim(lead)
            lead = []
            out.append(f"[[{header}]]{_comment(table)}")
            lead = _container(table, here, out)
        return lead
    if item.is_super_table():
        # An implicit table: no header of its own; comments before it lead its first sub-table.
        return _container(item, here, out, lead=lead)
    _blank(out)
    out += _trim(lead)
    out.append(f"[{header}]{_comment(item)}")
    return _container(item, here, out)


def _blank(out: list[str]) -> None:
    if out and out[-1] != "":
        out.append("")


def _value(item: Any, path: tuple[str, ...]) -> str:
    if isinstance(item, tk.InlineTable):
        return _inline(item, path)
    if isinstance(item, tk.Array):
        return _array(item, path)
    if isinstance(item, tk.Table):  # a dotted key's table inside an inline table
        return item.as_string().strip()
    return item.as_string().strip()


def _dotted_lines(item: Any, prefix: str) -> list[str]:
    """``a.b.c = value  # comment`` lines of a dotted key's table."""
    lines: list[str] = []
    for key, child in item.value.body:
        if key is None:
            continue
        name = f"{prefix}{_key(key)}"
        if isinstance(child, tk.Table):
            lines += _dotted_lines(child, name + ".")
        else:
            lines.append(f"{name} = {_value(child, (name,))}{_comment(child)}")
    return lines


def _inline_pairs(item: Any, prefix: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for key, child in item.value.body:
        if key is None:
            continue
        name = f"{prefix}{_key(key)}"
        if isinstance(child, tk.Table):
            pairs += _inline_pairs(child, name + ".")
        else:
            pairs.append((name, _value(child, (name,))))
    return pairs


def _inline(item: Any, path: tuple[str, ...]) -> str:
    kind = _kind(path) or ("row" if len(path) >= 2 and path[-2:] == ("rows", "") else "")
    pairs = _inline_pairs(item, "")
    if not pairs:
        return "{}"
    pairs.sort(key=lambda pair: _rank(kind, pair[0].split(".", 1)[0]))
    return "{ " + ", ".join(f"{k} = {v}" for k, v in pairs) + " }"


def _array(item: Any, path: tuple[str, ...]) -> str:
    groups = []
    pending: list[str] = []
    for group in item._value:  # (value, indent, comma, comment) groups: tomlkit's array layout
        comment = group.comment.as_string().strip() if group.comment is not None else ""
        value = group.value
        if value is None or isinstance(value, (tk.Whitespace, tk.Null)):
            if comment:
                pending.append(comment)
            continue
        if isinstance(value, tk.Comment):
            pending.append(value.as_string().strip())
            continue
        groups.append((pending, value, comment))
        pending = []
    is_rows = bool(path) and path[-1] == "rows"
    element_path = path + ("",)
    if is_rows:
        groups.sort(key=lambda g: _row_key(g[1]))
    multiline = is_rows or any(c or p for p, _, c in groups) or pending or any(isinstance(v, tk.InlineTable) for _, v, _ in groups)
    if not multiline:
        line = "[" + ", ".join(_element(v, element_path, is_rows) for _, v, _ in groups) + "]"
        if len(line) <= _WIDTH:
            return line
    lines = ["["]
    for comments, value, comment in groups:
        lines += [f"  {c}" for c in comments]
        lines.append(f"  {_element(value, element_path, is_rows)},{'  ' + comment if comment else ''}")
    lines += [f"  {c}" for c in pending]
    lines.append("]")
    return "\n".join(lines)


def _element(value: Any, path: tuple[str, ...], is_row: bool) -> str:
    if isinstance(value, tk.InlineTable):
        pairs = _inline_pairs(value, "")
        if not pairs:
            return "{}"
        kind = "row" if is_row else ""
        pairs.sort(key=lambda pair: _rank(kind, pair[0].split(".", 1)[0]))
        return "{ " + ", ".join(f"{k} = {v}" for k, v in pairs) + " }"
    return _value(value, path)


def _row_key(value: Any) -> tuple[str, str]:
    if isinstance(value, tk.InlineTable):
        architecture = value.get("architecture")
        model_type = value.get("model_type")
        return (str(architecture) if isinstance(architecture, str) else "", str(model_type) if isinstance(model_type, str) else "")
    return ("", "")
