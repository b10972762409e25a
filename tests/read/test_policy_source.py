"""Which policies a command uses (kvpolicy.read.policyroot): --policy, else [tool.kvpolicy] policies,
else ./policies, else the shipped history; every command agrees and says which on its first line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import kvpolicy
from kvpolicy.cli import main
from kvpolicy.errors import PolicyError
from kvpolicy.lint.runner import LintUsageError, find_config
from kvpolicy.read.policyfile import shipped_root
from kvpolicy.read.policyroot import PolicySource, policy_source

SHIPPED = Path(__file__).resolve().parents[2] / "policies"
OLDER, NEWER = "2026.09.02", "2026.09.10"
SHIPPED_LINE = f"policies: shipped with kvpolicy {kvpolicy.__version__}"
FOUND_LINE = "policies: ./policies (found in the working directory)"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def first_line(text: str) -> str:
    return text.splitlines()[0]


def copy_versions(folder: Path, *versions: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for version in versions:
        shutil.copy(SHIPPED / f"{version}.toml", folder / f"{version}.toml")
    return folder


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A user's repository: ./policies with two shipped versions, a pyproject.toml without
    [tool.kvpolicy] (it also stops the search for one above the temporary folder)."""
    root = tmp_path / "repo"
    copy_versions(root / "policies", OLDER, NEWER)
    (root / "pyproject.toml").write_text('[project]\nname = "serving"\n')
    monkeypatch.chdir(root)
    return root


def configure(root: Path, value: str) -> Path:
    config = root / "pyproject.toml"
    config.write_text(f'[project]\nname = "serving"\n\n[tool.kvpolicy]\nfail-level = "error"\npolicies = {value}\n')
    return config


# -- the order --------------------------------------------------------------------------------------


def test_a_new_version_is_seen_by_every_command(repo, capsys):
    code, out, err = run(capsys, "new", "2026.10.01")
    assert code == 0, err
    assert first_line(out) == FOUND_LINE
    assert (repo / "policies" / "2026.10.01.toml").is_file()

    code, out, err = run(capsys, "versions")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == FOUND_LINE
    assert [line[2:].split()[0] for line in lines[1:4]] == [OLDER, NEWER, "2026.10.01"]
    assert lines[3].startswith("* 2026.10.01")  # the default

    code, out, err = run(capsys, "diff", NEWER, "2026.10.01")
    assert code == 0, err
    assert out.splitlines()[:2] == [FOUND_LINE, f"kvpolicy diff {NEWER} -> 2026.10.01: no change"]

    code, out, err = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL")
    assert code == 0, err
    assert out.splitlines()[0] == FOUND_LINE
    assert out.splitlines()[1].startswith("policy 2026.10.01 ")

    code, out, err = run(capsys, "report", "-o", "page.html")
    assert code == 0, err
    assert out.splitlines()[0] == FOUND_LINE
    assert f"report {NEWER} -> 2026.10.01: wrote page.html" in out.splitlines()[1]


def test_json_names_the_policies_where_the_output_is_an_object(repo, capsys):
    want = {"path": "./policies", "origin": "working-directory"}
    for argv in (
        ["resolve", "--arch", "LlamaForCausalLM", "--format", "json"],
        ["table", "--format", "json"],
        ["diff", OLDER, NEWER, "--format", "json"],
    ):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert json.loads(out)["policies"] == want, argv
    code, out, _ = run(capsys, "versions", "--format", "json")
    assert isinstance(json.loads(out), list)  # a list stays a list: scripts index it
    assert [v["version"] for v in json.loads(out)] == [OLDER, NEWER]


def test_the_pyproject_key_wins_over_the_policies_folder(repo, capsys):
    copy_versions(repo / "mypol", OLDER)
    configure(repo, '"mypol"')
    code, out, err = run(capsys, "versions")
    assert code == 0, err
    assert first_line(out) == "policies: ./mypol ([tool.kvpolicy] policies in ./pyproject.toml)"
    assert out.splitlines()[1].startswith(f"* {OLDER}")
    code, out, _ = run(capsys, "table", "--format", "json")
    assert json.loads(out)["policies"] == {"path": "./mypol", "origin": "pyproject"}
    # From a folder below: the nearest pyproject.toml upwards, its path relative to that file.
    (repo / "sub").mkdir()
    (repo / "sub" / "policies").mkdir()  # ./policies of the subfolder does not count: the key wins
    copy_versions(repo / "sub" / "policies", NEWER)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(repo / "sub")
        code, out, err = run(capsys, "diff", OLDER, OLDER)
    assert code == 0, err
    assert first_line(out) == "policies: ../mypol ([tool.kvpolicy] policies in ../pyproject.toml)"


def test_the_pyproject_key_is_the_default_of_the_authoring_commands(repo, capsys):
    copy_versions(repo / "mypol", OLDER)
    configure(repo, '"mypol"')
    code, out, err = run(capsys, "new", "2026.10.01")
    assert code == 0, err
    assert first_line(out) == "policies: ./mypol ([tool.kvpolicy] policies in ./pyproject.toml)"
    assert (repo / "mypol" / "2026.10.01.toml").is_file() and not (repo / "policies" / "2026.10.01.toml").exists()
    code, out, _ = run(capsys, "lint", "--format", "json")
    assert json.loads(out)["policies"] == {"path": "./mypol", "origin": "pyproject"}
    assert json.loads(out)["summary"]["files"] == 2
    code, out, _ = run(capsys, "test")
    assert first_line(out).startswith("policies: ./mypol ")


