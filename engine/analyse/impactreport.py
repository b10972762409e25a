"""What ``kvpolicy impact`` reports, in its four formats (text, JSON, GitHub annotations, SARIF),
and the gate: which statuses ``--fail-on`` fails on. The impact itself is
:mod:`kvpolicy.analyse.impact`'s; lint keeps its formats the same way, in :mod:`kvpolicy.lint.report`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from ..serving.check import read_line
from ..wording import github_escape, plural
from .difftext import edit_lines
from .edit import PolicyEdit
from .impact import ConfigImpact, SectionImpact, Side

__all__ = ["FAIL_ON", "FORMATS", "GITHUB_PER_LEVEL", "fail_tokens", "gate_line", "render_github", "render_sarif", "render_text", "to_json"]

_SIDE_LABELS = {
    "context_servers": "context",
    "generation_servers": "generation",
    "worker_config.ctx": "context (worker_config.ctx)",
    "worker_config.gen": "generation (worker_config.gen)",
    "server": "server",
}
#: Statuses that make ``--fail-on failing`` (the default) exit 1: what the edit makes fail. A config
#: kvpolicy cannot read is malformed under both versions, whatever the edit: counted and reported,
#: failing only with ``--fail-on malformed`` (or ``still-failing``).
_FAILING = {"starts failing", "fails differently"}
#: Parts of the edit listed before the table (``kvpolicy diff`` lists them all).
_EDIT_LIMIT = 20
_CHANGED = _FAILING | {"stops failing", "runtime changes", "backend changes", "changes", "new warning", "architecture unknown"}
#: Tokens beside the statuses (see :func:`fail_tokens`): a config whose model was not identified
#: (``unknown``), and one of those that would start failing for some model (``unknown-may-fail``).
_UNKNOWN = "unknown"
_UNKNOWN_MAY_FAIL = "unknown-may-fail"
#: What each ``--fail-on`` value fails on (values combine: ``--fail-on failing,new-warning``).
FAIL_ON = {
    "failing": _FAILING | {_UNKNOWN_MAY_FAIL},
    "still-failing": _FAILING | {_UNKNOWN_MAY_FAIL, "still failing", "malformed"},
    "malformed": {"malformed"},
    "new-warning": _FAILING | {_UNKNOWN_MAY_FAIL, "new warning"},
    "unknown": {_UNKNOWN},
    "change": _CHANGED | {_UNKNOWN_MAY_FAIL},
    "never": set(),
}


#: The report formats (``--format``; ``-o FORMAT=FILE``).
FORMATS = ("text", "json", "github", "sarif")


def fail_tokens(result: ConfigImpact) -> set[str]:
    """What ``--fail-on`` compares: the config's and its sections' statuses, ``unknown`` when its
    model was not identified, ``unknown-may-fail`` when some model it may be would fail."""
    tokens = {result.status, *(s.status for s in result.sections)}
    if not result.problems and not result.architecture_known:
        tokens.add(_UNKNOWN)
        if result.may_fail:
            tokens.add(_UNKNOWN_MAY_FAIL)
    return tokens


def gate_line(results: list[ConfigImpact], fail_on: str) -> str:
    """What the gate decided and why: the statuses that made it fail (with counts and the
    ``--fail-on`` value that names them), or that it passes and what it counted without failing."""
    failing_on: set[str] = set()
    for part in fail_on.split(","):
        failing_on |= FAIL_ON[part]
    counts: Counter[str] = Counter()
    for result in results:
        if not result.skipped:
            counts.update(fail_tokens(result) & (failing_on | {"malformed"}))
    names = {_UNKNOWN_MAY_FAIL: "of unknown model would start failing for some model", _UNKNOWN: "of unknown model"}
    hits = [(token, count) for token, count in sorted(counts.items()) if token in failing_on]
    if hits:
        because = ", ".join(f"{plural(count, 'config')} {names.get(token, token)}" for token, count in hits)
        return f"gate: fails (exit 1) on {because} (--fail-on {fail_on})"
    quiet = counts["malformed"]
    if quiet:
        return f"gate: passes (exit 0); {plural(quiet, 'config')} malformed under both versions, not caused by the edit (--fail-on malformed fails on them)"
    return f"gate: passes (exit 0) (--fail-on {fail_on})"


def _architecture(result: ConfigImpact) -> str:
    if result.architecture is None:
        return "unknown"
    return result.architecture + (f" ({result.model_type})" if result.model_type else "")


#: How a status reads after a count: the ones that name what changed read as nouns ("1 runtime
#: change", "2 runtime changes"), not as a plural after one ("1 runtime changes").
_COUNTED = {
    "runtime changes": ("runtime change", "runtime changes"),
    "backend changes": ("backend change", "backend changes"),
    "changes": ("change", "changes"),
    "new warning": ("new warning", "new warnings"),
}


def _counts(results: list[ConfigImpact]) -> str:
    counts = Counter(r.status for r in results if not r.skipped)
    order = (
        "starts failing",
        "fails differently",
        "malformed",
        "architecture unknown",
        "runtime changes",
        "backend changes",
        "changes",
        "new warning",
        "stops failing",
        "still failing",
        "unchanged",
    )
    return ", ".join(f"{counts[s]} {_COUNTED.get(s, (s, s))[counts[s] != 1]}" for s in order if counts[s])


def _unknown_line(results: list[ConfigImpact]) -> str | None:
    """How many configs' models were not identified, and what that hides."""
    read = [r for r in results if not r.skipped and not r.problems]
    unknown = [r for r in read if not r.architecture_known]
    if not unknown:
        return None
    depends = sum(1 for r in unknown if r.status == "architecture unknown")
    may_fail = sum(1 for r in unknown if r.may_fail)
    return (
        f"  architecture unknown for {len(unknown)} of {plural(len(read), 'config')}: {depends} depend{'s' if depends == 1 else ''} on the model"
        f" ({may_fail} would start failing for some model); give the checkpoints' config.json under --models-root"
        " or $LLM_MODELS_ROOT, or --arch-map"
    )


