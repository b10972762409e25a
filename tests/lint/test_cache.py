"""The lint, fmt and test results cache: an unchanged file is answered from it with exactly the
results a fresh run gives, an edit is seen at once, and a bad entry is only a miss."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvpolicy.read import cache as kvcache
from kvpolicy.cli.fmt import check_format
from kvpolicy.lint import cases as lint_cases
from kvpolicy.lint.rules import base as rules_base
from kvpolicy.lint import runner
from kvpolicy.lint.report import render
from kvpolicy.lint.runner import LintConfig, lint_paths
from kvpolicy.read.policyfile import shipped_root

FIXTURES = Path(__file__).parent / "fixtures"
#: Files with findings of every kind a cache entry must carry back: related locations, counterexample
#: contexts, suppressions with and without reasons, a skipped analysis, loader errors.
WITH_FINDINGS = ("KVP003.toml", "KVP020.toml", "KVP021.toml", "KVP029.toml", "KVP030.toml", "KVP090.toml", "KVP091.toml", "clean.toml")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def folder(tmp_path):
    target = tmp_path / "policies"
    target.mkdir()
    for name in WITH_FINDINGS:
        shutil.copy(FIXTURES / name, target / name)
    return target


def _same(a, b):
    """Two lint results say the same thing, in every format."""
    assert a.findings == b.findings
    assert a.suppressed == b.suppressed
    assert a.reasons == b.reasons
    assert [(f.path, f.skipped) for f in a.files] == [(f.path, f.skipped) for f in b.files]
    for name in ("text", "json", "sarif", "github", "junit"):
        assert render(a, name) == render(b, name), name


class _Counter:
    def __init__(self, monkeypatch):
        self.calls = 0
        original = rules_base.analyse

        def counted(policy):
            self.calls += 1
            return original(policy)

        monkeypatch.setattr(rules_base, "analyse", counted)


def test_an_unchanged_folder_is_answered_from_the_cache_with_the_findings_a_fresh_run_gives(cache_dir, folder, monkeypatch):
    fresh = lint_paths([str(folder)], cache=False)
    assert {f.code for f in fresh.findings} >= {"KVP003", "KVP021", "KVP029", "KVP090", "KVP091"}
    assert fresh.suppressed and any(f.context for f in fresh.findings + fresh.suppressed)
    assert any(f.related for f in fresh.findings)
    assert any(f.skipped for f in fresh.files)
    assert not list(cache_dir.glob("lint-*")), "cache=False stores no lint result"
    first = lint_paths([str(folder)])
    _same(first, fresh)

    def refuse(*args, **kwargs):
        raise AssertionError("an unchanged file was parsed again")

    monkeypatch.setattr(runner, "load_policy_bytes", refuse)
    _same(lint_paths([str(folder)]), fresh)


def test_an_edit_re_analyses_the_edited_file_only_and_re_runs_the_rules_that_compare_files(cache_dir, tmp_path, monkeypatch):
    target = tmp_path / "shipped"
    shutil.copytree(shipped_root(), target, ignore=shutil.ignore_patterns("*.cases.toml", "*.py", "*.json", "__pycache__"))
    lint_paths([str(target)])
    counter = _Counter(monkeypatch)
    newest, previous = sorted(target.glob("*.toml"))[-1], sorted(target.glob("*.toml"))[-2]
    text = newest.read_text()
    version = newest.stem
    newest.write_text(text.replace(f'version = "{version}"', f'version = "{previous.stem}"', 1))
    result = lint_paths([str(target)])
    assert counter.calls == 1, "only the edited file is analysed again"
    duplicates = [f for f in result.findings if f.code == "KVP050"]
    assert duplicates, "the set rule sees the edit although the other file's results came from the cache"
    _same(result, lint_paths([str(target)], cache=False))


def test_a_corrupt_truncated_or_foreign_entry_is_a_miss(cache_dir, folder):
    fresh = lint_paths([str(folder)], cache=False)
    lint_paths([str(folder)])
    entries = [p for p in cache_dir.glob("lint-*/*/*") if p.is_file()]
    assert entries
    for number, entry in enumerate(entries):
        data = entry.read_bytes()
        if number % 3 == 0:
            entry.write_bytes(data[: len(data) // 2])  # truncated
        elif number % 3 == 1:
            head, _, payload = data.partition(b"\n")
            entry.write_bytes(head + b"\n" + payload.replace(b"KVP0", b"KVP9"))  # altered: sha256 no longer matches
        else:
            import json

            payload = json.dumps({"key": entry.name, "loaded": True, "skipped": None, "findings": [["KVP999", 1, 2, 3, 4, 5]]}).encode()
            head = b" ".join((b"kvpolicy-index", entry.name.encode(), kvcache.sha256(payload).encode()))
            entry.write_bytes(head + b"\n" + payload)  # well-formed entry of the wrong shape
    _same(lint_paths([str(folder)]), fresh)


def test_the_rules_that_run_and_kvpolicys_own_code_are_part_of_the_key(cache_dir, folder, monkeypatch):
    everything = lint_paths([str(folder)])
    only = LintConfig(select=("KVP030",))
    selected = lint_paths([str(folder)], only)
    assert {f.code for f in selected.findings} <= {"KVP030"} < {f.code for f in everything.findings}
    _same(selected, lint_paths([str(folder)], only, cache=False))
    counter = _Counter(monkeypatch)
    lint_paths([str(folder)])
    assert counter.calls == 0
    monkeypatch.setattr(kvcache, "_FINGERPRINT", ["another kvpolicy"])
    lint_paths([str(folder)])
    assert counter.calls > 0, "results of another kvpolicy's code are not read"


def test_the_fingerprint_changes_when_a_package_file_changes(tmp_path, monkeypatch):
    package = tmp_path / "kvpolicy"
    package.mkdir()
    (package / "cache.py").write_text("x = 1\n")
    monkeypatch.setattr(kvcache, "__file__", str(package / "cache.py"))
    monkeypatch.setattr(kvcache, "_FINGERPRINT", [])
    before = kvcache.code_fingerprint()
    (package / "rules.py").write_text("y = 2\n")
    monkeypatch.setattr(kvcache, "_FINGERPRINT", [])
    assert kvcache.code_fingerprint() != before


def test_lint_no_cache_reads_and_writes_no_entry(cache_dir, folder):
    command = [sys.executable, "-m", "kvpolicy", "lint", "--no-cache", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert not list(cache_dir.glob("lint-*"))
    again = subprocess.run(command[:4] + command[5:], capture_output=True, text=True, timeout=120)
    assert again.stdout == done.stdout and list(cache_dir.glob("lint-*"))


def test_fmt_check_answers_a_canonical_file_from_the_cache_and_sees_an_edit(cache_dir, tmp_path, monkeypatch):
    path = tmp_path / "policies" / "clean.toml"
    path.parent.mkdir()
    shutil.copy(FIXTURES / "clean.toml", path)
    changed, errors, count = check_format([str(path.parent)])
    assert (changed, errors, count) == ([], [], 1)

    def refuse(text):
        raise AssertionError("a canonical file was formatted again")

    from kvpolicy.lint import fmt

    monkeypatch.setattr(fmt, "format_text", refuse)
    assert check_format([str(path.parent)]) == ([], [], 1)
    monkeypatch.undo()
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(cache_dir))
    path.write_text(path.read_text().replace(" = ", "   =   ", 3))
    changed, errors, _ = check_format([str(path.parent)])
    assert errors == [] and [p for p, _, _, _ in changed] == [path], "the edited file is formatted again and found off"


def test_policy_tests_are_answered_from_the_cache_and_an_edited_case_runs_again(cache_dir, tmp_path, monkeypatch):
    target = tmp_path / "policies"
    shutil.copytree(shipped_root(), target, ignore=shutil.ignore_patterns("*.py", "*.json", "__pycache__"))
    fresh = lint_cases.run_tests([str(target)], cache=False)
    assert not list(cache_dir.glob("test-*"))
    lint_cases.run_tests([str(target)])

    def refuse(*args, **kwargs):
        raise AssertionError("an unchanged policy was tested again")

    monkeypatch.setattr(lint_cases, "_run_file", refuse)
    cached = lint_cases.run_tests([str(target)])
    assert (cached.cases, cached.coverage, cached.errors) == (fresh.cases, fresh.coverage, fresh.errors)
    monkeypatch.undo()
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(cache_dir))
    cases = sorted(target.glob("*.cases.toml"))[-1]
    text = cases.read_text()
    assert 'transceiver_runtime = "PYTHON"' in text
    cases.write_text(text.replace('transceiver_runtime = "PYTHON"', 'transceiver_runtime = "CPP"', 1))
    edited = lint_cases.run_tests([str(target)])
    assert len(edited.failed) == 1 and len(edited.cases) == len(fresh.cases)
