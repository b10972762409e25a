"""Documentation rules (KVP040-KVP042): rules and rows that do not say why, and placeholders left unfilled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...read.model import Policy
from ...read.source import Location
from .base import PLACEHOLDER, Finding, PolicyFile, register


def _documented(policy: Policy) -> Iterator[tuple[Any, str]]:
    for decision in policy.decisions.values():
        for rule in (*decision.requirements, *decision.conditionals, decision.default):
            yield rule, f"{rule.stage} {rule.id}"
        if decision.preference is not None:
            for row in decision.preference.rows:
                yield row, f"preference row {row.id}"
    for constraint in policy.constraints:
        yield constraint, f"constraint {constraint.id}"


@register("KVP040", "missing-reason", "documentation", "warning", "A rule, row or constraint without a reason")
def missing_reason(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a requirement, conditional, default, preference row or constraint without a
    ``reason``.

    ## Why is this bad?
    ``explain`` shows the reason of the rule that decided. Without one, the person debugging a
    surprising runtime choice learns *which* rule decided but not *why* it exists.

    ## Example
    ```toml
    rows = [{ architecture = "LlamaForCausalLM", value = "PYTHON" }]
    ```

    ## Fix
    Add ``reason = "..."``: one sentence on why this value, for this model or context.
    """
    assert file.policy is not None
    for item, label in _documented(file.policy):
        if not item.reason:
            yield Finding("KVP040", f"{label} has no reason; say why it exists", file.anchor(item), "warning")


@register("KVP041", "missing-source", "documentation", "warning", "A rule, row or constraint without a source")
def missing_source(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a requirement, conditional, default, preference row or constraint without a
    ``source``: the upstream change, capability table or issue it reproduces.

    ## Why is this bad?
    Policies reproduce upstream behaviour version by version. A rule without a source cannot be
    checked against what TensorRT-LLM actually did, and reviewers cannot tell a faithful
    reproduction from an invention.

    ## Example
    ```toml
    rows = [{ architecture = "LlamaForCausalLM", value = "PYTHON", reason = "..." }]
    ```

    ## Fix
    Add ``source = "..."`` naming the upstream change (PR, release note or capability table).
    """
    assert file.policy is not None
    for item, label in _documented(file.policy):
        if not item.source:
            yield Finding("KVP041", f"{label} has no source; name the upstream change it reproduces", file.anchor(item), "warning")


@register("KVP042", "unfilled-placeholder", "documentation", "error", "A placeholder `kvpolicy new` wrote is still in the file")
def unfilled_placeholder(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports every line that still holds the ``TODO(kvpolicy new)`` marker: the ``summary``,
    ``source`` and header comment that ``kvpolicy new`` writes as placeholders instead of
    copying the previous version's.

    ## Why is this bad?
    ``summary`` and ``source`` are what ``versions``, ``report`` and reviewers read to learn
    what a version is and which upstream change it mirrors. A placeholder says nothing; a
    copied one (what ``new`` used to write) credits the previous version's upstream change
    for an edit it did not make.

    ## Example
    ```toml
    version = "2026.10.01"
    summary = "TODO(kvpolicy new): one line on what this version changes"
    ```

    ## Fix
    Replace each placeholder: ``summary`` with one line on what this version changes,
    ``source`` with the upstream change it mirrors (repository, PR, merge date, file) or, for
    a change of kvpolicy's own, what that change is; the header comment with a description of
    the version (or delete it).
    """
    try:
        text = file.raw.decode("utf-8")
    except UnicodeDecodeError:  # pragma: no cover - such a file does not load
        return
    if PLACEHOLDER not in text:
        return
    keys = {}
    for top_key in ("summary", "source"):
        where = file.locate((top_key,))
        keys[where.line] = top_key
    for number, line in enumerate(text.splitlines(), start=1):
        column = line.find(PLACEHOLDER)
        if column < 0:
            continue
        key = keys.get(number)
        if key == "summary":
            message = "summary is still the placeholder `kvpolicy new` wrote; say in one line what this version changes"
        elif key == "source":
            message = (
                "source is still the placeholder `kvpolicy new` wrote; name the upstream change this version mirrors "
                "(repository, PR, merge date, file), or say which change of kvpolicy's own it is"
            )
        elif line.lstrip().startswith("#"):
            message = "a placeholder comment `kvpolicy new` wrote is still here; describe this version, or delete the comment"
        else:
            message = f"a placeholder `kvpolicy new` wrote is still here; replace the {PLACEHOLDER} text"
        yield Finding("KVP042", message, Location(file.path, number, column + 1), "error")