def _common_folder(paths: list[str]) -> str:
    """The folder all paths share ('' when none), to keep the table narrow."""
    if not paths:
        return ""
    parts = [Path(p).parent.parts for p in paths]
    common: list[str] = []
    for items in zip(*parts):
        if len(set(items)) != 1:
            break
        common.append(items[0])
    return str(Path(*common)) if common else ""


def _short_path(path: str, folder: str) -> str:
    return str(Path(path).relative_to(folder)) if folder else path


def render_text(results: list[ConfigImpact], old: str, new: str, edit: PolicyEdit | None = None, env_names: frozenset[str] | None = None) -> str:
    """Summary table first (after ``edit``, what changed in the files, as ``kvpolicy diff`` prints
    it first), details after."""
    read = [r for r in results if not r.skipped]
    skipped = len(results) - len(read)
    folder = _common_folder([r.path for r in read])
    lines = [
        f"kvpolicy impact {old} -> {new}: {plural(len(read), 'config')}"
        + (f" under {folder}/" if folder else "")
        + (f", {skipped} skipped (no cache_transceiver_config)" if skipped else ""),
    ]
    if read:
        lines.append(f"  {_counts(results)}")
        unknown_line = _unknown_line(results)
        if unknown_line:
            lines.append(unknown_line)
    if edit:
        lines += ["", *edit_lines(edit, limit=_EDIT_LIMIT, details=False)]
    rows = [("config", "side", "architecture", old, new, "status")]
    for result in read:
        first = True
        for section in result.sections:
            rows.append(
                (
                    _short_path(result.path, folder) if first else "",
                    _SIDE_LABELS.get(section.name, section.name),
                    _architecture(result) if first else "",
                    section.old.short(),
                    section.new.short(),
                    section.status,
                )
            )
            first = False
        if result.mismatch_old or result.mismatch_new:
            rows.append(("", "both", "", "mismatch" if result.mismatch_old else "ok", "mismatch" if result.mismatch_new else "ok", result.status))
        if result.problems:
            rows.append((_short_path(result.path, folder) if first else "", "-", "", "", "", "malformed"))
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(6)]
        lines.append("")
        for index, row in enumerate(rows):
            lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
            if index == 0:
                lines.append("  ".join("-" * width for width in widths))
        lines.append("")
        lines.append("! fails at start-up; /V2: KV-cache manager V2")
    details = [_details(r, old, new, env_names) for r in read]
    details = [d for d in details if d]
    if details:
        lines += ["", "details", "-------"]
        lines += "\n\n".join(details).splitlines()
    return "\n".join(lines)


