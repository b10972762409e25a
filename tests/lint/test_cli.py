"""``kvpolicy lint``, ``rule`` and ``rules``: output formats, exit codes, configuration,
suppressions and version history."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from xml.etree import ElementTree

import pytest

from tests.support.lint import git

from .conftest import FIXTURES, REPO, check_golden

MIXED = str(FIXTURES / "KVP021.toml")


@pytest.mark.parametrize("fmt", ["json", "github", "sarif", "junit"])
def test_formats_match_golden(cli, fmt):
    code, out, _ = cli("lint", MIXED, str(FIXTURES / "KVP030.toml"), "--format", fmt)
    assert code == 1
    check_golden(f"format.{fmt}", out)


def test_text_format_is_ruff_like(cli):
    _, out, _ = cli("lint", str(FIXTURES / "KVP030.toml"))
    first = out.splitlines()[0]
    assert first.startswith("tests/lint/fixtures/KVP030.toml:44:3: KVP030 ")
    assert out.rstrip().splitlines()[-1].startswith("Found 1 finding: 1 error")


def test_sarif_structure(cli):
    _, out, _ = cli("lint", MIXED, "--format", "sarif")
    sarif = json.loads(out)
    assert sarif["version"] == "2.1.0"
    run = sarif["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert len({r["id"] for r in rules}) == len(rules) >= 18
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1


def test_github_annotations_escape(cli, tmp_path):
    _, out, _ = cli("lint", str(FIXTURES / "KVP030.toml"), "--format", "github")
    assert out.startswith("::error file=tests/lint/fixtures/KVP030.toml,line=44,col=3,title=KVP030 auto-rejected::")
    assert out.count("\n") == 1
    # A path with the property separators and a message with a percent sign: both escaped, one line each.
    folder = tmp_path / "a,b:c%d"
    folder.mkdir()
    text = (FIXTURES / "clean.toml").read_text().replace('summary = "Lint fixture."', 'summary = "Lint fixture."\n"50%,x:y" = 1', 1)
    (folder / "p.toml").write_text(text)
    _, out, _ = cli("lint", str(folder / "p.toml"), "--format", "github")
    (line,) = out.splitlines()
    properties, message = line.split("::")[1:3]
    assert "a%2Cb%3Ac%25d" in properties and "a,b" not in properties
    assert "unknown key '50%25,x:y'" in message


def test_junit_is_xml(cli):
    _, out, _ = cli("lint", MIXED, str(FIXTURES / "clean.toml"), "--format", "junit")
    root = ElementTree.fromstring(out.split("\n", 1)[1])
    assert root.get("failures") == "3" and root.get("tests") == "4"


def test_exit_codes(cli, tmp_path):
    assert cli("lint", str(FIXTURES / "clean.toml"))[0] == 0
    assert cli("lint", str(FIXTURES / "KVP040.toml"))[0] == 1
    assert cli("lint", str(FIXTURES / "KVP040.toml"), "--fail-level", "error")[0] == 0
    assert cli("lint", str(FIXTURES / "KVP001.toml"), "--fail-level", "error")[0] == 1
    code, out, err = cli("lint", str(tmp_path / "missing.toml"))
    assert code == 2 and out == "" and "no such file" in err
    assert cli("lint", MIXED, "--select", "KVP999")[0] == 2
    with pytest.raises(SystemExit) as exc:
        cli("lint", "--format", "xml")
    assert exc.value.code == 2


def test_no_policy_files_is_a_usage_error(cli, tmp_path):
    code, _, err = cli("lint", str(tmp_path))
    assert code == 2 and "no policy files" in err
    (tmp_path / "p.cases.toml").write_text("")
    code, _, err = cli("lint", str(tmp_path))
    assert code == 2 and "hold policy test cases" in err


def test_pre_commit_lint_hook_catches_a_duplicate_version_in_an_unstaged_file(cli, tmp_path, monkeypatch):
    """The hook runs `kvpolicy lint` with no file names: the folder is linted, so a staged file
    that repeats the version of an unstaged one fails (KVP050)."""
    (tmp_path / "policies").mkdir()
    for name in ("a.toml", "b.toml"):
        shutil.copy(FIXTURES / "clean.toml", tmp_path / "policies" / name)
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("lint")
    assert code == 1 and "KVP050" in out


def test_no_paths_lints_policies_folder(cli, monkeypatch, tmp_path):
    (tmp_path / "policies").mkdir()
    shutil.copy(FIXTURES / "clean.toml", tmp_path / "policies" / "a.toml")
    shutil.copy(FIXTURES / "KVP040.toml", tmp_path / "policies" / "b.toml")
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("lint")
    assert code == 1 and "policies/b.toml" in out and "KVP040" in out
    assert "(2 files checked)" in out
    (tmp_path / "policies" / "b.toml").unlink()
    code, out, _ = cli("lint")
    assert code == 0 and "(1 file checked)" in out
    monkeypatch.chdir(tmp_path / "policies")
    code, _, err = cli("lint")
    assert code == 2 and "./policies/ does not exist" in err


def test_select_and_ignore(cli):
    code, out, _ = cli("lint", MIXED, "--ignore", "shadowed-rule")
    assert code == 0
    code, out, _ = cli("lint", MIXED, "--select", "documentation,KVP02")
    assert code == 1 and "KVP021" in out


def test_pyproject_configuration(cli, tmp_path, monkeypatch):
    shutil.copy(FIXTURES / "KVP040.toml", tmp_path / "policy.toml")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.kvpolicy]\nignore = ["KVP040"]\n')
    assert cli("lint", "policy.toml")[0] == 0
    (tmp_path / "pyproject.toml").write_text('[tool.kvpolicy]\nfail-level = "error"\n')
    code, out, _ = cli("lint", "policy.toml")
    assert code == 0 and "KVP040" in out
    (tmp_path / "pyproject.toml").write_text('[tool.kvpolicy]\nselect = ["KVP09"]\n')
    code, out, _ = cli("lint", "policy.toml")
    assert code == 0 and "All checks passed" in out
    (tmp_path / "pyproject.toml").write_text('[tool.kvpolicy]\nfail_level = "error"\n')
    code, _, err = cli("lint", "policy.toml")
    assert code == 2 and "unknown [tool.kvpolicy] key" in err


def test_inline_suppression(cli, tmp_path):
    text = (FIXTURES / "KVP030.toml").read_text().replace(
        'source = "fixture" },\n]', 'source = "fixture" },  # kvpolicy: ignore[KVP030] reproduces upstream\n]', 1
    )
    path = tmp_path / "policy.toml"
    path.write_text(text)
    code, out, _ = cli("lint", str(path))
    assert code == 0, out
    assert "1 suppressed" in out


def test_suppression_inside_a_string_does_not_count(tmp_path):
    from kvpolicy.lint.runner import _in_comment

    assert _in_comment('x = 1  # kvpolicy: ignore[KVP030]', 7)
    assert not _in_comment('x = "# kvpolicy: ignore[KVP030]"', 5)


def test_rule_and_rules(cli):
    code, out, _ = cli("rule", "KVP030")
    assert code == 0 and out.startswith("# auto-rejected (KVP030)") and "## Fix" in out
    assert cli("rule", "shadowed-rule")[1].startswith("# shadowed-rule (KVP021)")
    code, _, err = cli("rule", "KVP031")
    assert code == 2 and "did you mean" in err
    code, out, _ = cli("rules")
    assert code == 0 and "KVP001" in out and "precedence:" in out
    assert len(json.loads(cli("rules", "--format", "json")[1])) == 25


def test_rule_docs_are_markdown_in_rule_and_sarif(cli):
    """Rule docstrings are written with RST double backticks; what people and code scanning read
    is Markdown: single backticks, code fences kept."""
    from kvpolicy.lint.rules import RULES

    assert "``version``" in RULES["KVP052"].doc  # the source keeps the docstring convention
    out = cli("rule", "KVP052")[1]
    assert "``" not in out.replace("```", "") and "`kvpolicy check`" in out
    out = cli("rule", "KVP001")[1]
    assert "```toml" in out and "``" not in out.replace("```", "")
    sarif = json.loads(cli("lint", "--format", "sarif", "tests/lint/fixtures/clean.toml")[1])
    for rule in sarif["runs"][0]["tool"]["driver"]["rules"]:
        for text in (rule["help"]["text"], rule["help"]["markdown"], rule["fullDescription"]["text"]):
            assert "``" not in text.replace("```", ""), rule["id"]
    kvp041 = next(r for r in sarif["runs"][0]["tool"]["driver"]["rules"] if r["id"] == "KVP041")
    assert "`source`" in kvp041["fullDescription"]["text"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_unbumped_version_against_base(tmp_path, monkeypatch):
    from kvpolicy.lint import lint_paths

    git("init", "-q", cwd=tmp_path)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "root", cwd=tmp_path)
    policy = tmp_path / "policies" / "p.toml"
    policy.parent.mkdir()
    policy.write_text((FIXTURES / "clean.toml").read_text())
    git("add", ".", cwd=tmp_path)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "policy", cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    # A comment is not a content change.
    policy.write_text(policy.read_text() + "# a comment\n")
    assert lint_paths(["policies"], base="HEAD").findings == []
    # A changed value without a bump is.
    policy.write_text(policy.read_text().replace('value = "V1", reason', 'value = "V2", reason'))
    findings = lint_paths(["policies"], base="HEAD").findings
    assert [(f.code, f.location.line) for f in findings] == [("KVP051", 3)]
    # Bumping the version fixes it.
    policy.write_text(policy.read_text().replace('version = "2030.01.01"', 'version = "2030.01.02"'))
    assert lint_paths(["policies"], base="HEAD").findings == []


def test_bad_base_is_a_usage_error(cli):
    code, _, err = cli("lint", MIXED, "--base", "no-such-ref-xyz")
    assert code == 2 and "not a git revision" in err


def test_lint_cli_does_not_import_torch():
    code = (
        # One shipped version: the command imports the same modules for one file as for fourteen.
        "import sys; from kvpolicy.cli import main; main(['lint', 'policies/2026.09.10.toml', '--format', 'json']); "
        "assert 'torch' not in sys.modules and 'nixl' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_pre_commit_hooks_name_real_commands():
    yaml = pytest.importorskip("yaml")
    from kvpolicy.cli import COMMANDS

    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert {h["id"] for h in hooks} == {"kvpolicy-check", "kvpolicy-lint", "kvpolicy-fmt", "kvpolicy-test"}
    for hook in hooks:
        program, command = hook["entry"].split()[:2]
        assert program == "kvpolicy" and command in COMMANDS
        assert hook["language"] == "python"
        if command in ("check", "lint", "test"):
            # The whole folder, not the staged files: version hygiene compares every file.
            assert hook["pass_filenames"] is False, hook["id"]


def test_output_file(cli, tmp_path):
    target = tmp_path / "report.sarif"
    code, out, _ = cli("lint", MIXED, "--format", "sarif", "--output", str(target))
    assert code == 1 and out == ""
    assert json.loads(target.read_text())["version"] == "2.1.0"


def test_one_run_writes_several_formats(cli, tmp_path):
    """CI lints once: annotations on stdout, SARIF and JUnit to files, from the same findings."""
    sarif, junit = tmp_path / "lint.sarif", tmp_path / "lint.xml"
    code, out, _ = cli("lint", MIXED, "--format", "github", "-o", f"sarif={sarif}", "-o", f"junit={junit}")
    assert code == 1
    annotations = [line for line in out.splitlines() if line.startswith("::")]
    results = json.loads(sarif.read_text())["runs"][0]["results"]
    assert annotations and len(annotations) == len(results)
    assert {r["ruleId"] for r in results} == {line.split("title=", 1)[1].split(" ", 1)[0].rstrip(",:") for line in annotations}
    assert junit.read_text().count("<failure") == len(results)
    code, _, err = cli("lint", MIXED, "-o", str(tmp_path / "a"), "-o", str(tmp_path / "b"))
    assert code == 2 and "already goes to" in err


def test_policy_too_large_to_analyse_is_a_finding_not_a_silent_pass(cli, tmp_path):
    """Twenty features read together would need 2**20 evaluations per context class: the exact
    analysis refuses up front and says so as an error finding (KVP029), the other rules still
    run, and the suppressions of the rules that did not run are not called unused."""
    text = (FIXTURES / "KVP029.toml").read_text().replace(
        'value = "PYTHON", reason = "GPT-OSS prefers PYTHON.", source = "fixture" },',
        'value = "PYTHON", reason = "GPT-OSS prefers PYTHON.", source = "fixture" },  # kvpolicy: ignore[KVP030] upstream',
    )
    path = tmp_path / "big.toml"
    path.write_text(text)
    code, out, err = cli("lint", str(path))
    assert code == 1, out
    assert "KVP029 precedence and safety analysis skipped" in out
    assert "KVP090" not in out
    (tmp_path / "pyproject.toml").write_text('[tool.kvpolicy]\nanalysis-limit = "warning"\n')
    code, out, _ = cli("lint", str(path), "--config", str(tmp_path / "pyproject.toml"), "--fail-level", "error")
    assert code == 0 and "KVP029" in out


def test_suppression_reason_reaches_json_and_sarif(cli, tmp_path):
    text = (FIXTURES / "KVP030.toml").read_text().replace(
        'source = "fixture" },\n]', 'source = "fixture" },  # kvpolicy: ignore[KVP030] reproduces upstream 2026-08-24\n]', 1
    )
    path = tmp_path / "policy.toml"
    path.write_text(text)
    suppressed = json.loads(cli("lint", str(path), "--format", "json")[1])["suppressed"]
    assert [s["reason"] for s in suppressed] == ["reproduces upstream 2026-08-24"]
    results = json.loads(cli("lint", str(path), "--format", "sarif")[1])["runs"][0]["results"]
    assert [r["suppressions"][0]["justification"] for r in results] == ["reproduces upstream 2026-08-24"]


def test_sarif_fingerprints_are_stable_when_lines_move(cli, tmp_path):
    path = tmp_path / "policy.toml"
    text = (FIXTURES / "KVP021.toml").read_text()
    path.write_text(text)
    before = [r["partialFingerprints"]["primaryLocationLineHash"] for r in json.loads(cli("lint", str(path), "--format", "sarif")[1])["runs"][0]["results"]]
    path.write_text("# a comment that moves every line down\n\n" + text)
    after = json.loads(cli("lint", str(path), "--format", "sarif")[1])["runs"][0]["results"]
    assert before and [r["partialFingerprints"]["primaryLocationLineHash"] for r in after] == before
    assert len(set(before)) == len(before)


def test_junit_names_are_unique(cli, tmp_path):
    path = tmp_path / "policy.toml"
    # Two misspelt values in one condition: two KVP010 findings at one location.
    path.write_text((FIXTURES / "clean.toml").read_text().replace('backend = { not = "NIXL" }', 'backend = { not = ["NIXLL", "UCXX"] }', 1))
    _, out, _ = cli("lint", str(path), "--format", "junit")
    names = [case.get("name") for case in ElementTree.fromstring(out.split("\n", 1)[1]).iter("testcase")]
    assert len(names) == len(set(names)) >= 2


def test_an_unknown_rule_code_reads_as_one_sentence(capsys):
    from kvpolicy.cli import main

    assert main(["rule", "KVP999"]) == 2
    err = capsys.readouterr().err
    assert "no lint rule 'KVP999' (did you mean 'KVP091'?); `kvpolicy rules` lists them" in err and "?;" not in err
