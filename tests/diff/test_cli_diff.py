"""``kvpolicy diff``: golden text, JSON for scripts, exit codes."""

from __future__ import annotations

import json

from kvpolicy.cli import main

from .conftest import REPO, check_golden


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_llama_gemma_flip_golden(capsys) -> None:
    code, out, _ = run(capsys, "diff", "2026.07.09", "2026.08.11")
    assert code == 0
    check_golden("diff_2026.07.09_2026.08.11.txt", out)


def test_python_by_default_golden(capsys) -> None:
    code, out, _ = run(capsys, "diff", "2026.08.11", "2026.08.24")
    assert code == 0
    check_golden("diff_2026.08.11_2026.08.24.txt", out)


def test_equal_versions_print_no_change(capsys) -> None:
    code, out, _ = run(capsys, "diff", "2026.07.09", "2026.07.09", "--exit-code")
    assert code == 0
    assert out.strip().splitlines() == [
        "policies: ./policies (found in the working directory)",
        "kvpolicy diff 2026.07.09 -> 2026.07.09: no change",
    ]


def test_exit_code_when_changed(capsys) -> None:
    # The smallest adjacent pair that changes (the golden above prints a larger one).
    assert run(capsys, "diff", "2026.07.09", "2026.07.20", "--exit-code")[0] == 1
    assert run(capsys, "diff", "2026.07.09", "2026.07.20")[0] == 0


def test_json_lists_contexts_of_every_group_and_each_of_them_changes(capsys, shipped) -> None:
    code, out, _ = run(capsys, "diff", "2026.07.09", "2026.08.11", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["old"]["version"] == "2026.07.09" and data["new"]["version"] == "2026.08.11"
    assert data["changed"] == sum(g["count"] for g in data["groups"])
    contexts = data["contexts"]
    assert contexts and {c["group"] for c in contexts} == {g["group"] for g in data["groups"]}
    # Every listed context (all of them, not a sample) really changes: resolve it under both versions.
    old, new = shipped["2026.07.09"], shipped["2026.08.11"]
    for ctx in contexts:
        fields = {k: v for k, v in ctx.items() if k not in ("any", "group", "model_type")}
        fields["features"] = set(fields["features"])
        if ctx["model_type"]:
            fields["pretrained_config"] = {"architectures": [fields.pop("architecture")], "model_type": ctx["model_type"]}
        before, after = old.resolve(**dict(fields)), new.resolve(**dict(fields))
        assert (dict(before.values), dict(before.decided_by), sorted(d.id for d in before.diagnostics)) != (
            dict(after.values), dict(after.decided_by), sorted(d.id for d in after.diagnostics)
        ), ctx


def test_files_and_folders_are_accepted(capsys, tmp_path) -> None:
    from kvpolicy.loader import shipped_root

    old = shipped_root() / "2026.07.09.toml"
    folder = tmp_path / "policies"
    folder.mkdir()
    for version in ("2026.07.09", "2026.07.20"):
        (folder / f"{version}.toml").write_bytes((shipped_root() / f"{version}.toml").read_bytes())
    code, out, _ = run(capsys, "diff", str(old), str(folder))  # a folder: its newest version
    assert code == 0 and "2026.07.09 -> 2026.07.20" in out
    code, out, _ = run(capsys, "diff", str(old), f"{shipped_root()}@2026.07.09")
    assert code == 0 and "no change" in out


def test_unknown_version_is_a_usage_error(capsys) -> None:
    code, _, err = run(capsys, "diff", "2026.01.01", "2026.08.11")
    assert code == 2
    assert "OLD:" in err and "2026.01.01" in err


def test_a_new_checkpoint_rule_is_part_of_the_diff(capsys) -> None:
    # 2026.08.07 reads kimi_k3 / kimi_linear checkpoints as KimiLinearForCausalLM (#17269); the
    # contexts the groups count are (architecture, model_type) as read, so the rule shows on its own.
    code = main(["diff", "2026.08.03", "2026.08.07", "--exit-code", "--policy", str(REPO / "policies")])
    out = capsys.readouterr().out
    assert code == 1
    assert "+ kimi-k3-text-checkpoint: model_type kimi_k3 or kimi_linear loads as KimiLinearForCausalLM" in out
    code = main(["diff", "2026.08.03", "2026.08.07", "--format", "json", "--policy", str(REPO / "policies")])
    data = json.loads(capsys.readouterr().out)
    assert data["checkpoint_rules"] == [
        {"change": "+", "rule": "kimi-k3-text-checkpoint: model_type kimi_k3 or kimi_linear loads as KimiLinearForCausalLM"}
    ]