def _details(result: ConfigImpact, old: str, new: str, env_names: frozenset[str] | None = None) -> str:
    lines: list[str] = []
    for problem in result.problems:
        lines.append(f"{problem.location}: error: {problem.message}")
    interesting = [s for s in result.sections if s.status != "unchanged" or s.known_status != "unchanged"]
    unknown = not result.architecture_known and (result.sections or not result.problems)
    if not (lines or interesting or result.mismatch_old or result.mismatch_new or unknown):
        return ""
    if not result.problems:
        lines.append(f"{result.path}: {result.status}")
    if unknown:
        identity = next((s.identity for s in result.sections if s.identity is not None and not s.identity.known), None)
        lines.append(f"  model: {identity.describe() if identity is not None else 'unknown'}")
        if len(result.possibilities) > 1:
            for status, labels in result.possibilities:
                lines.append(f"    {status} for {', '.join(labels)}")
            lines.append("  shown below for any other architecture")
        else:
            lines.append(f"  {result.status} for every architecture")
    elif result.sections:
        lines.append(f"  architecture {_architecture(result)} from {result.architecture_source}")
    # Sides that change alike are shown once.
    shown: dict[tuple[Any, ...], list[SectionImpact]] = {}
    for section in interesting:
        key = (section.status, tuple(_side_lines(old, section.old)), tuple(_side_lines(new, section.new)))
        shown.setdefault(key, []).append(section)
    for (status, old_lines, new_lines), sections in shown.items():
        names = " and ".join(f"{_SIDE_LABELS.get(s.name, s.name)} (line {s.line})" for s in sections)
        lines.append(f"  {names}: {status}")
        for used in dict.fromkeys(s.used for s in sections):
            if used:
                lines.append("    " + (read_line(used, env_names) if env_names is not None else f"read: {'; '.join(used)}"))
        # A diagnostic both versions report is shown once, after both.
        both = [line for line in old_lines[1:] if line in new_lines[1:]]
        lines += [f"    {line}" for line in (old_lines[0], *(x for x in old_lines[1:] if x not in both))]
        lines += [f"    {line}" for line in (new_lines[0], *(x for x in new_lines[1:] if x not in both))]
        lines += [f"    both versions: {line.strip()}" for line in both]
    for label, mismatch in ((old, result.mismatch_old), (new, result.mismatch_new)):
        if mismatch:
            lines.append(f"  {label}: error[sides-disagree]: {mismatch}")
    return "\n".join(lines)


def _side_lines(label: str, side: Side) -> list[str]:
    if side.invalid is not None:
        return [f"{label}: invalid: {side.invalid}"]
    if side.fixed is not None:
        return [f"{label}: CPP, not resolved ({side.fixed})"]
    r = side.resolution
    assert r is not None
    if not r.enabled:
        return [f"{label}: disaggregation off"]
    lines = [f"{label}: {r.runtime} on {r.backend}, kv_cache_manager {r.kv_cache_manager} (runtime decided by {r.decided_by['transceiver_runtime']})"]
    for d in r.diagnostics:
        if d.severity != "info":
            lines.append(f"  {d.severity}[{d.id}]: {d.message}")
    return lines


def _side_json(side: Side) -> dict[str, Any]:
    if side.invalid is not None:
        return {"invalid": side.invalid}
    if side.fixed is not None:
        return {"enabled": True, "values": {"transceiver_runtime": "CPP"}, "not_resolved": side.fixed}
    assert side.resolution is not None
    return side.resolution.to_dict()


