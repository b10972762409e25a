"""Policy tests as data (``kvpolicy test``): cases in TOML, checked against a policy, with coverage.

A cases file sits beside its policy: ``policies/2026.09.10.cases.toml`` tests
``policies/2026.09.10.toml`` (a top-level ``policy = "other.toml"`` names another file, relative
to the cases file). Each case::

    [[case]]
    name = "Llama on UCX fails at start-up under auto"
    context = { architecture = "LlamaForCausalLM", backend = "UCX" }   # resolve's field names
    expect = { transceiver_runtime = "PYTHON" }                        # the values it checks
    decided_by = { transceiver_runtime = "runtime-preference[LlamaForCausalLM]" }   # optional
    diagnostics = ["python-requires-nixl"]   # optional: exactly these diagnostic ids, any severity
    starts = false                           # optional: whether the configuration can start (no errors)

Like Cedar's ``run-tests``, a case can assert the decision *and* the rule that made it.
Coverage counts a requirement, conditional, default or preference row as exercised when it
decided some case (a requirement also when it rejected an explicit value), and a constraint when
it fired.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ContextError, PolicyError, PolicyProblem
from ..read.loader import CASES_SUFFIX, display_path, load_policy_file, policy_files
from ..wording import suggest
from ..read.model import Policy
from ..evaluate.policyset import PolicySet
from ..read.policyfile import read_policy_bytes
from ..read.source import Location, TomlSyntaxError, parse_document

__all__ = ["CaseResult", "CoverageItem", "TestRun", "run_tests"]

#: A line that may set the top-level ``policy`` key (bare, quoted or literal); files without one
#: test the policy beside them.
_NAMES_POLICY = re.compile(rb"""^[ \t]*["']?policy["']?[ \t]*=""", re.MULTILINE)

_CASE_KEYS = {"name", "context", "expect", "decided_by", "diagnostics", "starts"}


class CasesUsageError(Exception):
    """The paths or a cases file cannot be used (exit code 2)."""


@dataclass(frozen=True)
class CaseResult:
    """One case: where it is, and what went wrong ('' when it passed)."""

    name: str
    location: Location
    policy: str
    failures: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class CoverageItem:
    """A rule, row or constraint of a policy, and whether some case exercised it."""

    kind: str
    id: str
    location: Location
    exercised: bool


@dataclass
class TestRun:
    """Every case of a run, the coverage per policy file, and problems that stopped a file."""

    cases: list[CaseResult] = field(default_factory=list)
    coverage: dict[str, list[CoverageItem]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.passed]

    def percent(self, path: str) -> float:
        items = self.coverage.get(path, [])
        return 100.0 if not items else 100.0 * sum(i.exercised for i in items) / len(items)

    def total_percent(self) -> float:
        items = [i for items in self.coverage.values() for i in items]
        return 100.0 if not items else 100.0 * sum(i.exercised for i in items) / len(items)


def _pairs(paths: Sequence[str]) -> list[tuple[Path, Path | None]]:
    """(policy file, cases file or None) for every policy the paths name."""
    pairs: dict[Path, Path | None] = {}
    for name in paths:
        path = Path(name)
        if path.is_dir():
            for policy in policy_files(path):
                cases = policy.with_name(policy.name[: -len(".toml")] + CASES_SUFFIX)
                pairs.setdefault(policy, cases if cases.is_file() else None)
            for cases in sorted(path.glob("*" + CASES_SUFFIX)):
                target = _target(cases)
                if target not in pairs or pairs[target] is None:
                    pairs[target] = cases
        elif path.is_file():
            if path.name.endswith(CASES_SUFFIX):
                pairs[_target(path)] = path
            else:
                cases = path.with_name(path.name[: -len(".toml")] + CASES_SUFFIX) if path.suffix == ".toml" else path
                pairs.setdefault(path, cases if cases.is_file() and cases != path else None)
        else:
            raise CasesUsageError(f"{name}: no such file or folder")
    if not pairs:
        raise CasesUsageError(f"no policy files (*.toml) in {', '.join(paths)}; name a policy file or folder")
    return list(pairs.items())


def _target(cases: Path) -> Path:
    """The policy a cases file tests: its ``policy`` key, or the file beside it."""
    try:
        raw = read_policy_bytes(cases, str(cases))
        if not _NAMES_POLICY.search(raw):  # no line can set a top-level `policy`: no parse needed
            return cases.with_name(cases.name[: -len(CASES_SUFFIX)] + ".toml")
        data = parse_document(raw, str(cases)).data
        named = data.get("policy")
    except (PolicyError, TomlSyntaxError):
        named = None  # the cases file's own problem is reported when it is run
    if isinstance(named, str):
        return cases.parent / named
    return cases.with_name(cases.name[: -len(CASES_SUFFIX)] + ".toml")


def run_tests(paths: Sequence[str], *, cache: bool = True) -> TestRun:
    """Run the cases of every policy the paths name. With ``cache`` (the default), a policy and
    cases file run before with the same bytes by the same code give their stored results (they
    read nothing else)."""
    started = time.perf_counter()
    run = TestRun()
    for policy_path, cases_path in _pairs(paths):
        key = _results_key(policy_path, cases_path) if cache else None
        if key is not None and _stored_results(run, key):
            continue
        try:
            if not os.path.lexists(policy_path):
                where = f" (tested by {display_path(cases_path)})" if cases_path is not None else ""
                raise PolicyError(PolicyProblem(Location(display_path(policy_path)), "io", f"no such policy file{where}; add it or fix `policy =`"))
            policy = load_policy_file(policy_path)
        except PolicyError as exc:
            run.errors.append(f"{display_path(policy_path)}: the policy does not load:\n{exc}")
            continue
        policy_set = PolicySet(policy)
        exercised: set[str] = set()
        pair = TestRun()
        if cases_path is not None:
            _run_file(pair, policy_set, cases_path, exercised)
        pair.coverage[policy.path] = _coverage(policy, exercised)
        run.cases += pair.cases
        run.errors += pair.errors
        run.coverage.update(pair.coverage)
        if key is not None and not pair.errors:
            _store_results(key, pair)
    run.seconds = time.perf_counter() - started
    return run


_RESULTS = "test-results-1"


def _results_key(policy_path: Path, cases_path: Path | None) -> str | None:
    """The digest a pair's results are stored under (None when a file cannot be read: then the
    run reports why)."""
    from ..read.cache import code_fingerprint, digest

    parts: list[bytes | str] = ["kvpolicy-test-1", code_fingerprint()]
    for path in (policy_path, cases_path):
        if path is None:
            parts += ["", b""]
            continue
        shown = display_path(path)
        try:
            parts += [shown, read_policy_bytes(path, shown)]
        except PolicyError:
            return None
    return digest(*parts)


def _stored_results(run: TestRun, key: str) -> bool:
    """Add a pair's stored results to ``run``; False (adding nothing) when there are none."""
    from ..read.cache import cached_entry

    entry = cached_entry(_RESULTS, key)
    try:
        if entry["key"] != key:
            return False
        cases = [CaseResult(name, Location(*where), version, tuple(failures)) for name, where, version, failures in entry["cases"]]
        coverage = {
            path: [CoverageItem(kind, id, Location(*where), exercised) for kind, id, where, exercised in items] for path, items in entry["coverage"].items()
        }
        for case in cases:
            if not (isinstance(case.name, str) and isinstance(case.policy, str) and all(isinstance(f, str) for f in case.failures)):
                return False
    except (TypeError, KeyError, ValueError, AttributeError):
        return False
    run.cases += cases
    run.coverage.update(coverage)
    return True


def _store_results(key: str, pair: TestRun) -> None:
    from ..read.cache import remember_entry

    def where(location: Location) -> list[Any]:
        return [location.path, location.line, location.column]

    remember_entry(
        _RESULTS,
        key,
        {
            "key": key,
            "cases": [[c.name, where(c.location), c.policy, list(c.failures)] for c in pair.cases],
            "coverage": {path: [[i.kind, i.id, where(i.location), i.exercised] for i in items] for path, items in pair.coverage.items()},
        },
    )


def _run_file(run: TestRun, policy_set: PolicySet, cases_path: Path, exercised: set[str]) -> None:
    shown = display_path(cases_path)
    try:
        document = parse_document(read_policy_bytes(cases_path, shown), shown)
    except PolicyError as exc:
        run.errors.append(str(exc.problems[0]))
        return
    except TomlSyntaxError as exc:
        run.errors.append(f"{exc.location}: {exc.reason}")
        return
    data = document.data
    unknown = sorted(set(data) - {"policy", "case"})
    if unknown:
        run.errors.append(f"{document.locate((unknown[0],))}: unknown key(s) {', '.join(unknown)} (known: policy, case)")
    cases = data.get("case", [])
    if not isinstance(cases, list):
        run.errors.append(f"{document.locate(('case',))}: write cases as [[case]] tables")
        return
    if not cases:
        run.errors.append(f"{document.locate(())}: the file holds no [[case]] tables; add one or delete the file")
    names: dict[str, Location] = {}
    for index, case in enumerate(cases):
        location = document.locate(("case", index))
        result = _run_case(policy_set, case, location, exercised)
        first = names.setdefault(result.name, location) if isinstance(case, dict) and "name" in case else location
        if first is not location:
            # Reports, JUnit and people name a case by its name: two cases cannot share one.
            result = CaseResult(result.name, location, result.policy, (f"duplicate case name; the first is at {first}", *result.failures))
        run.cases.append(result)


def _run_case(policy_set: PolicySet, case: Any, location: Location, exercised: set[str]) -> CaseResult:
    version = policy_set.version
    if not isinstance(case, dict):
        return CaseResult("?", location, version, ("a case must be a table",))
    given = case.get("name")
    name = given if isinstance(given, str) else f"case at line {location.line}"
    problems = []
    unknown = sorted(set(case) - _CASE_KEYS)
    if unknown:
        problems.append(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_CASE_KEYS))})")
    context = case.get("context", {})
    expect = case.get("expect", {})
    decided_by = case.get("decided_by", {})
    diagnostics = case.get("diagnostics")
    if not isinstance(context, dict) or not isinstance(expect, dict) or not isinstance(decided_by, dict):
        problems.append("context, expect and decided_by must be tables")
    if diagnostics is not None and (not isinstance(diagnostics, list) or not all(isinstance(d, str) for d in diagnostics)):
        problems.append("diagnostics must be a list of diagnostic ids")
    if "starts" in case and not isinstance(case["starts"], bool):
        problems.append("starts must be true or false")
    if "context" not in case:
        problems.append("the case has no context")
    if not expect and not decided_by and diagnostics is None and "starts" not in case:
        problems.append("the case checks nothing: add expect, decided_by, diagnostics or starts")
    decisions = policy_set.decisions
    for table, given in (("expect", expect), ("decided_by", decided_by)):
        if isinstance(given, dict):
            for key in given:
                if key not in decisions:
                    problems.append(f"{table}: {key!r} is not a decision{suggest(key, decisions)} (decisions: {', '.join(decisions)})")
    if problems:
        return CaseResult(name, location, version, tuple(problems))
    fields = dict(context)
    if isinstance(fields.get("features"), list):
        fields["features"] = frozenset(fields["features"])
    if fields.get("kv_transfer_timeout_ms") == "null":
        fields["kv_transfer_timeout_ms"] = None
    for key in ("backend", "transceiver_runtime", "kv_cache_manager"):
        if fields.get(key) == "null":
            fields[key] = None
    try:
        resolution = policy_set.resolve(**fields)
    except ContextError as exc:
        return CaseResult(name, location, version, (f"invalid context: {exc}",))
    for rule_id in resolution.decided_by.values():
        exercised.update(rule_id.split("+"))  # agreeing requirements decide together
    ids = [d.id for d in resolution.diagnostics]
    exercised.update(ids)
    failures = []
    for key, want in expect.items():
        got = resolution.values.get(key)
        if got != want:
            failures.append(f"{key}: expected {want}, got {got} (decided by {resolution.decided_by.get(key, 'nothing')})")
    for key, want in decided_by.items():
        got = resolution.decided_by.get(key)
        if got != want:
            failures.append(f"{key} decided by: expected {want}, got {got}")
    starts = case.get("starts")
    if starts is not None and starts is not resolution.ok:
        errors = ", ".join(d.id for d in resolution.errors) or "none"
        failures.append(f"starts: expected {str(starts).lower()}, got {str(resolution.ok).lower()} (errors: {errors})")
    if diagnostics is not None and sorted(set(diagnostics)) != sorted(set(ids)):
        missing = sorted(set(diagnostics) - set(ids))
        extra = sorted(set(ids) - set(diagnostics))
        detail = "; ".join(part for part in (f"missing {', '.join(missing)}" if missing else "", f"unexpected {', '.join(extra)}" if extra else "") if part)
        failures.append(f"diagnostics: {detail}")
    return CaseResult(name, location, version, tuple(failures))


