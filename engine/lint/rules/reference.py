"""Reference rules (KVP010-KVP015): names that do not exist or are spelt wrong."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...read.model import DECISIONS, Condition, Policy
from ...wording import closest, suggest
from .base import Finding, PolicyFile, catalogue, loader_findings, register


@register("KVP010", "unknown-name", "reference", "error", "A value, feature, decision or input that the policy does not declare", "loader")
def unknown_name(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a rule value that is not one of its decision's ``values``, a condition on a feature
    that ``[features]`` does not declare, a condition on a decision that is not among the rule's
    ``inputs``, an input or constraint decision that is not declared, and a missing decision.

    ## Why is this bad?
    A misspelt value or name can never match: the rule silently never applies, or the loader
    refuses the file.

    ## Example
    ```toml
    [[decisions.transceiver_runtime.conditional]]
    id = "auto-cpp-off-nixl"
    when = { backend = { not = "NIXL" } }
    value = "CCP"   # 'CCP' is not a value of transceiver_runtime; did you mean 'CPP'?
    ```

    ## Fix
    Use a declared name (the message lists them), or declare the new one.
    """
    yield from loader_findings(file, "unknown-name", "KVP010")


NEAR_MISS_CHECKS = 2_000
"""Most distinct unknown architecture names KVP011 compares with the known ones in one file: a
policy of 100,000 invented names would otherwise cost half a minute of difflib."""


