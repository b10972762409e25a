"""``kvpolicy upstream check``: exit codes 0 / 1 / 2 and the text, JSON, GitHub and SARIF reports."""

from __future__ import annotations

import json

import pytest

from kvpolicy.upstream.drift import KINDS

from . import trees
from .trees import MODELS, POLICIES, cli, tree_matching

CHECK = ("upstream", "check")


def test_no_drift_exits_0(baselined, capsys):
    code, out, err = cli(capsys, *CHECK, baselined.root, "--policy", baselined.folder, "--version", "2026.10.22")
    assert code == 0, out
    facts = trees.facts_of(baselined.root)
    assert "against 2026.10.22 (--version)" in out
    assert f"{len(facts.architectures)} architectures, {len(facts.logic)} rule-bearing functions read" in out
    assert "no drift: every row, field, checkpoint rule, environment name and fingerprint of 2026.10.22 matches the tree" in out
    assert err == ""


def test_drift_exits_1_with_one_line_per_item_and_a_summary(matching, capsys):
    code, out, err = cli(capsys, *CHECK, matching, "--policy", POLICIES, "--version", "2026.10.22")
    assert code == 1
    lines = out.splitlines()
    assert lines[1].startswith("UPS050 no-baseline: version 2026.10.22 records no [upstream] baseline")
    assert lines[-1] == "drift: 1 (1 no-baseline); 0 can be drafted (kvpolicy upstream draft), the rest need a person"


def test_text_items_name_their_upstream_file_and_line(tmp_path, shipped_policy, capsys):
    root = tree_matching(shipped_policy, tmp_path, edit={"LlamaForCausalLM": ("CPP", "V2")})
    code, out, _ = cli(capsys, *CHECK, root, "--policy", POLICIES, "--version", "2026.10.22")
    [item] = [line for line in out.splitlines() if line.startswith("UPS003")]
    where = trees.facts_of(root).architectures["LlamaForCausalLM"].hooks["transceiver_runtime"].where
    assert item.startswith("UPS003 row-changed: LlamaForCausalLM: the version says PYTHON, the tree CPP") and item.endswith(f"[{where}]")
    assert where.file.startswith(MODELS)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{missing}"], "no such folder; pass the root of a TensorRT-LLM checkout"),
        (["{file}"], "not a folder"),
        (["{empty}"], "not a TensorRT-LLM tree (no tensorrt_llm/ package folder in it)"),
        (["{tree}", "--version", "1999.01.01"], "1999.01.01"),
        (["{tree}", "--policy", "{missing}"], "{missing}"),
        (["{tree}", "--installed"], "give TREE or --installed, not both"),
        ([], "name a TensorRT-LLM tree (TREE), or pass --installed"),
    ],
    ids=["missing", "file", "no-package", "unknown-version", "unknown-policy-folder", "tree-and-installed", "no-tree"],
)
def test_bad_input_exits_2_with_a_clear_message(tmp_path, matching, capsys, argv, message):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    names = {"missing": tmp_path / "missing", "file": tmp_path / "file.txt", "empty": tmp_path / "empty", "tree": matching}
    code, out, err = cli(capsys, *CHECK, *[a.format(**names) for a in argv])
    assert code == 2
    assert err.startswith("kvpolicy: error: ") and message.format(**names) in err
    assert out == ""


def test_json_lists_every_item_with_its_code_and_kind(tmp_path, shipped_policy, capsys):
    root = tree_matching(shipped_policy, tmp_path, edit={"NovelForCausalLM": ("PYTHON", None)}, runtime_default="auto")
    code, out, err = cli(capsys, *CHECK, root, "--policy", POLICIES, "--version", "2026.10.22", "--format", "json")
    assert code == 1
    body = json.loads(out)
    assert (body["version"], body["tree_kind"], body["chosen_by"]) == ("2026.10.22", "directory", "--version")
    facts = trees.facts_of(root)
    assert body["read"] == {"files": facts.files_read, "architectures": len(facts.architectures), "functions": len(facts.logic), "environment": len(facts.env)}
    assert [(d["code"], d["kind"]) for d in body["drift"]] == [("UPS001", "row-missing"), ("UPS013", "field-default"), ("UPS050", "no-baseline")]
    missing = body["drift"][0]
    assert (missing["architecture"], missing["decision"], missing["new"], missing["draftable"]) == ("NovelForCausalLM", "transceiver_runtime", "PYTHON", True)
    assert missing["upstream"]["file"].startswith(MODELS) and missing["upstream"]["line"] > 0
    assert err.strip() == "kvpolicy upstream: 3 drift against 2026.10.22"