def _coverage(policy: Policy, exercised: set[str]) -> list[CoverageItem]:
    items = []
    for decision in policy.decisions.values():
        for rule in decision.requirements:
            items.append(CoverageItem("requirement", rule.id, rule.location, rule.id in exercised))
        if decision.preference is not None:
            seen: set[str] = set()
            for row in decision.preference.rows:
                if row.id not in seen:
                    seen.add(row.id)
                    items.append(CoverageItem("row", row.id, row.location, row.id in exercised))
        for rule in decision.conditionals:
            items.append(CoverageItem("conditional", rule.id, rule.location, rule.id in exercised))
        items.append(CoverageItem("default", decision.default.id, decision.default.location, decision.default.id in exercised))
        for rule in decision.adjustments:
            items.append(CoverageItem("adjustment", rule.id, rule.location, rule.id in exercised))
    for constraint in policy.constraints:
        items.append(CoverageItem("constraint", constraint.id, constraint.location, constraint.id in exercised))
    return items


def render(run: TestRun, *, coverage: bool, verbose: bool = False) -> str:
    """pytest-like output: failures with details, optional coverage, then the closing line."""
    out: list[str] = []
    for error in run.errors:
        out.append(f"ERROR {error}")
    if run.failed:
        out.append("=" * 30 + " FAILURES " + "=" * 30)
        for case in run.failed:
            out.append(f"_____ {case.name} _____")
            out.append(f"{case.location} (policy {case.policy})")
            out += [f"  {failure}" for failure in case.failures]
            out.append("")
    if verbose:
        for case in run.cases:
            out.append(f"{case.location}: {case.name} {'PASSED' if case.passed else 'FAILED'}")
    if coverage:
        out.append("")
        out.append("coverage: rules, preference rows and constraints exercised by a case")
        width = max((len(p) for p in run.coverage), default=10)
        for path, items in run.coverage.items():
            done = sum(i.exercised for i in items)
            missed = [i for i in items if not i.exercised]
            out.append(f"  {path:<{width}}  {done:>3}/{len(items):<3} {run.percent(path):6.1f}%")
            for item in missed:
                out.append(f"    {item.location}: {item.kind} {item.id} not exercised")
        if run.coverage:
            out.append(f"  {'TOTAL':<{width}}  {run.total_percent():6.1f}%")
        else:  # not 100%: no policy loaded, so nothing was covered
            out.append("  nothing to cover: no policy loaded")
    passed = len(run.cases) - len(run.failed)
    parts = []
    if run.failed:
        parts.append(f"{len(run.failed)} failed")
    parts.append(f"{passed} passed")
    if run.errors:
        parts.append(f"{len(run.errors)} error{'s' if len(run.errors) != 1 else ''}")
    line = f" {', '.join(parts)} in {run.seconds:.2f}s "
    out.append(line.center(70, "="))
    return "\n".join(out) + "\n"


