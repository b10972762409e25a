"""What every lint rule shares: the finding, the rule record and its registration, the names the
linter knows (``catalogue.toml``) and one file of a run. The rules themselves are in one module per
category beside this one; :mod:`kvpolicy.lint.rules` imports them in catalogue order."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from ...errors import PolicyProblem
from ...read.model import Policy, Row, Rule
from ...read.source import Location, SourceDocument
from ..precedence import Analysis, AnalysisLimit, analyse, context_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from ...evaluate.policyset import PolicySet

__all__ = [
    "ANALYSIS_RULES",
    "CATEGORIES",
    "PLACEHOLDER",
    "RULES",
    "Finding",
    "LintRule",
    "PolicyFile",
    "Severity",
    "catalogue",
    "counterexample",
    "loader_findings",
    "register",
]

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


def register(code: str, name: str, category: str, severity: Severity, summary: str, kind: Literal["loader", "policy", "set"] = "policy") -> Callable[..., Any]:
    """Add the decorated function to :data:`RULES` as the rule ``code`` (its docstring is what
    ``kvpolicy rule CODE`` prints)."""

    def add(function: Callable[..., Iterable[Finding]]) -> Callable[..., Iterable[Finding]]:
        assert code not in RULES, code
        RULES[code] = LintRule(code, name, category, severity, summary, inspect.cleandoc(function.__doc__ or ""), kind, function)
        return function

    return add


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


def loader_findings(file: PolicyFile, check: str, code: str) -> Iterator[Finding]:
    """The loader's problems of one ``check`` as findings of the rule ``code``."""
    for problem in file.problems:
        if problem.check == check:
            yield Finding(code, problem.message, problem.location, RULES[code].severity)


def counterexample(file: PolicyFile, witness: dict[str, Any]) -> dict[str, Any]:
    """A witness of the exact analysis as the context a finding shows: the fields ``resolve`` takes,
    those left at what leaving them out requests omitted."""
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


PLACEHOLDER = "TODO(kvpolicy new)"
"""The marker ``kvpolicy new`` writes where only the author can say what a version is
(``summary``, ``source``, the header comment); KVP042 refuses a file that still holds it."""


#: Rules whose findings come from the exact analysis (not judged when it was skipped).
ANALYSIS_RULES = frozenset({"KVP021", "KVP022", "KVP023", "KVP030"})
