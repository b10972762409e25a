"""The lint rule catalogue: one small function per rule, with a stable code and a docstring.

Codes never change meaning. ``kvpolicy rule CODE`` prints a rule's docstring; ``kvpolicy rules``
lists them. Rules come in three kinds:

- *loader* rules turn the problems the loader found (``PolicyProblem.check``) into findings; they
  are the only findings for a file that does not load;
- *policy* rules read one loaded policy (its model, its source text and its exact analysis);
- *set* rules compare the files of one run (version hygiene).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from ...errors import PolicyProblem
from ...read.model import DECISIONS, Condition, Matcher, Policy, Row, Rule
from ...read.source import Location, SourceDocument
from ..analysis import Analysis, AnalysisLimit, analyse, context_of, describe_context

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from ...evaluate.policyset import PolicySet

__all__ = ["ANALYSIS_RULES", "CATEGORIES", "RULES", "Finding", "LintRule", "PolicyFile", "catalogue"]

Severity = Literal["error", "warning"]

#: Categories in the order ``kvpolicy rules`` lists them.
CATEGORIES: dict[str, str] = {
    "syntax": "the file is not a policy: TOML and schema",
    "reference": "names that do not exist or are spelt wrong",
    "precedence": "rules that never decide, or decide against each other",
    "safety": "contexts that fail at start-up",
    "documentation": "rules and rows that do not say why",
    "versioning": "version hygiene across files and commits",
    "suppression": "suppression comments",
}


@dataclass(frozen=True)
class Finding:
    """One lint finding: a rule code, where, and what to change."""

    code: str
    message: str
    location: Location
    severity: Severity
    related: tuple[tuple[Location, str], ...] = ()
    """Other places the finding is about (the first of two duplicates), with a note each."""
    context: dict[str, Any] | None = None
    """A counterexample context, in the field names ``resolve`` takes."""

    @property
    def name(self) -> str:
        """The rule's name, e.g. ``shadowed-rule``."""
        return RULES[self.code].name

    def sort_key(self) -> tuple[Any, ...]:
        return (self.location.path, self.location.line, self.location.column, self.code, self.message)


@dataclass(frozen=True)
class LintRule:
    """A rule of the catalogue."""

    code: str
    name: str
    category: str
    severity: Severity
    summary: str
    doc: str
    kind: Literal["loader", "policy", "set"]
    check: Callable[..., Iterable[Finding]] = field(repr=False, compare=False)


RULES: dict[str, LintRule] = {}


def _rule(code: str, name: str, category: str, severity: Severity, summary: str, kind: str = "policy") -> Callable[..., Any]:
    def register(function: Callable[..., Iterable[Finding]]) -> Callable[..., Iterable[Finding]]:
        assert code not in RULES, code
        RULES[code] = LintRule(
            code, name, category, severity, summary, inspect.cleandoc(function.__doc__ or ""), kind, function  # type: ignore[arg-type]
        )
        return function

    return register