def as_json(run: TestRun) -> str:
    """Cases, coverage and a summary as one JSON object."""
    import json

    document = {
        "cases": [{"name": c.name, "location": str(c.location), "policy": c.policy, "passed": c.passed, "failures": list(c.failures)} for c in run.cases],
        "errors": run.errors,
        "coverage": {
            path: {
                "percent": round(run.percent(path), 2),
                "missed": [{"kind": i.kind, "id": i.id, "location": str(i.location)} for i in items if not i.exercised],
            }
            for path, items in run.coverage.items()
        },
        "summary": {"passed": len(run.cases) - len(run.failed), "failed": len(run.failed), "errors": len(run.errors)},
    }
    return json.dumps(document, indent=2) + "\n"


def as_junit(run: TestRun) -> str:
    """JUnit XML: one test suite per policy version, one test case per case."""
    from xml.etree import ElementTree

    root = ElementTree.Element("testsuites", name="kvpolicy test")
    suites: dict[str, Any] = {}
    for case in run.cases:
        suite = suites.get(case.policy)
        if suite is None:
            suite = suites[case.policy] = ElementTree.SubElement(root, "testsuite", name=f"policy {case.policy}")
        element = ElementTree.SubElement(suite, "testcase", name=case.name, classname=case.location.path)
        if not case.passed:
            failure = ElementTree.SubElement(element, "failure", message="; ".join(case.failures))
            failure.text = f"{case.location}\n" + "\n".join(case.failures)
    for error in run.errors:
        suite = ElementTree.SubElement(root, "testsuite", name="errors")
        element = ElementTree.SubElement(suite, "testcase", name=error.split(":", 1)[0], classname="kvpolicy")
        ElementTree.SubElement(element, "error", message=error)
    for suite in root:
        cases = list(suite)
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
        suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    root.set("tests", str(len(run.cases) + len(run.errors)))
    root.set("failures", str(len(run.failed)))
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


def _main() -> None:  # pragma: no cover - convenience for `python -m kvpolicy.lint.cases`
    run = run_tests(sys.argv[1:] or ["policies"])
    sys.stdout.write(render(run, coverage=True))
