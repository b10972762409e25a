"""Every lint rule: a fixture of a bad policy and the golden output of linting it; the shipped
policies lint clean; the catalogue is complete and documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import kvpolicy
from kvpolicy.lint import RULES, lint_paths
from kvpolicy.lint.rules import CATEGORIES, catalogue
from kvpolicy.read.loader import shipped_root

from tests.support.lint import claim_holds, resolve_fields, two_versions, with_source

from .conftest import FIXTURES, check_golden

#: Rules checked by a dedicated test instead of a file fixture (they need a git history).
NO_FILE_FIXTURE = {"KVP051"}


def _fixture(code: str) -> str:
    folder = FIXTURES / code
    return str(folder if folder.is_dir() else FIXTURES / f"{code}.toml")


@pytest.mark.parametrize("code", sorted(set(RULES) - NO_FILE_FIXTURE))
def test_rule_fixture_matches_golden(cli, code):
    exit_code, out, err = cli("lint", _fixture(code))
    check_golden(f"{code}.txt", out)
    assert exit_code == 1, err
    found = set(re.findall(r": (KVP\d{3}) ", out))
    assert found == {code}, f"the {code} fixture should trigger {code} only, got {sorted(found)}"


def test_clean_fixture_is_clean(cli):
    exit_code, out, _ = cli("lint", str(FIXTURES / "clean.toml"))
    assert exit_code == 0
    assert out.startswith("All checks passed!")


@pytest.fixture(scope="module")
def shipped_lint():
    return lint_paths([str(shipped_root())])


def test_shipped_policies_lint_clean(shipped_lint):
    result = shipped_lint
    assert [f"{f.location}: {f.code} {f.message}" for f in result.findings] == []
    assert len(result.files) == len(kvpolicy.load().versions())
    # The upstream behaviours the rules flag are suppressed in review, not absent.
    # Upstream-faithful start-up failures (preferences adopted verbatim, the cancel gate) are suppressed, with reasons.
    assert {f.code for f in result.suppressed} == {"KVP030"}


def test_every_suppressed_kvp030_claim_holds_on_its_own_counterexample(shipped_lint):
    """What each KVP030 finding on the shipped policies says is true: in its counterexample, auto
    picks a value a constraint rejects, and the value it names instead passes every check (the
    errors of the other decisions included)."""
    checked = 0
    for finding in shipped_lint.suppressed:
        version = Path(finding.location.path).name.removesuffix(".toml")
        policy_set = kvpolicy.load(version=version)
        claim = re.search(r"(backend|transceiver_runtime|kv_cache_manager) = (\w+) would pass", finding.message)
        assert claim and finding.context is not None, finding.message
        decision, working = claim.groups()
        fields = resolve_fields(finding.context)
        auto = policy_set.resolve(**fields)
        assert not auto.ok, f"{finding.location}: the counterexample starts under auto: {finding.message}"
        explicit = policy_set.resolve(**{**fields, decision: working})
        assert explicit.ok, f"{finding.location}: {decision} = {working} does not pass: {[d.id for d in explicit.errors]}"
        checked += 1
    assert checked == len(shipped_lint.suppressed) > 100


def test_shipped_2026_08_24_python_preferences_fail_on_ucx():
    """The issue's example: from 2026.08.24, PYTHON preferences adopted verbatim fail on UCX."""
    result = lint_paths([str(shipped_root() / "2026.08.24.toml")])
    llama = [
        f for f in result.suppressed
        if f.code == "KVP030" and "LlamaForCausalLM" in f.message and "backend UCX" in f.message
    ]
    assert len(llama) == 1, "one finding per (rule, constraint): the backends it fails on are listed in it"
    assert "backend MOONCAKE; backend MPI; backend UCX" in llama[0].message
    assert llama[0].context["architecture"] == "LlamaForCausalLM"
    # One problem, one finding: no two KVP030 findings at one line.
    lines = [(f.location.path, f.location.line) for f in result.suppressed + result.findings if f.code == "KVP030"]
    assert len(lines) == len(set(lines))


@pytest.mark.parametrize("code", sorted(RULES))
def test_rule_is_documented(code):
    rule = RULES[code]
    assert re.fullmatch(r"KVP\d{3}", code)
    assert rule.category in CATEGORIES
    assert rule.summary and "\n" not in rule.summary
    for heading in ("## What it does", "## Why is this bad?", "## Example", "## Fix"):
        assert heading in rule.doc, f"{code} docstring lacks {heading!r}"