def test_github_annotations_sit_on_the_policy_file(tmp_path, shipped_policy, capsys):
    root = tree_matching(shipped_policy, tmp_path, edit={"LlamaForCausalLM": ("CPP", "V2")})
    code, out, _ = cli(capsys, *CHECK, root, "--policy", POLICIES, "--version", "2026.10.22", "--format", "github")
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 2 and all(line.startswith("::error file=") for line in lines)
    changed = next(line for line in lines if "UPS003" in line)
    row_line = trees.line(POLICIES, "2026.10.22.toml", 'architecture = "LlamaForCausalLM", value = "PYTHON"')
    assert f",line={row_line},title=UPS003 row-changed::" in changed
    assert "2026.10.22.toml" in changed.split(",")[0]


def test_sarif_is_version_2_1_0_with_a_rule_per_kind(tmp_path, shipped_policy, capsys):
    root = tree_matching(shipped_policy, tmp_path, edit={"LlamaForCausalLM": ("CPP", "V2")})
    code, out, _ = cli(capsys, *CHECK, root, "--policy", POLICIES, "--version", "2026.10.22", "--format", "sarif")
    assert code == 1
    log = json.loads(out)
    assert log["version"] == "2.1.0"
    [run] = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [code for code, _, _ in KINDS.values()]
    assert [r["name"] for r in rules] == list(KINDS)
    results = run["results"]
    assert sorted(r["ruleId"] for r in results) == ["UPS003", "UPS050"]
    for result in results:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
    changed = next(r for r in results if r["ruleId"] == "UPS003")
    related = changed["relatedLocations"][0]["physicalLocation"]
    assert related["artifactLocation"]["uri"].endswith(".py") and related["region"]["startLine"] > 0
    assert changed["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("2026.10.22.toml")


def test_output_file_gets_the_report_and_stderr_the_summary(matching, tmp_path, capsys):
    target = tmp_path / "report.sarif"
    code, out, err = cli(capsys, *CHECK, matching, "--policy", POLICIES, "--version", "2026.10.22", "--format", "sarif", "-o", target)
    assert code == 1 and out == ""
    assert json.loads(target.read_text())["version"] == "2.1.0"
    assert err.strip() == "kvpolicy upstream: 1 drift against 2026.10.22"


def test_without_version_the_tree_release_picks_the_version(tmp_path, shipped_policy, capsys):
    root = tree_matching(shipped_policy, tmp_path, extra={"tensorrt_llm/version.py": '__version__ = "1.4.0rc1"\n'})
    code, out, _ = cli(capsys, *CHECK, root, "--policy", POLICIES, "--format", "json")
    body = json.loads(out)
    assert (body["release"], body["version"], body["chosen_by"]) == ("1.4.0rc1", "2026.10.22", "TensorRT-LLM 1.4.0rc1 maps to it")


def test_without_version_or_release_the_newest_is_chosen(baselined, capsys):
    code, out, _ = cli(capsys, *CHECK, baselined.root, "--policy", baselined.folder, "--format", "json")
    body = json.loads(out)
    assert code == 0 and (body["version"], body["chosen_by"], body["drift"]) == ("2026.10.22", "the newest: the tree names no release", [])


def test_a_release_the_table_does_not_know_falls_back_to_the_newest(tmp_path, shipped_policy, capsys):
    root = tree_matching(shipped_policy, tmp_path, extra={"tensorrt_llm/version.py": '__version__ = "0.1.0"\n'})
    code, out, _ = cli(capsys, *CHECK, root, "--policy", POLICIES, "--format", "json")
    assert json.loads(out)["chosen_by"].startswith("the newest: TensorRT-LLM 0.1.0 maps to no version")


def test_a_checkout_reports_its_kind(tmp_path, shipped_policy, capsys):
    root = tree_matching(shipped_policy, tmp_path)
    (root / ".git").mkdir()
    code, out, _ = cli(capsys, *CHECK, root, "--policy", POLICIES, "--version", "2026.10.22", "--format", "json")
    assert json.loads(out)["tree_kind"] == "checkout"


def test_the_installed_console_script_runs_check(matching):
    """The venv's ``kvpolicy`` entry point, as CI runs it (one subprocess; the rest run in-process)."""
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("kvpolicy")
    if not exe.is_file():
        pytest.skip("no kvpolicy console script beside this interpreter")
    result = subprocess.run(
        [str(exe), "upstream", "check", str(matching), "--policy", str(POLICIES), "--version", "2026.10.22", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert [d["code"] for d in json.loads(result.stdout)["drift"]] == ["UPS050"]
