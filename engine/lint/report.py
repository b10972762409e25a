"""Lint output formats: text (ruff-like), json, github (workflow annotations), sarif 2.1.0, junit.

Every formatter is a pure function of the result: ``str`` out, nothing printed.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import PurePath
from typing import Any
from xml.etree import ElementTree

from ..version import __version__
from ..wording import github_escape
from .rules import CATEGORIES, RULES, Finding
from .runner import LintResult

__all__ = ["DOCS_URL", "FORMATS", "render", "rule_url"]

#: Where the documentation site (``make docs``; mkdocs.yml's ``site_url``) is published: SARIF's
#: ``helpUri`` of a rule is its page there (``rules/KVP021/``), generated from the catalogue.
DOCS_URL = "https://kvpolicy.github.io/kvpolicy/"


def rule_url(code: str) -> str:
    """The documentation page of a lint rule."""
    return f"{DOCS_URL}rules/{code}/"


def render(result: LintResult, fmt: str, *, colour: bool = False) -> str:
    """The result in one of :data:`FORMATS`; ``colour``: ANSI colours in the text format (for a
    terminal; every other format ignores it)."""
    if fmt == "text":
        return text(result, colour=colour)
    return FORMATS[fmt](result)


#: ANSI SGR codes of the text format's parts, as ruff and rustc colour theirs.
_STYLE = {"path": "1", "error": "1;31", "warning": "1;33", "gutter": "34", "note": "36", "passed": "1;32"}


def _paint(text: str, part: str, colour: bool) -> str:
    return f"\x1b[{_STYLE[part]}m{text}\x1b[0m" if colour and text else text


_RST_LITERAL = re.compile(r"(?<!`)``([^`\n]+)``(?!`)")


def markdown(doc: str) -> str:
    """A rule docstring as Markdown: RST inline literals (double backticks, the docstring
    convention) become single backticks; code fences stay as they are."""
    return _RST_LITERAL.sub(r"`\1`", doc)


def _lines(result: LintResult) -> dict[str, list[str]]:
    texts: dict[str, list[str]] = {}
    for file in result.files:
        try:
            texts[file.path] = file.raw.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            texts[file.path] = file.raw.decode("utf-8", errors="replace").splitlines()
    return texts


def text(result: LintResult, *, colour: bool = False) -> str:
    """``path:line:col: CODE message``, a source excerpt, then a summary line."""
    out: list[str] = []
    sources = _lines(result)
    for finding in result.findings:
        location = finding.location
        code = _paint(finding.code, finding.severity, colour)
        out.append(f"{_paint(str(location), 'path', colour)}: {code} {finding.message}")
        lines = sources.get(location.path, [])
        if 0 < location.line <= len(lines):
            source, column = _excerpt(lines[location.line - 1].rstrip(), location.column)
            gutter = " " * len(str(location.line))
            bar = _paint("|", "gutter", colour)
            out.append(f"{gutter} {bar}")
            out.append(f"{_paint(str(location.line), 'gutter', colour)} {bar} {source}")
            out.append(f"{gutter} {bar} {' ' * (column - 1)}{_paint('^ ' + finding.code, finding.severity, colour)}")
            out.append(f"{gutter} {bar}")
        for related, note in finding.related:
            out.append(f"  {_paint('= note:', 'note', colour)} {note} at {related}")
        out.append("")
    summary = _summary(result)
    if colour:
        summary = _paint(summary, "passed" if not result.findings else "error" if result.counts()["error"] else "warning", True)
    out.append(summary)
    return "\n".join(out) + "\n"


#: Characters of a source line shown in an excerpt (a hostile file may hold one 30 MB line).
_EXCERPT = 120


def _excerpt(line: str, column: int) -> tuple[str, int]:
    """The part of ``line`` around ``column`` (at most ``_EXCERPT`` characters) and the column in it."""
    if len(line) <= _EXCERPT:
        return line, column
    start = max(0, min(column - _EXCERPT // 2, len(line) - _EXCERPT))
    shown = line[start : start + _EXCERPT]
    prefix = "..." if start else ""
    suffix = "..." if start + _EXCERPT < len(line) else ""
    return prefix + shown + suffix, column - start + len(prefix)


def _summary(result: LintResult) -> str:
    counts = result.counts()
    files = len(result.files)
    suppressed = len(result.suppressed)
    tail = f"{files} file{'s' if files != 1 else ''} checked"
    if suppressed:
        tail += f", {suppressed} suppressed"
    total = len(result.findings)
    if not total:
        return f"All checks passed! ({tail})"
    parts = []
    if counts["error"]:
        parts.append(f"{counts['error']} error{'s' if counts['error'] != 1 else ''}")
    if counts["warning"]:
        parts.append(f"{counts['warning']} warning{'s' if counts['warning'] != 1 else ''}")
    return f"Found {total} finding{'s' if total != 1 else ''}: {', '.join(parts)} ({tail})"


def _finding_json(finding: Finding, reason: str | None = None) -> dict[str, Any]:
    rule = RULES[finding.code]
    item = {
        "code": finding.code,
        "name": rule.name,
        "category": rule.category,
        "severity": finding.severity,
        "message": finding.message,
        "filename": finding.location.path,
        "line": finding.location.line,
        "column": finding.location.column,
        "related": [{"filename": loc.path, "line": loc.line, "column": loc.column, "message": note} for loc, note in finding.related],
        "context": finding.context,
    }
    if reason is not None:
        item["reason"] = reason
    return item


def as_json(result: LintResult) -> str:
    """Findings, suppressed findings and a summary as one JSON object."""
    counts = result.counts()
    document = {
        "findings": [_finding_json(f) for f in result.findings],
        "suppressed": [_finding_json(f, result.reason(f)) for f in result.suppressed],
        "summary": {
            "files": len(result.files),
            "errors": counts["error"],
            "warnings": counts["warning"],
            "suppressed": len(result.suppressed),
        },
    }
    return json.dumps(document, indent=2) + "\n"


def github(result: LintResult) -> str:
    """GitHub Actions workflow commands: one ``::error``/``::warning`` annotation per finding."""
    out = []
    for finding in result.findings:
        loc = finding.location
        title = f"{finding.code} {RULES[finding.code].name}"
        properties = ",".join(
            [
                f"file={github_escape(loc.path, prop=True)}",
                f"line={loc.line}",
                f"col={loc.column}",
                f"title={github_escape(title, prop=True)}",
            ]
        )
        out.append(f"::{finding.severity} {properties}::{github_escape(finding.message)}")
    return "\n".join(out) + ("\n" if out else "")


def _uri(path: str) -> str:
    return PurePath(path).as_posix()


def _physical(location: Any) -> dict[str, Any]:
    return {
        "artifactLocation": {"uri": _uri(location.path)},
        "region": {"startLine": location.line, "startColumn": location.column},
    }


def sarif(result: LintResult) -> str:
    """SARIF 2.1.0: one rule per code, results with physical locations; suppressed findings are
    included with an ``inSource`` suppression, so code scanning shows them as dismissed."""
    codes = list(RULES)
    rules = []
    for code in codes:
        rule = RULES[code]
        doc = markdown(rule.doc)
        first = doc.split("\n\n")[0].removeprefix("## What it does").strip().replace("\n", " ")
        rules.append(
            {
                "id": code,
                "name": rule.name,
                "shortDescription": {"text": rule.summary},
                "fullDescription": {"text": first},
                "help": {"text": doc, "markdown": doc},
                "helpUri": rule_url(code),
                "defaultConfiguration": {"level": rule.severity},
                "properties": {"category": rule.category, "tags": [rule.category]},
            }
        )

    sources = _lines(result)
    seen: dict[str, int] = {}

    def fingerprint(finding: Finding) -> str:
        # Stable when lines move: the rule, the file and the text of the line, not its number;
        # ":n" tells apart equal findings on equal lines (as GitHub's own line hash does).
        lines = sources.get(finding.location.path, [])
        text = lines[finding.location.line - 1].strip() if 0 < finding.location.line <= len(lines) else ""
        digest = hashlib.sha256("\0".join((finding.code, finding.location.path, text)).encode()).hexdigest()[:32]
        seen[digest] = seen.get(digest, 0) + 1
        return f"{digest}:{seen[digest]}"

    def one(finding: Finding, suppressed: bool) -> dict[str, Any]:
        item: dict[str, Any] = {
            "ruleId": finding.code,
            "ruleIndex": codes.index(finding.code),
            "level": finding.severity,
            "message": {"text": finding.message},
            "locations": [{"physicalLocation": _physical(finding.location)}],
            "partialFingerprints": {"primaryLocationLineHash": fingerprint(finding)},
        }
        if finding.related:
            item["relatedLocations"] = [
                {"id": index, "physicalLocation": _physical(loc), "message": {"text": note}} for index, (loc, note) in enumerate(finding.related)
            ]
        if suppressed:
            reason = result.reason(finding)
            item["suppressions"] = [{"kind": "inSource", "justification": reason or "# kvpolicy: ignore comment (no reason given)"}]
        return item

    document = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "kvpolicy",
                        "version": __version__,
                        "informationUri": DOCS_URL,
                        "rules": rules,
                    }
                },
                "columnKind": "unicodeCodePoints",
                "results": [one(f, False) for f in result.findings] + [one(f, True) for f in result.suppressed],
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def junit(result: LintResult) -> str:
    """JUnit XML: one test suite per file, one failing test case per finding (a passing one for a
    clean file), as CI systems render test reports."""
    root = ElementTree.Element("testsuites", name="kvpolicy lint")
    by_file: dict[str, list[Finding]] = {file.path: [] for file in result.files}
    for finding in result.findings:
        by_file.setdefault(finding.location.path, []).append(finding)
    total = failures = 0
    for path, findings in by_file.items():
        suite = ElementTree.SubElement(root, "testsuite", name=path)
        names: dict[str, int] = {}
        for finding in findings:
            # CI systems key test cases by name: two findings of one rule at one place stay two cases.
            name = f"{finding.code} {RULES[finding.code].name} at {finding.location}"
            names[name] = names.get(name, 0) + 1
            if names[name] > 1:
                name += f" ({names[name]})"
            case = ElementTree.SubElement(suite, "testcase", name=name, classname=path)
            failure = ElementTree.SubElement(case, "failure", message=finding.message, type=finding.code)
            failure.text = f"{finding.location}: {finding.code} [{finding.severity}] {finding.message}"
        cases = len(findings)
        if not findings:
            cases = 1
            ElementTree.SubElement(suite, "testcase", name="kvpolicy lint", classname=path)
        suite.set("tests", str(cases))
        suite.set("failures", str(len(findings)))
        total += cases
        failures += len(findings)
    root.set("tests", str(total))
    root.set("failures", str(failures))
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


FORMATS = {"text": text, "json": as_json, "github": github, "sarif": sarif, "junit": junit}


def rule_text(code: str) -> str:
    """What ``kvpolicy rule CODE`` prints."""
    rule = RULES[code]
    head = f"# {rule.name} ({rule.code})\n\nCategory: {rule.category} ({CATEGORIES[rule.category]}). Severity: {rule.severity}.\n"
    return f"{head}\n{markdown(rule.summary)}.\n\n{markdown(rule.doc)}\n"


def rules_table() -> str:
    """What ``kvpolicy rules`` prints: every rule, grouped by category."""
    out = []
    for category, description in CATEGORIES.items():
        out.append(f"{category}: {description}")
        for rule in RULES.values():
            if rule.category == category:
                out.append(f"  {rule.code}  {rule.name:<26} {rule.severity:<8} {rule.summary}")
        out.append("")
    return "\n".join(out)