def test_codes_are_stable():
    """Codes never change meaning: renaming or renumbering a rule must fail here."""
    assert {code: rule.name for code, rule in RULES.items()} == {
        "KVP001": "invalid-toml",
        "KVP002": "schema-violation",
        "KVP003": "refused-file",
        "KVP010": "unknown-name",
        "KVP011": "unknown-architecture",
        "KVP012": "unknown-option",
        "KVP013": "duplicate-id",
        "KVP014": "bad-placeholder",
        "KVP015": "input-cycle",
        "KVP020": "duplicate-architecture",
        "KVP021": "shadowed-rule",
        "KVP022": "unreachable-rule",
        "KVP023": "conflicting-requirements",
        "KVP024": "redundant-requirement",
        "KVP029": "analysis-limit",
        "KVP030": "auto-rejected",
        "KVP040": "missing-reason",
        "KVP041": "missing-source",
        "KVP042": "unfilled-placeholder",
        "KVP050": "duplicate-version",
        "KVP051": "unbumped-version",
        "KVP052": "identical-version",
        "KVP053": "repeated-source",
        "KVP090": "unused-suppression",
        "KVP091": "suppression-without-reason",
    }


def test_catalogue_knows_every_shipped_architecture():
    import kvpolicy

    named = set()
    for version in kvpolicy.load().versions():
        named |= set(kvpolicy.load(version=version).policy.architectures())
    assert named <= set(catalogue()["architectures"])


def test_every_finding_of_a_file_is_reported_in_one_run():
    result = lint_paths([_fixture("KVP002")])
    assert len([f for f in result.findings if f.code == "KVP002"]) == 3


def test_conflicting_rows_map_to_duplicate_architecture(tmp_path):
    text = (FIXTURES / "KVP020.toml").read_text().replace(
        'value = "PYTHON", reason = "Listed again by mistake."', 'value = "CPP", reason = "Listed again by mistake."'
    )
    path = tmp_path / "policy.toml"
    path.write_text(text)
    result = lint_paths([str(path)])
    assert [f.code for f in result.findings] == ["KVP020"]
    assert "listed twice with different values" in result.findings[0].message


def _codes(path: str) -> list[tuple[str, str, int]]:
    return [(f.code, f.location.path.rsplit("/", 1)[-1], f.location.line) for f in lint_paths([path]).findings]


def test_identical_version_compares_the_loaded_policies_not_the_text(tmp_path):
    """KVP052: comments, layout, quoting and summary/source do not make a version differ; a reason
    does (a documentation fix is a change a new version may carry)."""
    def relaid(text):
        text = text.replace("# A small policy", "# Another comment, then a small policy")
        text = text.replace('values = ["NIXL", "UCX"]', "values = [ 'NIXL', 'UCX' ]  # the backends")
        text = text.replace('summary = "Lint fixture."', 'summary = "Another summary."')
        return with_source(text, "NVIDIA/TensorRT-LLM #2")

    path = two_versions(tmp_path, lambda t: with_source(t, "NVIDIA/TensorRT-LLM #1"), relaid)
    assert _codes(path) == [("KVP052", "b.toml", 3)]

    def reason(text):
        return relaid(text).replace('reason = "CPP works everywhere."', 'reason = "CPP works on every backend."')

    assert _codes(two_versions(tmp_path / "2", lambda t: with_source(t, "NVIDIA/TensorRT-LLM #1"), reason)) == []


def test_identical_version_is_judged_against_the_closest_earlier_version_of_the_same_folder(tmp_path):
    def same(text):
        return with_source(text, "NVIDIA/TensorRT-LLM #1")

    def other(text):
        return with_source(text, "NVIDIA/TensorRT-LLM #2")

    # Two folders, one version each: nothing to compare (a run may lint several policy folders).
    two_versions(tmp_path, same, other, "x")
    (tmp_path / "x" / "b.toml").rename(tmp_path / "b.toml")
    result = lint_paths([str(tmp_path / "x"), str(tmp_path / "b.toml")])
    assert [f.code for f in result.findings] == []
    # Three versions: the newest is compared with the middle one, which differs from it.
    path = two_versions(tmp_path, same, other, "three")
    text = (FIXTURES / "clean.toml").read_text().replace('version = "2030.01.01"', 'version = "2030.01.03"')
    changed = text.replace('value = "PYTHON", reason = "GPT-OSS', 'value = "CPP", reason = "GPT-OSS')
    (Path(path) / "c.toml").write_text(with_source(changed, "NVIDIA/TensorRT-LLM #3"))
    assert _codes(path) == [("KVP052", "b.toml", 3)]


