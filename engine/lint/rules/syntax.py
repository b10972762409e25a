"""Syntax rules (KVP001-KVP003): the file is not a policy, by TOML, by the schema or by kvpolicy's limits."""

from __future__ import annotations

from collections.abc import Iterator

from .base import Finding, PolicyFile, loader_findings, register


@register("KVP001", "invalid-toml", "syntax", "error", "The file is not valid UTF-8 TOML", "loader")
def invalid_toml(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a policy file that is not UTF-8 text or not valid TOML, at the position the TOML
    parser stopped.

    ## Why is this bad?
    Nothing else can be checked, and ``kvpolicy.load`` refuses the file: every process that uses
    the policy fails at start-up.

    ## Example
    ```toml
    version = "2026.09.10
    ```

    ## Fix
    Correct the syntax at the reported line and column (here: close the string).
    """
    yield from loader_findings(file, "toml", "KVP001")


@register("KVP002", "schema-violation", "syntax", "error", "The file does not match the policy schema", "loader")
def schema_violation(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports every place where the document breaks ``policy.schema.json``: unknown keys (with a
    "did you mean"), missing keys, wrong types, values outside an enumeration, bad patterns.
    All schema problems of a file are reported in one run.

    ## Why is this bad?
    The loader rejects the file, so the policy cannot be used at all.

    ## Example
    ```toml
    [[decisions.transceiver_runtime.requirement]]
    id = "kimi-k3-requires-python"
    wen = { architecture = "KimiK3ForCausalLM" }   # unknown key 'wen'; did you mean 'when'?
    value = "PYTHON"
    ```

    ## Fix
    Follow the message: rename, add or retype the key. Editors that read the ``#:schema``
    comment at the top of shipped files show the same problems while typing.
    """
    yield from loader_findings(file, "schema", "KVP002")


#: Loader checks that a rule of its own maps; every other check (``io``, ``size``, and any the
#: loader gains later) is KVP003, so lint never passes a file that ``kvpolicy.load`` refuses.
_MAPPED_CHECKS = {"toml", "schema", "unknown-name", "duplicate-id", "placeholder", "cycle", "conflicting-rows"}


@register("KVP003", "refused-file", "syntax", "error", "The file cannot be read within kvpolicy's limits", "loader")
def refused_file(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a file that every command refuses before parsing it: not a regular file (a FIFO, a
    device, a folder), a symlink that loops or points outside the policy folder, a file over
    the size limit, or a structure beyond the parser's bounds (nesting, dotted keys, bare values
    over 64 characters, more tables than a policy may hold).

    ## Why is this bad?
    ``kvpolicy.load`` refuses the file with the same message: every process that uses the
    policy fails at start-up. A hostile file must fail fast, not hang or exhaust memory.

    ## Example
    ```toml
    schema = 1000000000000000000000000000000000000000000000000000000000000000000000
    ```

    ## Fix
    Keep policy files plain: regular files inside the policy folder (or a folder that
    ``[tool.kvpolicy] allow-symlinks`` names), under 32 MiB, nested as the schema shows.
    """
    for problem in file.problems:
        if problem.check not in _MAPPED_CHECKS:
            yield Finding("KVP003", problem.message, problem.location, "error")