@register("KVP011", "unknown-architecture", "reference", "warning", "An architecture name close to, but not, a known one")
def unknown_architecture(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports an architecture (in a preference row or a condition) that no shipped policy and no
    entry of the linter's catalogue names, when it is close to one that is: a different case,
    or a small edit away.

    ## Why is this bad?
    Preferences are looked up by the checkpoint's exact ``architectures[0]``. A misspelt row
    never matches, and the model silently falls back to the default.

    ## Example
    ```toml
    rows = [{ architecture = "LLamaForCausalLM", value = "PYTHON" }]  # did you mean 'LlamaForCausalLM'?
    ```

    ## Fix
    Spell the class exactly as the checkpoint's ``config.json`` does. A genuinely new class
    this close to a known one belongs in ``engine/lint/catalogue.toml``.

    At most 2,000 distinct unknown names per file are compared (each comparison costs ~0.3 ms);
    one more finding says how many were not.
    """
    policy = file.policy
    assert policy is not None
    known = catalogue()["architectures"]
    known_set = set(known)
    # (Where each name stands is looked up only for a finding: a large policy has many rows.)
    places: list[tuple[str, Any]] = [(row.architecture, row) for row in policy.rows()]
    for item, condition in _conditions(policy):
        matcher = condition.subjects.get("architecture")
        if matcher is not None:
            places += [(name, item) for name in sorted(matcher.values)]
    checked: dict[str, str | None] = {}
    unchecked = 0
    for name, item in places:
        if name in known_set:
            continue
        if name not in checked:
            if len(checked) >= NEAR_MISS_CHECKS:
                unchecked += 1
                if unchecked == 1:
                    first_unchecked = file.anchor(item)
                continue
            checked[name] = closest(name, known, cutoff=0.88)
        hint = checked[name]
        if hint:
            yield Finding(
                "KVP011",
                f"unknown architecture {name!r}; did you mean {hint!r}?",
                file.anchor(item),
                "warning",
            )
    if unchecked:
        yield Finding(
            "KVP011",
            f"{unchecked:,} more architecture names were not compared with the known ones: this rule compares "
            f"at most {NEAR_MISS_CHECKS:,} unknown names per file (each comparison costs ~0.3 ms); split the policy "
            "or add its new names to engine/lint/catalogue.toml",
            first_unchecked,
            "warning",
        )


@register("KVP012", "unknown-option", "reference", "warning", "A backend, runtime, decision, feature or variable TensorRT-LLM does not have")
def unknown_option(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Checks the names a policy declares against what TensorRT-LLM has: the values of the known
    decisions (backends ``NIXL UCX MPI MOONCAKE``, runtimes ``CPP PYTHON``, managers ``V1 V2``),
    decision names, environment variables in conditions and features, and feature names that
    are a small edit away from a known feature.

    ## Why is this bad?
    The loader checks that rules use declared names; this rule checks the declarations
    themselves. A declared backend ``UCXX`` makes every rule about it consistent and useless.

    ## Example
    ```toml
    [decisions.backend]
    values = ["NIXL", "UCXX", "MPI", "MOONCAKE"]   # 'UCXX' is not a backend; did you mean 'UCX'?
    ```

    ## Fix
    Use the name TensorRT-LLM uses; a new option belongs in ``engine/lint/catalogue.toml``.
    """
    policy = file.policy
    assert policy is not None
    known = catalogue()
    for name, decision in policy.decisions.items():
        if name not in DECISIONS:
            yield Finding(
                "KVP012",
                f"unknown decision {name!r}{suggest(name, DECISIONS, similar_first=False)} (known: {', '.join(DECISIONS)})",
                file.locate(("decisions", name)),
                "warning",
            )
            continue
        allowed = known["decisions"].get(name, [])
        for index, value in enumerate(decision.values):
            if value not in allowed:
                yield Finding(
                    "KVP012",
                    f"{value!r} is not a {name} value TensorRT-LLM has{suggest(value, allowed, similar_first=False)} (known: {', '.join(allowed)})",
                    file.locate(("decisions", name, "values", index)),
                    "warning",
                )
    features = known["names"]["features"]
    for name, feature in policy.features.items():
        if name not in features:
            hint = closest(name, features, cutoff=0.8)
            if hint:
                yield Finding("KVP012", f"unknown feature {name!r}; did you mean {hint!r}?", feature.location, "warning")
    variables = known["names"]["env"]
    places = [(f.env, file.locate(("features", f.name, "env"))) for f in policy.features.values() if f.env]
    for item, condition in _conditions(policy):
        places += [(variable, file.anchor(item)) for variable in sorted(condition.env)]
    for variable, location in places:
        if variable not in variables:
            yield Finding(
                "KVP012",
                f"unknown environment variable {variable!r}{suggest(variable, variables, similar_first=False)}",
                location,
                "warning",
            )


@register("KVP013", "duplicate-id", "reference", "error", "Two rules, preferences or constraints share an id", "loader")
def duplicate_id(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports an ``id`` already used by another rule, preference table or constraint of the file.

    ## Why is this bad?
    Resolutions name the rule that decided by its id (``decided_by``), diagnostics carry it and
    policy tests assert it: two rules with one id make all of these ambiguous.

    ## Example
    ```toml
    [[decisions.transceiver_runtime.conditional]]
    id = "auto-cpp-off-nixl"
    ...
    [[decisions.transceiver_runtime.conditional]]
    id = "auto-cpp-off-nixl"     # already used
    ```

    ## Fix
    Rename one of them; ids are kebab-case and say what the rule does.
    """
    yield from loader_findings(file, "duplicate-id", "KVP013")


@register("KVP014", "bad-placeholder", "reference", "error", "A message placeholder that does not exist", "loader")
def bad_placeholder(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports ``{name}`` placeholders in notice and constraint messages that are not decisions,
    ``architecture``, ``model_type``, ``kv_transfer_timeout_ms`` or ``preferred``, and broken
    brace syntax.

    ## Why is this bad?
    The message would be wrong exactly when a user needs it: at start-up, with an error.

    ## Example
    ```toml
    message = "PYTHON supports only NIXL, but the backend is {bakend}."
    ```

    ## Fix
    Use a known placeholder (the message lists them); write ``{{`` and ``}}`` for braces.
    """
    yield from loader_findings(file, "placeholder", "KVP014")


@register("KVP015", "input-cycle", "reference", "error", "Decision inputs form a cycle", "loader")
def input_cycle(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports decisions whose ``inputs`` read each other, directly or through other decisions.

    ## Why is this bad?
    Decisions are evaluated in the order their inputs give; a cycle has no such order.

    ## Example
    ```toml
    [decisions.backend]
    inputs = ["transceiver_runtime"]
    [decisions.transceiver_runtime]
    inputs = ["backend"]
    ```

    ## Fix
    Remove one of the inputs in the cycle the message shows.
    """
    yield from loader_findings(file, "cycle", "KVP015")


def _conditions(policy: Policy) -> Iterator[tuple[Any, Condition]]:
    for rule in policy.rules():
        yield rule, rule.when
    for constraint in policy.constraints:
        yield constraint, constraint.when
    for decision in policy.decisions.values():
        if decision.preference is not None:
            yield _PreferenceAnchor(decision.preference.id, decision.name), decision.preference.adopt_when


@dataclass(frozen=True)
class _PreferenceAnchor:
    id: str
    decision: str

    @property
    def path(self) -> tuple[str, ...]:
        return ("decisions", self.decision, "preference")
