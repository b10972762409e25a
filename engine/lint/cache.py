"""Lint results stored by content, so a run over unchanged files parses and analyses nothing.

Two kinds of entry, in the user's cache folder (:mod:`kvpolicy.read.cache`; ``KVPOLICY_CACHE_DIR=""``
turns it off, ``kvpolicy lint --no-cache`` skips it for one run):

- **per file**: the findings of the loader and policy rules on one file (they read that file
  only), whether it loaded, and why its exact analysis was skipped; keyed by the file's bytes, the
  name findings give it, the rules that run and :func:`kvpolicy.read.cache.code_fingerprint`;
- **per set**: the findings of the set rules (versions across files, suppressions), keyed by the
  same rules and the per-file keys of every file of the run, in order. A run with ``--base`` reads
  git and never uses it.

So an edit re-analyses the edited file and re-runs the set rules (which read every file, so any
finding that depends on the edit is found again); every other file is answered from its entry.
Findings are stored as JSON and read back into equal :class:`~kvpolicy.lint.rules.Finding`
objects; an entry of the wrong shape is a miss.
"""

from __future__ import annotations

from typing import Any

from ..read.cache import cached_entry, code_fingerprint, digest, remember_entry
from ..errors import Location
from .rules import RULES, Finding

__all__ = ["FileResult", "file_key", "load_file", "load_set", "rules_key", "set_key", "store_file", "store_set"]

_FILES = "lint-files-1"
_SETS = "lint-sets-1"
_SEVERITIES = ("error", "warning")


def rules_key(codes: list[str]) -> str:
    """The digest of the code and the rules that run."""
    return digest("kvpolicy-lint-1", code_fingerprint(), ",".join(sorted(codes)))


def file_key(rules: str, shown: str, raw: bytes) -> str:
    """The digest one file's entry is stored under."""
    return digest(rules, shown, raw)


class FileResult:
    """What the per-file rules found in one file."""

    __slots__ = ("findings", "loaded", "skipped_reason")

    def __init__(self, findings: list[Finding], loaded: bool, skipped_reason: str | None) -> None:
        self.findings = findings
        self.loaded = loaded
        self.skipped_reason = skipped_reason


def load_file(key: str) -> FileResult | None:
    """The stored result of one file, or None."""
    entry = cached_entry(_FILES, key)
    try:
        if entry["key"] != key or not isinstance(entry["loaded"], bool):
            return None
        skipped = entry["skipped"]
        if skipped is not None and not isinstance(skipped, str):
            return None
        return FileResult(_findings(entry["findings"]), entry["loaded"], skipped)
    except (TypeError, KeyError, ValueError):
        return None


def store_file(key: str, result: FileResult) -> None:
    """Remember one file's result."""
    remember_entry(
        _FILES,
        key,
        {"key": key, "loaded": result.loaded, "skipped": result.skipped_reason, "findings": [_dump(f) for f in result.findings]},
    )


def set_key(rules: str, files: list[str]) -> str:
    """The digest the set rules' entry is stored under: the rules and every file's key, in order."""
    return digest(rules, "set", *files)


def load_set(key: str) -> list[Finding] | None:
    """The stored findings of the set rules, or None."""
    entry = cached_entry(_SETS, key)
    try:
        if entry["key"] != key:
            return None
        return _findings(entry["findings"])
    except (TypeError, KeyError, ValueError):
        return None


def store_set(key: str, findings: list[Finding]) -> None:
    """Remember the set rules' findings."""
    remember_entry(_SETS, key, {"key": key, "findings": [_dump(f) for f in findings]})


def _dump(finding: Finding) -> list[Any]:
    return [
        finding.code,
        finding.message,
        _location(finding.location),
        finding.severity,
        [[_location(where), note] for where, note in finding.related],
        finding.context,
    ]


def _location(where: Location) -> list[Any]:
    return [where.path, where.line, where.column]


def _place(value: Any) -> Location:
    path, line, column = value
    if not isinstance(path, str) or type(line) is not int or type(column) is not int:
        raise ValueError("bad location")
    return Location(path, line, column)


def _findings(values: Any) -> list[Finding]:
    """Findings from their stored form (ValueError/TypeError/KeyError when the shape is wrong)."""
    found = []
    for code, message, where, severity, related, context in values:
        if code not in RULES or not isinstance(message, str) or severity not in _SEVERITIES:
            raise ValueError("bad finding")
        if context is not None and not isinstance(context, dict):
            raise ValueError("bad context")
        notes = []
        for place, note in related:
            if not isinstance(note, str):
                raise ValueError("bad note")
            notes.append((_place(place), note))
        found.append(Finding(code, message, _place(where), severity, tuple(notes), context))
    return found
