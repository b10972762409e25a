"""``kvpolicy test``: policy tests as data, the shipped cases, coverage and thresholds."""

from __future__ import annotations

import shutil

import kvpolicy
from kvpolicy.lint.cases import run_tests
from kvpolicy.read.loader import shipped_root

from .conftest import FIXTURES, check_golden


def test_shipped_cases_pass_with_full_coverage():
    run = run_tests([str(shipped_root())])
    assert run.errors == []
    assert [c.name for c in run.failed] == []
    assert len(run.cases) > 100
    for path in run.coverage:
        assert run.percent(path) == 100.0, path
    assert len(run.coverage) == len(kvpolicy.load().versions())


def test_cli_threshold_and_closing_line(cli):
    code, out, _ = cli("test", "policies/", "--coverage", "--threshold", "100")
    assert code == 0, out
    assert out.rstrip().splitlines()[-1].startswith("=") and " passed in " in out


def _policy_with_cases(tmp_path, cases: str):
    shutil.copy(FIXTURES / "clean.toml", tmp_path / "p.toml")
    (tmp_path / "p.cases.toml").write_text(cases)
    return str(tmp_path)


CASES = '''
[[case]]
name = "GPT-OSS prefers PYTHON on NIXL"
context = { architecture = "GptOssForCausalLM", backend = "NIXL" }
expect = { transceiver_runtime = "PYTHON" }
decided_by = { transceiver_runtime = "runtime-preference[GptOssForCausalLM]" }
diagnostics = []

[[case]]
name = "wrong on purpose"
context = { architecture = "GptOssForCausalLM", backend = "UCX", transceiver_runtime = "PYTHON" }
expect = { transceiver_runtime = "CPP" }
decided_by = { transceiver_runtime = "runtime-default-cpp" }
diagnostics = ["python-requires-nixl", "no-such-diagnostic"]
'''


def test_failures_are_reported_with_location(cli, tmp_path, monkeypatch):
    folder = _policy_with_cases(tmp_path, CASES)
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("test", ".", "--coverage")
    assert code == 1
    check_golden("test_failures.txt", out.rsplit(" in ", 1)[0] + "\n")
    assert "p.cases.toml:9:1" in out
    del folder


def test_threshold_fails_below(cli, tmp_path, monkeypatch):
    _policy_with_cases(tmp_path, CASES.split("[[case]]\nname = \"wrong")[0])
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("test", "p.toml", "--threshold", "50")
    assert code == 1 and "below --threshold 50%" in err
    assert "runtime-default-cpp not exercised" in out
    assert cli("test", "p.toml", "--threshold", "10")[0] == 0


def test_broken_cases_are_errors_not_tracebacks(cli, tmp_path, monkeypatch):
    _policy_with_cases(
        tmp_path, '[[case]]\nname = "x"\ncontext = { backend = "UCXX" }\nexpect = { backend = "UCX" }\n[[case]]\nnmae = 1\n'
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("test", ".")
    assert code == 1
    assert "invalid context: backend" in out and "unknown key(s) nmae" in out
    (tmp_path / "p.cases.toml").write_text("[[case]\n")
    code, out, _ = cli("test", ".")
    assert code == 1 and "ERROR" in out
    assert cli("test", str(tmp_path / "nope"))[0] == 2


def test_json_and_junit_formats(cli, tmp_path, monkeypatch):
    import json
    from xml.etree import ElementTree

    _policy_with_cases(tmp_path, CASES)
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("test", ".", "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["summary"] == {"passed": 1, "failed": 1, "errors": 0}
    assert data["coverage"]["p.toml"]["missed"]
    code, out, _ = cli("test", ".", "--format", "junit")
    root = ElementTree.fromstring(out.split("\n", 1)[1])
    assert code == 1 and root.get("tests") == "2" and root.get("failures") == "1"


def test_case_mistakes_are_errors(cli, tmp_path, monkeypatch):
    """A misspelt decision, a case that checks nothing and a repeated name fail the run with the
    case's location, instead of "expected PYTHON, got None" or a silent pass."""
    _policy_with_cases(
        tmp_path,
        '[[case]]\nname = "typo"\ncontext = {}\nexpect = { transceiver_runtim = "CPP" }\n'
        '[[case]]\nname = "nothing"\ncontext = {}\n'
        '[[case]]\nname = "typo"\ncontext = {}\ndecided_by = { backend = "backend-default-nixl" }\n',
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("test", ".")
    assert code == 1
    assert "expect: 'transceiver_runtim' is not a decision; did you mean 'transceiver_runtime'?" in out
    assert "got None" not in out
    assert "the case checks nothing: add expect, decided_by, diagnostics or starts" in out
    assert "p.cases.toml:8:1 (policy" in out and "duplicate case name; the first is at p.cases.toml:1:1" in out
    (tmp_path / "p.cases.toml").write_text("# no cases yet\n")
    code, out, _ = cli("test", ".")
    assert code == 1 and "holds no [[case]] tables" in out


def test_no_policy_files_is_an_error(cli, tmp_path):
    assert cli("test", str(tmp_path))[0] == 2
    (tmp_path / "x.cases.toml").write_text('[[case]]\nname = "a"\ncontext = {}\nexpect = { backend = "NIXL" }\n')
    code, out, _ = cli("test", str(tmp_path), "--coverage", "--threshold", "100")
    assert code == 1 and "no such policy file" in out
