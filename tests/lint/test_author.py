"""``kvpolicy check`` (lint + fmt --check + test --coverage, one exit code) and ``kvpolicy new``."""

from __future__ import annotations

import shutil

import kvpolicy

from kvpolicy.loader import shipped_root

from .conftest import FIXTURES


def _shipped_copy(tmp_path):
    """The newest shipped version and its cases (what ``new`` copies from), in a folder of its own."""
    folder = tmp_path / "policies"
    folder.mkdir()
    newest = kvpolicy.load().version
    for path in shipped_root().glob(f"{newest}*.toml"):
        shutil.copy(path, folder / path.name)
    return folder


def test_check_passes_on_the_shipped_policies(cli):
    code, out, _ = cli("check", "policies")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[-1] == "passed"
    assert [line.split()[:2] for line in lines[-4:-1]] == [["lint", "passed"], ["fmt", "passed"], ["test", "passed"]]


def test_check_reports_every_failing_step_in_one_summary(cli, tmp_path):
    folder = tmp_path / "policies"
    folder.mkdir()
    text = (FIXTURES / "KVP040.toml").read_text()
    (folder / "p.toml").write_text(text.replace("schema = 1\n", "schema   =   1\n", 1))
    (folder / "p.cases.toml").write_text('[[case]]\nname = "wrong"\ncontext = {}\nexpect = { backend = "UCX" }\n')
    code, out, _ = cli("check", str(folder))
    assert code == 1
    assert "KVP040" in out and "Would reformat" in out and "backend: expected UCX, got NIXL" in out
    assert out.splitlines()[-1] == "failed: lint, fmt, test"


def test_check_on_an_unusable_folder_exits_2(cli, tmp_path):
    assert cli("check", str(tmp_path / "missing"))[0] == 2
    code, out, _ = cli("check", str(tmp_path))
    assert code == 2 and "no policy files" in out


def test_new_scaffolds_the_next_version_and_its_cases(cli, tmp_path):
    folder = _shipped_copy(tmp_path)
    code, out, err = cli("new", "2026.10.01", "--dir", str(folder))
    assert code == 0, err
    created = folder / "2026.10.01.toml"
    assert 'version = "2026.10.01"' in created.read_text()
    assert (folder / "2026.10.01.cases.toml").read_text() == (folder / "2026.09.10.cases.toml").read_text()
    assert cli("check", str(folder))[0] == 0
    code, _, err = cli("new", "2026.10.01", "--dir", str(folder))
    assert code == 2 and "is not after the newest version" in err
    assert "is not a date" in cli("new", "2026.13.01", "--dir", str(folder))[2]
    assert "is not a version" in cli("new", "v2", "--dir", str(folder))[2]
