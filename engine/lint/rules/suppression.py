"""Suppression rules (KVP090, KVP091): suppression comments that suppress nothing or do not say why. The
runner reports these while it applies suppressions; the functions here only carry the rules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import Finding, PolicyFile, register


@register("KVP090", "unused-suppression", "suppression", "warning", "A suppression comment that suppresses nothing", "set")
def unused_suppression(files: list[PolicyFile], base: Any = None) -> Iterator[Finding]:
    """## What it does
    Reports a ``# kvpolicy: ignore[CODE]`` comment naming a code that no finding on that line
    has, or a code that does not exist. (Findings are produced by the linter run itself; this
    rule's function is a placeholder: the runner reports these after applying suppressions.)

    ## Why is this bad?
    Stale suppressions hide the next real finding on that line and mislead reviewers about
    what is being accepted.

    ## Example
    ```toml
    { architecture = "MistralForCausalLM", value = "CPP" },  # kvpolicy: ignore[KVP030] not needed
    ```

    ## Fix
    Delete the comment, or correct the code.
    """
    return iter(())


@register("KVP091", "suppression-without-reason", "suppression", "warning", "A suppression comment that does not say why", "set")
def suppression_without_reason(files: list[PolicyFile], base: Any = None) -> Iterator[Finding]:
    """## What it does
    Reports a ``# kvpolicy: ignore[CODE]`` comment with no text after the brackets. (Like
    KVP090, the runner reports these while it applies suppressions.)

    ## Why is this bad?
    A suppression makes a finding silent in CI but keeps it visible in review. Without a reason,
    the reviewer cannot tell an accepted upstream behaviour from a silenced mistake.

    ## Example
    ```toml
    { architecture = "LlamaForCausalLM", value = "PYTHON" },  # kvpolicy: ignore[KVP030]
    ```

    ## Fix
    Say why after the brackets:
    ``# kvpolicy: ignore[KVP030] upstream 2026-08-24 adopts preferences verbatim``.
    """
    return iter(())