def test_the_policy_option_wins_over_both(repo, capsys):
    copy_versions(repo / "mypol", OLDER)
    copy_versions(repo / "other", NEWER)
    configure(repo, '"mypol"')
    code, out, err = run(capsys, "versions", "--policy", "other")
    assert code == 0, err
    assert first_line(out) == "policies: other (--policy)"
    assert out.splitlines()[1].startswith(f"* {NEWER}")
    code, out, err = run(capsys, "diff", "--policy", "other", NEWER, NEWER, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["policies"] == {"path": "other", "origin": "--policy"}
    code, _, err = run(capsys, "diff", "--policy", "other", OLDER, NEWER)
    assert code == 2 and f"no policy version {OLDER}" in err


@pytest.mark.parametrize(
    ("value", "fragment"),
    [('"missing"', "no such folder"), ('"pyproject.toml"', "is not a folder"), ("3", "must name a folder"), ('""', "must name a folder")],
)
@pytest.mark.parametrize("argv", [["versions"], ["diff", OLDER, NEWER], ["resolve"], ["lint"], ["new", "2026.10.01"]])
def test_a_bad_configured_folder_exits_2_naming_the_file_and_key(repo, capsys, value, fragment, argv):
    configure(repo, value)
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert "./pyproject.toml:6:1: config: [tool.kvpolicy] policies" in err and fragment in err
    assert "Traceback" not in err


def test_an_empty_policies_folder_falls_back_to_the_shipped_history_and_says_so(repo, capsys):
    for path in (repo / "policies").iterdir():
        path.unlink()
    (repo / "policies" / "notes.cases.toml").write_text("")  # test cases alone are no policies
    code, out, err = run(capsys, "versions")
    assert code == 0, err
    assert first_line(out) == f"{SHIPPED_LINE} (./policies holds no policy files)"
    assert kvpolicy.load().version in out
    code, _, err = run(capsys, "new", "2026.12.01")  # never writes into the installed package
    assert code == 2 and "./policies holds no policy files" in err and "--dir" in err


def test_no_folder_at_all_is_the_shipped_history(repo, capsys):
    shutil.rmtree(repo / "policies")
    code, out, err = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["policies"] == {"path": None, "origin": "shipped"}
    code, out, _ = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL")
    assert first_line(out) == SHIPPED_LINE


# -- the engine function ------------------------------------------------------------------------------


def test_policy_source_order(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert policy_source(start=tmp_path) == PolicySource(None, "shipped")
    copy_versions(tmp_path / "policies", OLDER)
    assert policy_source(start=tmp_path).origin == "working-directory"
    (tmp_path / "mypol").mkdir()
    configure(tmp_path, '"mypol"')
    found = policy_source(start=tmp_path)
    assert (found.path, found.origin, found.config) == (Path("mypol"), "pyproject", "./pyproject.toml")
    assert policy_source("elsewhere", start=tmp_path) == PolicySource(Path("elsewhere"), "--policy")


def test_the_pyproject_has_one_reader_and_lint_accepts_the_key(tmp_path):
    (tmp_path / "mypol").mkdir()
    config = configure(tmp_path, '"mypol"')
    assert find_config(tmp_path).source == str(config)  # not an unknown key
    # A pyproject.toml that cannot hold the table is not parsed to find the policies (a cold
    # `resolve` reads it on every run); lint, which judges the file, still reports it.
    config.write_text("[project\nname = 'broken'\n")
    assert policy_source(start=tmp_path) == PolicySource(None, "shipped")
    with pytest.raises(LintUsageError, match="cannot read"):
        find_config(tmp_path)
    config.write_text("[tool.kvpolicy\npolicies = 'mypol'\n")
    with pytest.raises(PolicyError, match="cannot read"):
        policy_source(start=tmp_path)


def test_another_tools_policies_folder_is_passed_over_with_a_note(tmp_path, monkeypatch, capsys):
    # A repository whose policies/ belongs to OPA or conftest: its TOML is not kvpolicy's.
    from kvpolicy.cli import main

    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "authz.toml").write_text('package = "authz"\n\n[rules]\nallow = true\n')
    monkeypatch.chdir(tmp_path)
    assert main(["resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL", "--runtime", "auto"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("policies: shipped with kvpolicy") and "not kvpolicy policies" in out
    assert "--policy or [tool.kvpolicy] policies" in out
    assert main(["lint"]) == 2  # never linted (or formatted) as if it were ours
    assert "not kvpolicy policies" in capsys.readouterr().err
    # A kvpolicy policy beside them makes the folder ours: the foreign file is then an error, located.
    (tmp_path / "policies" / "2026.09.28.toml").write_bytes((shipped_root() / "2026.09.28.toml").read_bytes())
    assert main(["resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL", "--runtime", "auto"]) == 2
    assert "authz.toml" in capsys.readouterr().err