def to_json(results: list[ConfigImpact], old: str, new: str) -> dict[str, Any]:
    """Every config with every section's resolution under both versions."""
    return {
        "from": old,
        "to": new,
        "skipped": [r.path for r in results if r.skipped],
        "configs": [
            {
                "path": r.path,
                "status": r.status,
                "model": r.model,
                "architecture": r.architecture,
                "model_type": r.model_type,
                "architecture_source": r.architecture_source,
                "architecture_known": r.architecture_known,
                "possibilities": [{"status": status, "architectures": list(labels)} for status, labels in r.possibilities],
                "problems": [{"location": p.location, "line": p.line, "message": p.message} for p in r.problems],
                "mismatch": {"old": r.mismatch_old, "new": r.mismatch_new},
                "sections": [
                    {
                        "name": s.name,
                        "line": s.line,
                        "status": s.status,
                        "parallel": dict(s.parallel),
                        "model": s.identity.describe() if s.identity is not None else None,
                        "possibilities": [{"status": status, "architectures": list(labels)} for status, labels in s.possibilities],
                        "old": _side_json(s.old),
                        "new": _side_json(s.new),
                        "used": list(s.used),
                    }
                    for s in r.sections
                ],
            }
            for r in results
            if not r.skipped
        ],
    }


class _Note(NamedTuple):
    """One GitHub annotation before it is written: its place in the file order and its rank (configs
    that start failing first, then those that fail differently, then the rest)."""

    level: str
    path: str
    line: int | None
    message: str
    rank: int = 2

    def annotation(self) -> str:
        where = f"file={github_escape(self.path, prop=True)}" + (f",line={self.line}" if self.line else "")
        return f"::{self.level} {where}::{github_escape(self.message)}"


#: GitHub shows at most 10 annotations of each level per step (50 per job); more are dropped silently.
GITHUB_PER_LEVEL = 10


def render_github(results: list[ConfigImpact], old: str, new: str, *, summary_file: str | None = None) -> str:
    """GitHub workflow annotations: errors for every config that fails under the new version (it
    starts failing, still fails, fails differently, or cannot be read), warnings for changes and
    new warnings, notices for configs that stop failing.

    GitHub shows only :data:`GITHUB_PER_LEVEL` annotations of a level per step: beyond that, the
    first ones are kept (configs that start failing first, then other failures, in file order) and
    one annotation per level says how many more there are; with ``summary_file`` (the step summary,
    ``$GITHUB_STEP_SUMMARY``) every annotation is also appended there as a Markdown table."""
    notes = _github_notes(results, old, new)
    shown: list[str] = []
    hidden: dict[str, int] = {}
    for level in ("error", "warning", "notice"):
        of_level = [note.annotation() for note in notes if note.level == level]
        shown += of_level[: GITHUB_PER_LEVEL - 1] if len(of_level) > GITHUB_PER_LEVEL else of_level
        if len(of_level) > GITHUB_PER_LEVEL:
            hidden[level] = len(of_level) - (GITHUB_PER_LEVEL - 1)
            where = "the step summary" if summary_file else "--format text, json or sarif"
            shown.append(f"::{level} title=kvpolicy impact::{hidden[level]} more {level}s than GitHub shows; every one is in {where}")
    if summary_file and hidden:
        rows = ["| level | config | message |", "|---|---|---|"]
        rows += [f"| {note.level} | {_cell(note.path)} | {_cell(note.message)} |" for note in notes]
        try:
            with open(summary_file, "a", encoding="utf-8") as handle:
                handle.write(f"### kvpolicy impact {old} -> {new}\n\n" + "\n".join(rows) + "\n\n")
        except OSError:
            pass  # the annotations stand; the summary is extra
    return "\n".join(shown)


