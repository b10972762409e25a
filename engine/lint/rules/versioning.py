"""Versioning rules (KVP050-KVP053): version hygiene across the files of a run and against ``--base``.
They are *set* rules: each sees every file of the run."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

from ...read.model import Policy
from ...read.source import Location
from .base import PLACEHOLDER, Finding, PolicyFile, register


@register("KVP050", "duplicate-version", "versioning", "error", "Two policy files of one folder declare the same version", "set")
def duplicate_version(files: list[PolicyFile], base: Any = None) -> Iterator[Finding]:
    """## What it does
    Reports a policy file whose ``version`` another file in the same folder already declares.

    ## Why is this bad?
    ``kvpolicy.load(folder, version=...)`` cannot choose between them, and resolutions name
    their policy version: two files with one version make every decision log ambiguous.

    ## Example
    ``policies/2026.09.10.toml`` and ``policies/2026.09.10-fix.toml`` both say
    ``version = "2026.09.10"``.

    ## Fix
    Give the newer file its own version (``2026.09.10.1``).
    """
    from pathlib import Path

    seen: dict[tuple[str, str], PolicyFile] = {}
    for file in files:
        if file.policy is None:
            continue
        key = (str(Path(file.path).parent), file.policy.version)
        first = seen.get(key)
        if first is None:
            seen[key] = file
            continue
        where = first.locate(("version",))
        yield Finding(
            "KVP050",
            f"version {file.policy.version} is also declared by {first.path}:{where.line}; give each file its own version",
            file.locate(("version",)),
            "error",
            related=((where, "the same version"),),
        )


@register("KVP051", "unbumped-version", "versioning", "error", "Policy content changed without a version bump (needs --base)", "set")
def unbumped_version(files: list[PolicyFile], base: Any = None) -> Iterator[Finding]:
    """## What it does
    With ``--base GIT_REF``, compares each policy file with its content at that ref. When the
    policy *content* changed (the TOML data, not comments or layout) but ``version`` did not,
    reports the ``version`` line.

    ## Why is this bad?
    A version names one behaviour: decision logs, ``diff`` and deployed processes rely on it.
    Changing what a version decides without renaming it rewrites history silently.

    ## Example
    A pull request adds a preference row to ``policies/2026.09.10.toml`` and keeps
    ``version = "2026.09.10"``.

    ## Fix
    Copy the file to a new version (``2026.09.10.1`` or a new date) and change the copy.
    """
    if base is None:
        return
    for file in files:
        if file.policy is None or file.document is None:
            continue
        old = base(file.path)
        if old is None or not isinstance(old.get("version"), str):
            continue
        if old["version"] == file.policy.version and old != file.document.data:
            yield Finding(
                "KVP051",
                f"the policy content changed since the base revision but version {file.policy.version} did not; release the change as a new version",
                file.locate(("version",)),
                "error",
            )


def _predecessors(files: list[PolicyFile]) -> Iterator[tuple[PolicyFile, PolicyFile]]:
    """(file, the file of the closest earlier version in its folder) for every loaded file of
    the run that has one. Files whose version another file repeats are KVP050's."""
    from pathlib import Path

    from ...read.policyfile import version_key

    folders: dict[str, list[PolicyFile]] = {}
    for file in files:
        if file.policy is not None:
            folders.setdefault(str(Path(file.path).parent), []).append(file)
    for found in folders.values():
        found.sort(key=lambda f: (version_key(f.policy.version), f.path))  # type: ignore[union-attr]  # only loaded files are in folders
        for earlier, later in zip(found, found[1:]):
            assert earlier.policy is not None and later.policy is not None
            if earlier.policy.version != later.policy.version:
                yield later, earlier


#: Policy fields that name a version rather than say what it decides.
_IDENTITY_FIELDS = frozenset({"version", "summary", "source", "path", "digest"})


