"""``kvpolicy upstream draft``: the next policy version, from the newest one plus what the tree says.

What the tree states outright is written: preference rows added, changed or removed (their
``source`` from git when the tree is a checkout: the newest commit among the lines that decide the
row, its date and the PR number of its subject, ``... (#NNNNN)``; otherwise a ``TODO(kvpolicy new)``
placeholder that lint refuses, KVP042), and the ``[upstream]`` baseline (environment names,
fingerprints). What is logic is never accepted for a person: a fingerprint that moved or was never
recorded, and an environment name not reviewed, are written with a ``TODO(kvpolicy new)`` comment
naming the function or name to read, so ``kvpolicy check`` refuses the draft until a person has
read each and deleted its comment. Everything else (fields, checkpoint rules, rows static analysis
cannot read) is listed for a person and left as it was.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from ..lint.rules import PLACEHOLDER
from .drift import Drift
from .extract import Facts, Hook, Where

__all__ = ["Provenance", "apply", "provenance"]

_PR = re.compile(r"\(#(\d{1,7})\)\s*$")
_GIT_TIMEOUT = 30.0


@dataclass(frozen=True)
class Provenance:
    commit: str
    date: str  # YYYY-MM-DD, the commit's (a squash merge's) date
    subject: str
    pr: str | None

    def cite(self, what: str) -> str:
        if self.pr:
            return f"NVIDIA/TensorRT-LLM #{self.pr} (merged {self.date}, commit {self.commit[:8]}): {what}"
        return f"NVIDIA/TensorRT-LLM commit {self.commit[:8]} ({self.date}, {self.subject!r}: its subject names no PR): {what}"


def provenance(root: Path, chain: tuple[Where, ...]) -> Provenance | None:
    """The newest commit among the lines of ``chain`` (``git blame``), or None when git cannot say."""
    best: tuple[int, Provenance] | None = None
    for where in dict.fromkeys(chain):
        try:
            out = subprocess.run(
                ["git", "-C", str(root), "blame", "--porcelain", "-L", f"{where.line},{where.line}", "--", where.file],
                capture_output=True,
                text=True,
                timeout=_GIT_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0 or not out.stdout:
            return None
        lines = out.stdout.splitlines()
        commit = lines[0].split()[0]
        fields = dict(line.split(" ", 1) for line in lines[1:] if " " in line and not line.startswith("\t"))
        when = int(fields.get("committer-time", "0"))
        subject = fields.get("summary", "")
        date = _day(when)
        match = _PR.search(subject)
        found = Provenance(commit, date, subject, match.group(1) if match else None)
        if best is None or when > best[0]:
            best = (when, found)
    return best[1] if best else None


def _day(epoch: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%d")


def apply(text: str, facts: Facts, drift: list[Drift], *, root: Path, git: bool, read: str) -> tuple[str, list[Drift], list[str]]:
    """The base version's ``text`` with the draftable drift applied and the baseline written.

    Returns the new text, the drift left for a person, and one line per edit made."""
    doc = tomlkit.parse(text)
    edits: list[str] = []
    left: list[Drift] = []
    for item in drift:
        if not item.draftable or item.decision is None or item.architecture is None:
            left.append(item)
            continue
        preference = doc.get("decisions", {}).get(item.decision, {}).get("preference")
        rows = preference.get("rows") if preference is not None else None
        if rows is None:  # the base version has no preference for this decision: a person adds one
            left.append(item)
            continue
        fact = facts.architectures.get(item.architecture)
        hook = fact.hooks[item.decision] if fact else None
        if item.kind == "row-extra":
            # Deleted in place: the other rows keep their comments (lint suppressions among them).
            for index in reversed(range(len(rows))):
                if rows[index].get("architecture") == item.architecture and _matches(rows[index], item):
                    del rows[index]
            edits.append(f"removed {item.decision} row {item.architecture} ({item.old}): {item.message}")
            continue
        assert hook is not None
        source = _source(root, git, hook, item.architecture)
        reason = f"{hook.why[:1].upper()}{hook.why[1:]} (drafted by kvpolicy upstream draft from {read})."
        if item.kind == "row-missing":
            row = tomlkit.inline_table()
            row.update({"architecture": item.architecture, "value": hook.value, "reason": reason, "source": source})
            rows.append(row)
            edits.append(f"added {item.decision} row {item.architecture} = {hook.value}")
        else:  # row-changed
            for row in rows:
                if row.get("architecture") == item.architecture and "model_type" not in row:
                    row["value"] = hook.value
                    row["reason"] = reason
                    row["source"] = source
            edits.append(f"changed {item.decision} row {item.architecture}: {item.old} -> {hook.value}")
    _baseline(doc, facts, read)
    text = tomlkit.dumps(doc)
    for item in drift:
        if item.kind == "row-missing" and item.draftable and item not in left and item.architecture and item.new:
            text = _suppression_of_siblings(text, item.architecture, item.new)
    return text, left, edits


_SUPPRESSION = re.compile(r"(\s+# kvpolicy: ignore\[[A-Z0-9, ]+\][^\n]*)$")


def _suppression_of_siblings(text: str, arch: str, value: str) -> str:
    """A drafted row gets the lint suppression its siblings of the same value carry in the version:
    such a comment states the version's upstream semantics (e.g. #18134 adopting every preference
    verbatim, so a PYTHON preference fails where upstream fails: KVP030), which hold for it too."""
    lines = text.split("\n")
    target = next((i for i, line in enumerate(lines) if f'architecture = "{arch}"' in line and f'value = "{value}"' in line), None)
    if target is None or "# kvpolicy: ignore[" in lines[target]:
        return text
    start = target
    while start > 0 and not lines[start - 1].startswith("rows = ["):
        start -= 1
    end = target
    while end < len(lines) and not lines[end].startswith("]"):
        end += 1
    for line in lines[start:end]:
        match = _SUPPRESSION.search(line)
        if match and f'value = "{value}"' in line:
            lines[target] = lines[target].rstrip() + match.group(1)
            break
    return "\n".join(lines)


def _matches(row: dict, item: Drift) -> bool:
    shown = row.get("value") if row.get("model_type") is None else f"{row.get('value')} (model_type {row.get('model_type')})"
    return shown == item.old


def _source(root: Path, git: bool, hook: Hook, arch: str) -> str:
    where = hook.where or (hook.chain[-1] if hook.chain else None)
    what = f"{hook.why}, {where.file}" if where else hook.why
    if git:
        found = provenance(root, hook.chain)
        if found is not None:
            return found.cite(what)
    return f"{PLACEHOLDER}: the upstream PR, merge date and file behind {arch}'s row ({what}, line {where.line if where else '?'})"


def _baseline(doc: tomlkit.TOMLDocument, facts: Facts, read: str) -> None:
    old = doc.get("upstream")
    before = dict(old.get("fingerprints", {})) if old else {}
    env_before = set(old.get("env", [])) if old else set()
    table = tomlkit.table()
    table.add("read", read)
    env = tomlkit.array()
    env.multiline(True)
    for name in sorted(facts.env):
        if name in env_before:
            env.add_line(name)
        else:
            env.add_line(name, comment=f"{PLACEHOLDER}: read what {name} switches ({facts.env[name]}), then delete this comment")
    table.add("env", env)
    prints = tomlkit.table()
    hooks = {h.logic for a in facts.architectures.values() for h in a.hooks.values() if h.logic}
    for name in sorted(facts.logic):
        fact = facts.logic[name]
        prints.add(name, fact.fingerprint)
        if before.get(name) != fact.fingerprint:
            what = "changed since the last baseline" if name in before else "not read for a version yet"
            kind = "hook static analysis cannot evaluate" if name in hooks else "rule-bearing function"
            prints[name].comment(f"{PLACEHOLDER}: {kind} {what}: read {fact.where}, then delete this comment")
    table.add("fingerprints", prints)
    if old is not None:
        del doc["upstream"]
    doc.add(tomlkit.nl())
    doc.add("upstream", table)
