"""``kvpolicy upstream check``'s output: text, JSON, GitHub annotations and SARIF, like ``lint``'s.

Annotations sit on the policy file (the line of the row, field or baseline concerned; line 1 for
what the version lacks), since that is the repository a drift report is read in; the upstream
file and line are in the message and, in SARIF, a related location.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from ..wording import github_escape
from .drift import KINDS, Drift
from .extract import Facts

__all__ = ["CheckResult", "FORMATS", "render"]

FORMATS = ("text", "json", "github", "sarif")


@dataclass
class CheckResult:
    tree: str
    tree_kind: str
    release: str | None
    version: str
    policy_path: str
    chosen_by: str
    drift: list[Drift]
    facts: Facts

    @property
    def exit_code(self) -> int:
        return 1 if self.drift else 0


def render(result: CheckResult, fmt: str) -> str:
    return {"text": _text, "json": _json, "github": _github, "sarif": _sarif}[fmt](result)


def _headline(result: CheckResult) -> str:
    facts = result.facts
    release = f" (TensorRT-LLM {result.release})" if result.release else ""
    return (
        f"{result.tree}{release} against {result.version} ({result.chosen_by}): "
        f"{facts.files_read} files, {len(facts.architectures)} architectures, {len(facts.logic)} rule-bearing functions read"
    )


def _text(result: CheckResult) -> str:
    lines = [_headline(result)]
    if not result.drift:
        lines.append(f"no drift: every row, field, checkpoint rule, environment name and fingerprint of {result.version} matches the tree")
        return "\n".join(lines) + "\n"
    for drift in result.drift:
        where = f" [{drift.where}]" if drift.where else ""
        lines.append(f"{drift.code} {drift.kind}: {drift.message}{where}")
    counts: dict[str, int] = {}
    for drift in result.drift:
        counts[drift.kind] = counts.get(drift.kind, 0) + 1
    draftable = sum(1 for d in result.drift if d.draftable)
    lines.append(
        f"drift: {len(result.drift)} ({', '.join(f'{n} {k}' for k, n in counts.items())}); "
        f"{draftable} can be drafted (kvpolicy upstream draft), the rest need a person"
    )
    return "\n".join(lines) + "\n"


def _item(drift: Drift) -> dict[str, Any]:
    return {
        "code": drift.code,
        "kind": drift.kind,
        "subject": drift.subject,
        "message": drift.message,
        "old": drift.old,
        "new": drift.new,
        "upstream": {"file": drift.where.file, "line": drift.where.line} if drift.where else None,
        "policy_line": drift.policy_line,
        "decision": drift.decision,
        "architecture": drift.architecture,
        "draftable": drift.draftable,
    }


def _json(result: CheckResult) -> str:
    body = {
        "tree": result.tree,
        "tree_kind": result.tree_kind,
        "release": result.release,
        "version": result.version,
        "policy": result.policy_path,
        "chosen_by": result.chosen_by,
        "drift": [_item(d) for d in result.drift],
        "read": {
            "files": result.facts.files_read,
            "architectures": len(result.facts.architectures),
            "functions": len(result.facts.logic),
            "environment": len(result.facts.env),
        },
    }
    return json.dumps(body, indent=2) + "\n"


def _github(result: CheckResult) -> str:
    out = []
    for drift in result.drift:
        where = f" [{drift.where}]" if drift.where else ""
        props = ",".join(
            [
                f"file={github_escape(result.policy_path, prop=True)}",
                f"line={drift.policy_line or 1}",
                f"title={github_escape(f'{drift.code} {drift.kind}', prop=True)}",
            ]
        )
        out.append(f"::error {props}::{github_escape(drift.message + where)}")
    return "\n".join(out) + ("\n" if out else "")


def _sarif(result: CheckResult) -> str:
    rules = [
        {"id": code, "name": kind, "shortDescription": {"text": text}, "defaultConfiguration": {"level": "error"}}
        for kind, (code, _draft, text) in KINDS.items()
    ]
    index = {kind: n for n, kind in enumerate(KINDS)}
    results = []
    for drift in result.drift:
        entry: dict[str, Any] = {
            "ruleId": drift.code,
            "ruleIndex": index[drift.kind],
            "level": "error",
            "message": {"text": drift.message},
            "locations": [
                {"physicalLocation": {"artifactLocation": {"uri": PurePath(result.policy_path).as_posix()}, "region": {"startLine": drift.policy_line or 1}}}
            ],
            "partialFingerprints": {"kvpolicyUpstream/v1": f"{drift.kind}:{drift.subject}"},
        }
        if drift.where:
            uri = (Path(result.tree) / drift.where.file).as_posix()
            entry["relatedLocations"] = [
                {"id": 0, "message": {"text": "upstream"}, "physicalLocation": {"artifactLocation": {"uri": uri}, "region": {"startLine": drift.where.line}}}
            ]
        results.append(entry)
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "kvpolicy upstream", "rules": rules}}, "results": results}],
    }
    return json.dumps(log, indent=2) + "\n"