def _content(value: Any) -> Any:
    """What a loaded policy (or a part of it) holds, without where it stands in its file."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        named = (f.name for f in dataclasses.fields(value))
        return {name: _content(getattr(value, name)) for name in named if not isinstance(getattr(value, name), Location)}
    if isinstance(value, dict):
        return {key: _content(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_content(item) for item in value]
    return value


def _policy_content(policy: Policy) -> dict[str, Any]:
    return {f.name: _content(getattr(policy, f.name)) for f in dataclasses.fields(policy) if f.name not in _IDENTITY_FIELDS}


@register("KVP052", "identical-version", "versioning", "warning", "A version with the same content as the version before it", "set")
def identical_version(files: list[PolicyFile], base: Any = None) -> Iterator[Finding]:
    """## What it does
    Compares each loaded policy with the closest earlier version of the same folder among the
    files of the run (lint the folder, as ``kvpolicy check`` does). When the two hold the
    same features, decisions, rules, rows, constraints and checkpoint rules — reasons and
    sources included; only ``version``, ``summary`` and ``source`` differ — reports the
    ``version`` line. The loaded policies are compared, so comments and layout do not count.

    ## Why is this bad?
    A version names one upstream behavioural change. A copy that changes nothing (what
    ``kvpolicy new`` gives before it is edited) adds a version that decides exactly what the
    previous one decides, while its summary and source claim a change: ``diff`` shows
    nothing, and a TensorRT-LLM release mapped to it is mapped to nothing new.

    ## Example
    ``policies/2026.10.01.toml``, made by ``kvpolicy new 2026.10.01`` and never edited
    beyond its summary and source, next to ``policies/2026.09.10.toml``.

    ## Fix
    Make the change the version is for, or delete the file. Where a version restates its
    predecessor on purpose, suppress the finding on its ``version`` line with the reason.
    """
    for file, earlier in _predecessors(files):
        assert file.policy is not None and earlier.policy is not None
        if _policy_content(file.policy) != _policy_content(earlier.policy):
            continue
        where = earlier.locate(("version",))
        yield Finding(
            "KVP052",
            f"version {file.policy.version} has the same content as the version before it, {earlier.policy.version} "
            f"({earlier.path}); only version, summary and source differ: make the change this version is for, "
            "or delete it",
            file.locate(("version",)),
            "warning",
            related=((where, f"version {earlier.policy.version}"),),
        )


_REFERENCE = re.compile(r"https?://[^\s)\]>,;]+|#[0-9]+")


def _references(source: str) -> frozenset[str]:
    """The upstream changes a source names: ``#NNNN`` numbers and URLs."""
    return frozenset(match.rstrip(".").lower() for match in _REFERENCE.findall(source))


@register("KVP053", "repeated-source", "versioning", "warning", "A version that cites only what the version before it cites", "set")
def repeated_source(files: list[PolicyFile], base: Any = None) -> Iterator[Finding]:
    """## What it does
    Compares the top-level ``source`` of each loaded policy with that of the closest earlier
    version of the same folder among the files of the run. Reports the ``source`` line when
    it names no upstream change (``#NNNN``, a URL) that the earlier one does not already name
    or, naming none, when it is the same text.

    ## Why is this bad?
    A new version exists because something changed; its ``source`` should cite that change.
    A source copied from the previous version credits the previous upstream change for an
    edit it did not make, and reports and reviewers then misattribute it.

    ## Example
    ```toml
    # policies/2026.09.10.toml
    source = "NVIDIA/TensorRT-LLM #19004 (merged 2026-09-15)"
    # policies/2026.10.01.toml
    source = "NVIDIA/TensorRT-LLM #19004 (merged 2026-09-15)"
    ```

    ## Fix
    Cite the upstream change this version mirrors (PR, merge date, file). A version that
    corrects kvpolicy's own reading of the same upstream change should say so in its
    ``source`` and suppress the finding on that line with the reason.
    """
    for file, earlier in _predecessors(files):
        assert file.policy is not None and earlier.policy is not None
        source, before = file.policy.source, earlier.policy.source
        if PLACEHOLDER in source:
            continue  # KVP042's
        cited = _references(source)
        if cited:
            if not cited <= _references(before):
                continue
            detail = f"it names only {', '.join(sorted(cited))}, which {earlier.policy.version} already cites"
        else:
            if " ".join(source.split()).casefold() != " ".join(before.split()).casefold():
                continue
            detail = f"it is the source of {earlier.policy.version}"
        where = earlier.locate(("source",))
        yield Finding(
            "KVP053",
            f"source of version {file.policy.version} cites nothing new: {detail} ({earlier.path}); cite the upstream change this version mirrors",
            file.locate(("source",)),
            "warning",
            related=((where, f"source of {earlier.policy.version}"),),
        )