@lru_cache(maxsize=1)
def catalogue() -> dict[str, Any]:
    """The names the linter knows (``engine/lint/catalogue.toml``)."""
    text = resources.files("kvpolicy.lint").joinpath("catalogue.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


class PolicyFile:
    """One file of a lint run: its text, and the policy or the loader's problems."""

    def __init__(
        self,
        path: str,
        raw: bytes,
        document: SourceDocument | None,
        policy: Policy | None,
        problems: tuple[PolicyProblem, ...] = (),
    ) -> None:
        self.path = path
        self.raw = raw
        self.document = document
        self.policy = policy
        self.problems = problems
        self.skipped: str | None = None
        self.skipped_reason: str | None = None
        self.pending = False
        """Read but not loaded yet (:func:`kvpolicy.lint.runner.lint_files` loads it if needed)."""

    @cached_property
    def analysis(self) -> Analysis | None:
        """The exact analysis of the policy (computed once, on first use); None, with
        :attr:`skipped` saying why, when the policy is too large to analyse exactly."""
        assert self.policy is not None
        try:
            return analyse(self.policy)
        except AnalysisLimit as exc:
            self.skipped_reason = str(exc)
            self.skipped = f"{self.path}: precedence and safety analysis skipped: {exc}"
            return None

    @cached_property
    def policy_set(self) -> PolicySet:
        from ...evaluate.policyset import PolicySet

        assert self.policy is not None
        return PolicySet(self.policy)

    def locate(self, path: tuple[Any, ...]) -> Location:
        """Where a document path stands (the file's start when unknown)."""
        return self.document.locate(path) if self.document else Location(self.path)

    def anchor(self, item: Rule | Row | Any) -> Location:
        """The line a finding about a rule, row or constraint points at: its ``id`` line for
        tables, the row itself for preference rows (where a suppression comment goes)."""
        if isinstance(item, Row):
            return self.locate(item.path)
        return self.locate((*item.path, "id"))


def _problems(file: PolicyFile, check: str, code: str) -> Iterator[Finding]:
    for problem in file.problems:
        if problem.check == check:
            yield Finding(code, problem.message, problem.location, RULES[code].severity)


# -- syntax ----------------------------------------------------------------------------------------


@_rule("KVP001", "invalid-toml", "syntax", "error", "The file is not valid UTF-8 TOML", "loader")
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
    yield from _problems(file, "toml", "KVP001")


@_rule("KVP002", "schema-violation", "syntax", "error", "The file does not match the policy schema", "loader")
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
    yield from _problems(file, "schema", "KVP002")


# -- reference -------------------------------------------------------------------------------------


#: Loader checks that a rule of its own maps; every other check (``io``, ``size``, and any the
#: loader gains later) is KVP003, so lint never passes a file that ``kvpolicy.load`` refuses.
_MAPPED_CHECKS = {"toml", "schema", "unknown-name", "duplicate-id", "placeholder", "cycle", "conflicting-rows"}


@_rule("KVP003", "refused-file", "syntax", "error", "The file cannot be read within kvpolicy's limits", "loader")
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


@_rule("KVP010", "unknown-name", "reference", "error", "A value, feature, decision or input that the policy does not declare", "loader")
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
    yield from _problems(file, "unknown-name", "KVP010")


NEAR_MISS_CHECKS = 2_000
"""Most distinct unknown architecture names KVP011 compares with the known ones in one file: a
policy of 100,000 invented names would otherwise cost half a minute of difflib."""


@_rule("KVP011", "unknown-architecture", "reference", "warning", "An architecture name close to, but not, a known one")
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
            checked[name] = _close(name, known, cutoff=0.88)
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


@_rule("KVP012", "unknown-option", "reference", "warning", "A backend, runtime, decision, feature or variable TensorRT-LLM does not have")
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
                f"unknown decision {name!r}{_hint(name, DECISIONS)} (known: {', '.join(DECISIONS)})",
                file.locate(("decisions", name)),
                "warning",
            )
            continue
        allowed = known["decisions"].get(name, [])
        for index, value in enumerate(decision.values):
            if value not in allowed:
                yield Finding(
                    "KVP012",
                    f"{value!r} is not a {name} value TensorRT-LLM has{_hint(value, allowed)} (known: {', '.join(allowed)})",
                    file.locate(("decisions", name, "values", index)),
                    "warning",
                )
    features = known["names"]["features"]
    for name, feature in policy.features.items():
        if name not in features:
            hint = _close(name, features, cutoff=0.8)
            if hint:
                yield Finding(
                    "KVP012", f"unknown feature {name!r}; did you mean {hint!r}?", feature.location, "warning"
                )
    variables = known["names"]["env"]
    places = [(f.env, file.locate(("features", f.name, "env"))) for f in policy.features.values() if f.env]
    for item, condition in _conditions(policy):
        places += [(variable, file.anchor(item)) for variable in sorted(condition.env)]
    for variable, location in places:
        if variable not in variables:
            yield Finding(
                "KVP012",
                f"unknown environment variable {variable!r}{_hint(variable, variables)}",
                location,
                "warning",
            )


@_rule("KVP013", "duplicate-id", "reference", "error", "Two rules, preferences or constraints share an id", "loader")
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
    yield from _problems(file, "duplicate-id", "KVP013")


@_rule("KVP014", "bad-placeholder", "reference", "error", "A message placeholder that does not exist", "loader")
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
    yield from _problems(file, "placeholder", "KVP014")


@_rule("KVP015", "input-cycle", "reference", "error", "Decision inputs form a cycle", "loader")
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
    yield from _problems(file, "cycle", "KVP015")