def test_repeated_source_compares_the_changes_cited(tmp_path):
    """KVP053: a source naming no upstream change the previous one does not (#NNNN, URLs), or the
    same text when it names none; a placeholder is KVP042's alone."""
    def changed(source):
        return lambda t: with_source(t.replace('value = "PYTHON", reason = "GPT-OSS', 'value = "CPP", reason = "GPT-OSS'), source)

    def first(text):
        return with_source(text, "NVIDIA/TensorRT-LLM #19004 and #19140 (merged 2026-09-15)")

    cases = {
        "NVIDIA/TensorRT-LLM #19004 (the rest of it)": ["KVP053"],
        "NVIDIA/TensorRT-LLM #19004 and #19999": [],
        "https://github.com/NVIDIA/TensorRT-LLM/pull/19999": [],
        "kvpolicy: a local change": [],
        "TODO(kvpolicy new): the upstream change": ["KVP042"],
    }
    for number, (source, expected) in enumerate(cases.items()):
        path = two_versions(tmp_path / str(number), first, changed(source))
        assert [code for code, _, _ in _codes(path)] == expected, source
    path = two_versions(tmp_path / "text", lambda t: t, changed("kvpolicy   TESTS"))
    assert _codes(path) == [("KVP053", "b.toml", 5)]
    finding = lint_paths([path]).findings[0]
    assert "it is the source of 2030.01.01" in finding.message and finding.related[0][0].line == 5


def test_every_shipped_version_changes_something_and_cites_a_new_upstream_change(shipped_lint):
    """The shipped history passes KVP052 and KVP053 because each version differs from the one
    before it and its source names an upstream PR the previous one does not, not by suppression."""
    from kvpolicy.lint.rules.versioning import _policy_content, _references

    assert not {"KVP052", "KVP053"} & {f.code for f in shipped_lint.findings + shipped_lint.suppressed}
    versions = kvpolicy.load().versions()
    for before, after in zip(versions, versions[1:]):
        old, new = (kvpolicy.load(version=v).policy for v in (before, after))
        assert _policy_content(old) != _policy_content(new), after
        assert _references(new.source) - _references(old.source), after


#: Added to the KVP030 fixture: GPT-OSS runs only on NIXL, whichever runtime, and that error belongs
#: to *the backend decision*. On UCX, auto's PYTHON is rejected (python-requires-nixl), and CPP, the only
#: other runtime, fails too, through the other decision: no runtime would pass, so KVP030 must not say one does.
GPT_OSS_NIXL_ONLY = """
[[constraints]]
id = "gpt-oss-requires-nixl"
decision = "backend"
severity = "error"
when = { architecture = "GptOssForCausalLM", backend = { not = "NIXL" } }
message = "GPT-OSS moves its KV cache over NIXL only, but the backend is {backend}."
fix = "set backend to NIXL"
reason = "GPT-OSS's pool layout is registered with NIXL only."
source = "fixture"
"""


def test_kvp030_never_claims_a_value_passes_when_another_decision_then_fails(tmp_path):
    text = (FIXTURES / "KVP030.toml").read_text()
    head, tail = text.split("[[constraints]]", 1)
    path = tmp_path / "2030.01.01.30.toml"
    path.write_text(head + GPT_OSS_NIXL_ONLY + "\n[[constraints]]" + tail)
    policy_set = kvpolicy.load(str(path))
    # The situation the rule must see: auto fails on UCX, and so does explicit CPP (through the backend).
    auto = policy_set.resolve(architecture="GptOssForCausalLM", backend="UCX")
    assert "python-requires-nixl" in [d.id for d in auto.errors]
    cpp = policy_set.resolve(architecture="GptOssForCausalLM", backend="UCX", transceiver_runtime="CPP")
    assert [(d.id, d.decision) for d in cpp.errors] == [("gpt-oss-requires-nixl", "backend")]

    result = lint_paths([str(path)])
    kvp030 = [f for f in result.findings if f.code == "KVP030"]
    assert not [f for f in kvp030 if "transceiver_runtime = CPP would pass" in f.message], [f.message for f in kvp030]
    for finding in kvp030:  # whatever is still reported says only what is true
        claim_holds(finding)


def test_a_reported_kvp030_finding_says_what_fails_where_and_what_would_pass():
    (finding,) = [f for f in lint_paths([_fixture("KVP030")]).findings if f.code == "KVP030"]
    assert finding.context == {"architecture": "GptOssForCausalLM", "backend": "UCX"} or (
        finding.context["architecture"] == "GptOssForCausalLM" and finding.context["backend"] == "UCX"
    )
    assert "auto resolves transceiver_runtime to PYTHON through runtime-preference[GptOssForCausalLM]" in finding.message
    assert "which constraint python-requires-nixl rejects; transceiver_runtime = CPP would pass" in finding.message
    claim_holds(finding)