def _cell(text: str) -> str:
    """Text as one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _github_notes(results: list[ConfigImpact], old: str, new: str) -> list[_Note]:
    """Every annotation, most important first (the sort is stable: file order within a rank)."""
    lines: list[_Note] = []
    for r in results:
        if r.skipped:
            continue
        for p in r.problems:
            lines.append(_Note("error", p.path, p.line, p.message))
        if not r.problems and not r.architecture_known:
            line = r.sections[0].line if r.sections else None
            if r.status == "architecture unknown":
                level = "error" if r.may_fail else "warning"
                detail = "; ".join(f"{status} for {', '.join(labels)}" for status, labels in r.possibilities)
                message = (
                    f"architecture unknown, the outcome depends on the model ({old} -> {new}): {detail}. "
                    "Give the checkpoint's config.json (--models-root, $LLM_MODELS_ROOT) or --arch-map"
                )
                lines.append(_Note(level, r.path, line, message))
            else:
                lines.append(_Note("notice", r.path, line, f"architecture unknown; {r.status} for every architecture ({old} -> {new})"))
        for s in r.sections:
            if s.status == "architecture unknown":
                continue
            status = s.status
            if status == "unchanged":
                continue
            # Every failing config gets an error, including one that already failed before.
            level = "error" if status in _FAILING or status == "still failing" else "notice" if status == "stops failing" else "warning"
            side = _SIDE_LABELS.get(s.name, s.name)
            text = f"{side}: {status} from {old} to {new}: {s.old.short().rstrip('!')} -> {s.new.short().rstrip('!')}"
            errors = [d for d in (s.new.resolution.errors if s.new.resolution else ())]
            if errors and (status in _FAILING or status == "still failing"):
                text += f". {errors[0].id}: {errors[0].message}"
            elif s.new.invalid:
                text += f". {s.new.invalid}"
            lines.append(_Note(level, r.path, s.line, text, {"starts failing": 0, "fails differently": 1}.get(status, 2)))
        if r.mismatch_new:
            line = r.sections[0].line if r.sections else None
            still = " (already under " + old + ")" if r.mismatch_old else ""
            lines.append(_Note("error", r.path, line, f"under {new}: {r.mismatch_new}{still}"))
    return sorted(lines, key=lambda note: note.rank)


#: SARIF rules of ``impact``: one per status worth a look, with its level.
_SARIF_RULES = {
    "starts-failing": ("error", "A config that starts under the old version fails under the new one"),
    "fails-differently": ("error", "A config fails under both versions, for other reasons"),
    "malformed": ("error", "A config that cannot be read or resolved"),
    "architecture-unknown": ("warning", "The config's model could not be identified and the outcome depends on it"),
    "still-failing": ("note", "A config fails under both versions, alike"),
    "changes": ("note", "A config resolves differently (runtime, backend, KV-cache manager or warnings)"),
}


def render_sarif(results: list[ConfigImpact], old: str, new: str) -> str:
    """SARIF 2.1.0 for code scanning: one result per config that fails, may fail for an unknown
    model (level error when some model would start failing, warning otherwise) or changes."""
    from .. import __version__
    from ..lint.report import DOCS_URL  # (here: lint's report module pulls in the rule catalogue)

    found: list[dict[str, Any]] = []

    def add(rule: str, level: str, path: str, line: int | None, message: str) -> None:
        region = {"region": {"startLine": line}} if line else {}
        found.append(
            {
                "ruleId": rule,
                "ruleIndex": list(_SARIF_RULES).index(rule),
                "level": level,
                "message": {"text": message},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": Path(path).as_posix()}, **region}}],
            }
        )

    for r in results:
        if r.skipped:
            continue
        for p in r.problems:
            add("malformed", "error", p.path, p.line, p.message)
        if r.problems:
            continue
        line = r.sections[0].line if r.sections else None
        if r.status == "architecture unknown":
            detail = "; ".join(f"{status} for {', '.join(labels)}" for status, labels in r.possibilities)
            add(
                "architecture-unknown",
                "error" if r.may_fail else "warning",
                r.path,
                line,
                f"the model is unknown and the outcome from {old} to {new} depends on it: {detail}. "
                "Give the checkpoint's config.json (--models-root, $LLM_MODELS_ROOT) or --arch-map",
            )
            continue
        status = r.status
        rule = {"starts failing": "starts-failing", "fails differently": "fails-differently", "still failing": "still-failing"}.get(
            status, "changes" if status not in ("unchanged", "stops failing") else None
        )
        if rule is None:
            continue
        level = _SARIF_RULES[rule][0]
        reasons = [f"{s.name}: {s.old.short()} -> {s.new.short()}" for s in r.sections if s.status != "unchanged"]
        if r.mismatch_new:
            reasons.append(r.mismatch_new)
        add(rule, level, r.path, line, f"{status} from {old} to {new}: " + "; ".join(reasons))
    document = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "kvpolicy impact",
                        "version": __version__,
                        "rules": [
                            {
                                "id": rule,
                                "shortDescription": {"text": text},
                                "defaultConfiguration": {"level": level},
                                "helpUri": f"{DOCS_URL}diff-impact/#what-each-status-means",
                            }
                            for rule, (level, text) in _SARIF_RULES.items()
                        ],
                    }
                },
                "results": found,
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"