# -- precedence ------------------------------------------------------------------------------------


@_rule("KVP020", "duplicate-architecture", "precedence", "error", "One architecture listed twice in a preference table")
def duplicate_architecture(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a preference row for an architecture (and ``model_type``) that the same table
    already lists, with both locations, whether the values differ or not.

    ## Why is this bad?
    Only the first row is ever used. With different values the file does not load at all;
    with equal values the second row is dead weight that a later edit will make inconsistent.

    ## Example
    ```toml
    rows = [
      { architecture = "LlamaForCausalLM", value = "PYTHON" },
      { architecture = "LlamaForCausalLM", value = "PYTHON" },   # listed twice
    ]
    ```

    ## Fix
    Keep one row.
    """
    if file.policy is None:
        for problem in file.problems:
            if problem.check == "conflicting-rows":
                yield Finding("KVP020", problem.message, problem.location, "error")
        return
    for decision in file.policy.decisions.values():
        if decision.preference is None:
            continue
        seen: dict[tuple[str, str | None], Row] = {}
        for row in decision.preference.rows:
            key = (row.architecture, row.model_type)
            first = seen.get(key)
            if first is None:
                seen[key] = row
                continue
            first_at = file.anchor(first)
            yield Finding(
                "KVP020",
                f"{row.architecture} is listed twice in {decision.preference.id} (first at line {first_at.line}); "
                "only the first row is used: keep one",
                file.anchor(row),
                "error",
                related=((first_at, f"first {row.architecture} row"),),
            )


def _rule_items(policy: Policy) -> Iterator[tuple[Any, str]]:
    """Every rule and row, with how findings name it."""
    for decision in policy.decisions.values():
        for rule in decision.requirements:
            yield rule, f"requirement {rule.id}"
        if decision.preference is not None:
            for row in _first_rows(decision.preference.rows):
                yield row, f"preference row {row.id}"
        for rule in decision.conditionals:
            yield rule, f"conditional {rule.id}"
        yield decision.default, f"default {decision.default.id}"


def _first_rows(rows: tuple[Row, ...]) -> list[Row]:
    seen: set[tuple[str, str | None]] = set()
    first = []
    for row in rows:
        if (row.architecture, row.model_type) not in seen:
            seen.add((row.architecture, row.model_type))
            first.append(row)
    return first


def _stats(file: PolicyFile, item: Any) -> Any:
    analysis = file.analysis
    assert analysis is not None
    if isinstance(item, Row):
        rep = analysis.representative.get(item.id)
        return analysis.rules.get(rep) if rep is not None else None
    return analysis.rules.get(item.id)


def _counterexample(file: PolicyFile, witness: dict[str, Any]) -> dict[str, Any]:
    assert file.policy is not None
    ctx = context_of(witness, file.policy)
    shown: dict[str, Any] = {}
    if ctx["architecture"] is not None:
        shown["architecture"] = ctx["architecture"]
    if ctx["model_type"] is not None:
        shown["model_type"] = ctx["model_type"]
    for name, decision in file.policy.decisions.items():
        if ctx[name] != decision.left_out:  # what a context that leaves the field out would request
            shown[name] = ctx[name]
    if ctx["kv_transfer_timeout_ms"] is None:
        shown["kv_transfer_timeout_ms"] = None
    if ctx["features"]:
        shown["features"] = sorted(ctx["features"])
    if ctx["env"]:
        shown["env"] = dict(sorted(ctx["env"].items()))
    return shown


def _higher(file: PolicyFile, item: Any) -> str:
    """Which rule wins where ``item``'s condition holds (for the message)."""
    stats = _stats(file, item)
    if stats is None or stats.held is None:
        return "another rule"
    assert file.policy is not None
    ctx = context_of(stats.held, file.policy)
    decision = item.decision if isinstance(item, Rule) else _row_decision(file.policy, item)
    _, decided_by, _ = file.policy_set.outcome(ctx)
    return decided_by.get(decision, "another rule")


def _row_decision(policy: Policy, row: Row) -> str:
    for decision in policy.decisions.values():
        if decision.preference is not None and any(r is row for r in decision.preference.rows):
            return decision.name
    return ""


@_rule("KVP021", "shadowed-rule", "precedence", "warning", "A rule that can hold but never decides: a higher-precedence rule always wins")
def shadowed_rule(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a requirement, preference row, conditional default or default whose condition holds
    in some context, but that never decides any context: wherever it holds, a requirement, a
    preference row or an earlier conditional decides first (for a default: some earlier rule
    always decides). The analysis is exact over every class of contexts the policy can tell
    apart; the message names a rule that wins in a context where this one holds.

    ## Why is this bad?
    The rule looks like policy but changes nothing. Usually an earlier rule is broader than
    intended, or the rule belongs before it.

    ## Example
    ```toml
    [[decisions.transceiver_runtime.conditional]]
    id = "auto-cpp-off-nixl"
    when = { backend = { not = "NIXL" } }
    value = "CPP"

    [[decisions.transceiver_runtime.conditional]]
    id = "auto-cpp-on-ucx"           # shadowed: auto-cpp-off-nixl already covers UCX
    when = { backend = "UCX" }
    value = "CPP"
    ```

    ## Fix
    Delete the rule, narrow the rule that wins, or move this one before it.
    """
    policy = file.policy
    assert policy is not None
    if file.analysis is None:
        return
    for item, label in _rule_items(policy):
        stats = _stats(file, item)
        if stats is None or stats.held is None or stats.decided is not None:
            continue
        winner = _higher(file, item)
        yield Finding(
            "KVP021",
            f"{label} never decides: wherever it holds, {winner} decides first "
            f"(e.g. {describe_context(context_of(stats.held, policy), policy)})",
            file.anchor(item),
            "warning",
            context=_counterexample(file, stats.held),
        )


@_rule("KVP022", "unreachable-rule", "precedence", "warning", "A rule or constraint whose conditions can never hold")
def unreachable_rule(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a requirement, preference row (its architecture together with the table's
    ``adopt_when``), conditional default or constraint whose condition holds in no context the
    policy can produce: for example a condition on a decided value that no context reaches, or
    a conditional that reads a decision's value the decision never takes under ``auto``.

    ## Why is this bad?
    The rule is dead: it documents behaviour that never happens.

    ## Example
    ```toml
    [decisions.kv_cache_manager.preference]
    adopt_when = { backend = "NIXL", transceiver_runtime = "PYTHON" }
    # in a policy whose transceiver_runtime can never be PYTHON, every row is unreachable
    ```

    ## Fix
    Correct the condition, or delete the rule.
    """
    policy = file.policy
    assert policy is not None
    analysis = file.analysis
    if analysis is None:
        return
    for item, label in _rule_items(policy):
        if isinstance(item, Rule) and item.stage == "default":
            continue
        stats = _stats(file, item)
        if stats is not None and stats.held is not None:
            continue
        condition = _row_condition(policy, item) if isinstance(item, Row) else str(item.when)
        yield Finding(
            "KVP022",
            f"{label} can never hold: no context satisfies {condition}",
            file.anchor(item),
            "warning",
        )
    for constraint in policy.constraints:
        if constraint.id not in analysis.constraints:
            yield Finding(
                "KVP022",
                f"constraint {constraint.id} can never fire: no context satisfies {constraint.when}",
                file.anchor(constraint),
                "warning",
            )


def _row_condition(policy: Policy, row: Row) -> str:
    parts = [f"architecture is {row.architecture}"]
    if row.model_type:
        parts.append(f"model_type is {row.model_type}")
    for decision in policy.decisions.values():
        preference = decision.preference
        if preference is not None and any(r is row for r in preference.rows) and not preference.adopt_when.empty:
            parts.append(str(preference.adopt_when))
    return " and ".join(parts)


@_rule("KVP023", "conflicting-requirements", "precedence", "warning", "Two requirements that hold together and require different values")
def conflicting_requirements(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports two requirements of one decision (the same precedence: neither wins) that both hold
    in some context but require different values, with the smallest such context.

    ## Why is this bad?
    In that context the decision cannot be made: ``resolve`` reports ``requirements-conflict``
    (under ``auto``) or an error for the explicit value, at start-up, in front of a user.

    ## Example
    ```toml
    [[decisions.transceiver_runtime.requirement]]
    id = "serialized-state-requires-cpp"
    when = { features.serialized_state = true }
    value = "CPP"
    [[decisions.transceiver_runtime.requirement]]
    id = "pipelined-transfer-requires-python"   # conflicts when both features are on
    when = { features.pipelined_transfer = true }
    value = "PYTHON"
    ```

    ## Fix
    Make the conditions exclusive, or add a constraint that rejects the combination with a
    message saying which feature to turn off. Where the combination is impossible by design
    (two capabilities no runtime has together), suppress the finding with that reason.
    """
    policy = file.policy
    assert policy is not None
    if file.analysis is None:
        return
    rules = {r.id: r for d in policy.decisions.values() for r in d.requirements}
    for (first_id, second_id), witness in sorted(file.analysis.conflicts.items()):
        first, second = sorted((rules[first_id], rules[second_id]), key=lambda r: (r.location.line, r.id))
        ctx = context_of(witness, policy)
        yield Finding(
            "KVP023",
            f"requirement {second.id} ({second.value}) and {first.id} ({first.value}) both hold for "
            f"{describe_context(ctx, policy)}; {second.decision} cannot be decided there",
            file.anchor(second),
            "warning",
            related=((file.anchor(first), f"requirement {first.id}"),),
            context=_counterexample(file, witness),
        )


@_rule("KVP024", "redundant-requirement", "precedence", "warning", "A requirement that another requirement already implies")
def redundant_requirement(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a requirement whose condition implies the condition of another requirement of the
    same decision that requires the same value: wherever it holds, the other one holds too and
    already forces the value. The check is syntactic (each test of the other condition is
    implied by a test of this one), so it never reports a requirement that adds something.

    ## Why is this bad?
    The requirement decides nothing the other one does not. Both notes are reported where both
    hold, and a later edit to one of them silently leaves the other in force.

    ## Example
    ```toml
    [[decisions.transceiver_runtime.requirement]]
    id = "serialized-state-requires-cpp"
    when = { features.serialized_state = true }
    value = "CPP"
    [[decisions.transceiver_runtime.requirement]]
    id = "serialized-state-on-ucx-requires-cpp"   # redundant: implied by the one above
    when = { backend = "UCX", features.serialized_state = true }
    value = "CPP"
    ```

    ## Fix
    Delete the narrower requirement (move its note or reason to the broader one), or make it
    require something the broader one does not.

    Each requirement meets only those an index of their tests says it could imply; past
    2,000,000 compared pairs in one file the rule stops, with a finding that says where.
    """
    policy = file.policy
    assert policy is not None
    budget = IMPLICATION_TESTS
    for decision in policy.decisions.values():
        requirements = decision.requirements
        candidates = _implication_index(requirements)
        for narrow in requirements:
            found = candidates(narrow)
            budget -= len(found)
            if budget < 0:
                yield Finding(
                    "KVP024",
                    f"redundancy not checked from requirement {narrow.id} on: this rule compares at most "
                    f"{IMPLICATION_TESTS:,} pairs of requirements per file; split the policy",
                    file.anchor(narrow),
                    "warning",
                )
                return
            for broad in found:
                if broad is narrow or broad.value != narrow.value or not _implies(narrow.when, broad.when):
                    continue
                # Two requirements with the same condition imply each other: report only the later one.
                if _implies(broad.when, narrow.when) and (narrow.location.line, narrow.id) < (broad.location.line, broad.id):
                    continue
                yield Finding(
                    "KVP024",
                    f"requirement {narrow.id} is redundant: wherever it holds, requirement {broad.id} also "
                    f"holds and requires {broad.value}; delete it or narrow what it requires",
                    file.anchor(narrow),
                    "warning",
                    related=((file.anchor(broad), f"requirement {broad.id}"),),
                )
                break


IMPLICATION_TESTS = 2_000_000
"""Most requirement pairs KVP024 compares in one file (each a few microseconds)."""


def _implication_index(requirements: list[Rule] | tuple[Rule, ...]) -> Callable[[Rule], list[Rule]]:
    """The requirements a given one might imply (:func:`_implies`), in their order, without comparing
    every pair. A broad condition is filed under one test any narrower condition must share: its
    first subject, ``requested`` or env matcher that is not negated (under each of its values: a
    narrower matcher holds a subset of them), else its first feature, else its timeout. One with
    none of these (negated matchers only, or empty) meets every narrow one."""
    order = {id(rule): i for i, rule in enumerate(requirements)}
    filed: dict[tuple[Any, ...], list[Rule]] = {}
    everywhere: list[Rule] = []
    for broad in requirements:
        keys = _anchor_keys(broad.when)
        if keys is None:
            everywhere.append(broad)
        for key in keys or ():
            filed.setdefault(key, []).append(broad)

    def candidates(narrow: Rule) -> list[Rule]:
        found = {id(r): r for r in everywhere}
        when = narrow.when
        for field_name in ("subjects", "requested", "env"):
            for name, matcher in getattr(when, field_name).items():
                if not matcher.negate:
                    if not matcher.values:  # (never holds: it implies anything)
                        return list(requirements)
                    for rule in filed.get((field_name, name, min(matcher.values)), ()):
                        found[id(rule)] = rule
        for name, on in when.features.items():
            for rule in filed.get(("features", name, on), ()):
                found[id(rule)] = rule
        for rule in filed.get(("timeout", when.timeout), ()) if when.timeout else ():
            found[id(rule)] = rule
        return sorted(found.values(), key=lambda r: order[id(r)])

    return candidates


def _anchor_keys(when: Condition) -> list[tuple[Any, ...]] | None:
    for field_name in ("subjects", "requested", "env"):
        for name, matcher in sorted(getattr(when, field_name).items()):
            if not matcher.negate:
                return [(field_name, name, value) for value in matcher.values]
    for name, on in sorted(when.features.items()):
        return [("features", name, on)]
    if when.timeout:
        return [("timeout", when.timeout)]
    return None


def _implies(narrow: Condition, broad: Condition) -> bool:
    """Whether ``narrow`` holding makes ``broad`` hold, judged field by field (sound, not complete)."""
    for name in (f.name for f in dataclasses.fields(broad)):
        want = getattr(broad, name)
        have = getattr(narrow, name)
        if not want:
            continue
        if isinstance(want, dict):
            if not isinstance(have, dict):
                return False
            for key, test in want.items():
                if key not in have:
                    return False
                if isinstance(test, Matcher):
                    if not isinstance(have[key], Matcher) or not _matcher_implies(have[key], test):
                        return False
                elif have[key] != test:
                    return False
        elif have != want:
            return False
    return True


def _matcher_implies(narrow: Matcher, broad: Matcher) -> bool:
    if not narrow.negate and not broad.negate:
        return narrow.values <= broad.values
    if not narrow.negate and broad.negate:
        return not (narrow.values & broad.values)
    if narrow.negate and broad.negate:
        return broad.values <= narrow.values
    return False  # "any value but X" never implies "one of Y": the values are open-ended


@_rule("KVP029", "analysis-limit", "precedence", "error", "The exact analysis could not run within its budget")
def analysis_limit(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Reports a policy whose exact precedence and safety analysis (KVP021, KVP022, KVP023,
    KVP030) would need more evaluations than its budget, because too many inputs are read
    together. Those rules did not run, and no suppression of theirs is judged unused.

    ## Why is this bad?
    A gate that skips its analysis and stays green would pass an ``auto`` choice that fails at
    start-up. The run fails instead, so the skip is seen.

    ## Example
    Twenty features, each read by its own requirement of one decision: 2**20 combinations.

    ## Fix
    Split conditions, or fold features that always travel together into one. Where the policy
    is large on purpose, set ``analysis-limit = "warning"`` in ``[tool.kvpolicy]`` (or ignore
    KVP029) and accept that those rules do not run.
    """
    assert file.policy is not None
    if file.analysis is None:
        yield Finding(
            "KVP029",
            f"precedence and safety analysis skipped: {file.skipped_reason}; KVP021, KVP022, KVP023 and "
            "KVP030 did not run on this file",
            Location(file.path, 1, 1),
            "error",
        )


#: Rules whose findings come from the exact analysis (not judged when it was skipped).
ANALYSIS_RULES = frozenset({"KVP021", "KVP022", "KVP023", "KVP030"})


# -- safety ----------------------------------------------------------------------------------------


@_rule("KVP030", "auto-rejected", "safety", "error", "An auto choice that a constraint rejects, where another value would pass")
def auto_rejected(file: PolicyFile) -> Iterator[Finding]:
    """## What it does
    Finds contexts where the user left a decision to the policy (``auto``), the policy chose a
    value, an error constraint about that decision rejects it, and another value of the
    decision would have passed every check. Each family — the rule that chose, the constraint,
    and the values of the other decisions the constraint reads (e.g. the backend) — is
    reported once, at the rule that chose, with the smallest such context.

    ## Why is this bad?
    ``auto`` promises a working choice. Here it produces a configuration that fails at
    start-up although a working one exists: the user must find out and override by hand.

    ## Example
    Under 2026.08.24 a model preference is adopted verbatim:
    ```toml
    rows = [{ architecture = "LlamaForCausalLM", value = "PYTHON" }]
    ```
    With ``backend = "UCX"`` and ``transceiver_runtime = "auto"`` Llama resolves to PYTHON,
    which ``python-requires-nixl`` rejects; CPP would work.

    ## Fix
    Guard the rule (``adopt_when = { backend = "NIXL" }``), or add a conditional default that
    picks the working value first. Where a version reproduces an upstream behaviour on
    purpose, suppress the finding on that row with the reason.
    """
    policy = file.policy
    assert policy is not None
    analysis = file.analysis
    if analysis is None:
        return
    decisions = policy.decisions
    owners: dict[str, Any] = {r.id: r for r in policy.rules()}
    for row in policy.rows():
        owners.setdefault(row.id, row)
    constraints = {c.id: c for c in policy.constraints}
    outcome = file.policy_set.outcome
    # One finding per (rule that chose, decision): every constraint that rejects its choice and
    # every combination of the other decisions (e.g. each backend) where that happens, in one.
    grouped: dict[tuple[str, str], dict[str, list[tuple[str, str, str, dict[str, Any], dict[str, Any], Any]]]] = {}
    for (constraint_id, decision, rule_id, others), witnesses in sorted(analysis.rejected.items()):
        for witness in witnesses.smallest(64):
            ctx = context_of(witness, policy)
            values, _, _ = outcome(ctx)
            rejected = values[decision]
            working = None
            for alternative in decisions[decision].values:
                if alternative == rejected:
                    continue
                _, _, diagnostics = outcome({**ctx, decision: alternative})
                if not any(d.severity == "error" for d in diagnostics):
                    working = alternative
                    break
            if working is None:
                continue
            where = ", ".join(f"{k} {v}" for k, v in others)
            for target in _deciders(analysis, owners, rule_id):
                shown = ctx if target.id == rule_id else _with_architecture(ctx, target)
                by_constraint = grouped.setdefault((target.id, decision), {})
                by_constraint.setdefault(constraint_id, []).append((where, rejected, working, shown, witness, target))
            break
    for (target_id, decision), by_constraint in grouped.items():
        first_constraint, entries = next(iter(by_constraint.items()))
        _, rejected, working, shown, witness, target = entries[0]
        parts = []
        count = 0
        for constraint_id, found in by_constraint.items():
            wheres = list(dict.fromkeys(e[0] for e in found if e[0]))
            count += max(1, len(wheres))
            parts.append(
                f"constraint {constraint_id} rejects it{' with ' + '; '.join(wheres) if wheres else ''} "
                f"(e.g. {describe_context(found[0][3], policy)})"
            )
        if len(by_constraint) == 1 and count == 1:
            where = entries[0][0]
            message = (
                f"auto resolves {decision} to {rejected} through {target_id}{' with ' + where if where else ''}, "
                f"which constraint {first_constraint} rejects; {decision} = {working} would pass "
                f"(e.g. {describe_context(shown, policy)})"
            )
        else:
            message = (
                f"auto resolves {decision} to {rejected} through {target_id}, which fails at start-up in {count} "
                f"contexts where {decision} = {working} would pass: {'; '.join(parts)}"
            )
        yield Finding(
            "KVP030",
            message,
            file.anchor(target),
            "error",
            related=tuple((file.anchor(constraints[c]), f"constraint {c}") for c in by_constraint),
            context=_counterexample(file, _witness_of(shown, witness)),
        )


def _deciders(analysis: Analysis, owners: dict[str, Any], rule_id: str) -> list[Any]:
    """The rule a decided-by id names; for a row, every row of its architecture class."""
    rows = analysis.row_classes.get(rule_id)
    if rows:
        unique: dict[str, Row] = {}
        for row in rows:
            unique.setdefault(row.id, row)
        return sorted(unique.values(), key=lambda r: r.location.line)
    found = [owners.get(part) for part in rule_id.split("+")]  # agreeing requirements: a+b
    return [owner for owner in found if owner is not None]


def _with_architecture(ctx: dict[str, Any], row: Row) -> dict[str, Any]:
    return {**ctx, "architecture": row.architecture, "model_type": row.model_type or ctx["model_type"]}


def _witness_of(ctx: dict[str, Any], witness: dict[str, Any]) -> dict[str, Any]:
    return {**witness, "architecture": ctx["architecture"], "model_type": ctx["model_type"]}


# -- documentation ---------------------------------------------------------------------------------


def _documented(policy: Policy) -> Iterator[tuple[Any, str]]:
    for decision in policy.decisions.values():
        for rule in (*decision.requirements, *decision.conditionals, decision.default):
            yield rule, f"{rule.stage} {rule.id}"
        if decision.preference is not None:
            for row in decision.preference.rows:
                yield row, f"preference row {row.id}"
    for constraint in policy.constraints:
        yield constraint, f"constraint {constraint.id}"


@_rule("KVP040", "missing-reason", "documentation", "warning", "A rule, row or constraint without a reason")
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


@_rule("KVP041", "missing-source", "documentation", "warning", "A rule, row or constraint without a source")
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


PLACEHOLDER = "TODO(kvpolicy new)"
"""The marker ``kvpolicy new`` writes where only the author can say what a version is
(``summary``, ``source``, the header comment); KVP042 refuses a file that still holds it."""


@_rule("KVP042", "unfilled-placeholder", "documentation", "error", "A placeholder `kvpolicy new` wrote is still in the file")
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


# -- versioning (set rules: they see every file of the run) ----------------------------------------


@_rule("KVP050", "duplicate-version", "versioning", "error", "Two policy files of one folder declare the same version", "set")
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


@_rule("KVP051", "unbumped-version", "versioning", "error", "Policy content changed without a version bump (needs --base)", "set")
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
                f"the policy content changed since the base revision but version {file.policy.version} did not; "
                "release the change as a new version",
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
        found.sort(key=lambda f: (version_key(f.policy.version), f.path))  # type: ignore[union-attr]
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


@_rule("KVP052", "identical-version", "versioning", "warning", "A version with the same content as the version before it", "set")
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


@_rule("KVP053", "repeated-source", "versioning", "warning", "A version that cites only what the version before it cites", "set")
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
            f"source of version {file.policy.version} cites nothing new: {detail} ({earlier.path}); "
            "cite the upstream change this version mirrors",
            file.locate(("source",)),
            "warning",
            related=((where, f"source of {earlier.policy.version}"),),
        )


# -- suppression -----------------------------------------------------------------------------------


@_rule("KVP090", "unused-suppression", "suppression", "warning", "A suppression comment that suppresses nothing", "set")
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


@_rule("KVP091", "suppression-without-reason", "suppression", "warning", "A suppression comment that does not say why", "set")
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


# -- shared helpers --------------------------------------------------------------------------------


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


def _close(name: str, known: Iterable[str], *, cutoff: float) -> str | None:
    known = list(known)
    lowered = {k.lower(): k for k in known}
    if name.lower() in lowered and lowered[name.lower()] != name:
        return lowered[name.lower()]
    # Skip, before difflib compares anything (1,000 rows against the catalogue stay fast), the
    # names whose lengths alone rule a match out: the bound get_close_matches tests first
    # (real_quick_ratio, 2 * shorter / both), in its own arithmetic, so that rounding never drops
    # a name at exactly the cutoff.
    near = [k for k in known if 2.0 * min(len(k), len(name)) / ((len(k) + len(name)) or 1) >= cutoff]
    match = difflib.get_close_matches(name, near, n=1, cutoff=cutoff)
    return match[0] if match else None


def _hint(name: str, known: Iterable[str]) -> str:
    match = _close(name, known, cutoff=0.6)
    return f"; did you mean {match!r}?" if match else ""
