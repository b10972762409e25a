"""``kvpolicy diff``: golden text, JSON for scripts, exit codes; a one-row edit reads as one."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from kvpolicy.cli import main
from kvpolicy.read.loader import shipped_root

from tests.support import golden
from tests.support.constants import REPO

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    """Compare with the golden file NAME beside this module; ``KVPOLICY_UPDATE_GOLDEN=1`` rewrites it."""
    golden.check_golden(GOLDEN / name, text)


GPT_OSS_ROW = '{ architecture = "GptOssForCausalLM", value = "PYTHON"'
#: A constraint both sides carry that reads two more environment variables: the same edit then
#: touches several times more contexts (every changed context exists with each of their values).
WIDER_DOMAIN = """
[[constraints]]
id = "test-wider-domain"
severity = "warning"
when = { backend = "UCX", env = { KVPOLICY_TEST_A = "1", KVPOLICY_TEST_B = "2" } }
message = "a constraint that only widens the domain"
fix = "nothing"
"""


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


def _resolve(policy_set, ctx):
    fields = {k: v for k, v in ctx.items() if k not in ("any", "group", "subgroup", "model_type")}
    fields["features"] = set(fields["features"])
    if ctx["model_type"]:
        fields["pretrained_config"] = {"architectures": [fields.pop("architecture")], "model_type": ctx["model_type"]}
    return policy_set.resolve(**fields)


def test_json_lists_contexts_only_on_request_and_each_resolves_as_its_subgroup_says(capsys, shipped) -> None:
    code, out, _ = run(capsys, "diff", "2026.07.09", "2026.08.11", "--format", "json")
    assert code == 0
    plain = json.loads(out)
    assert "contexts" not in plain and "subgroups" not in plain
    code, out, _ = run(capsys, "diff", "2026.07.09", "2026.08.11", "--format", "json", "--contexts")
    assert code == 0
    data = json.loads(out)
    assert data["old"]["version"] == "2026.07.09" and data["new"]["version"] == "2026.08.11"
    assert [g["count"] for g in data["groups"]] == [g["count"] for g in plain["groups"]]
    assert data["changed"] == sum(g["count"] for g in data["groups"]) == sum(s["count"] for s in data["subgroups"])
    groups = {g["group"]: g for g in data["groups"]}
    subgroups = {s["subgroup"]: s for s in data["subgroups"]}
    for number, subgroup in subgroups.items():
        assert number in groups[subgroup["group"]]["subgroups"]
    contexts = data["contexts"]
    assert contexts and {c["subgroup"] for c in contexts} == set(subgroups)
    # Every listed context (all of them, not a sample) resolves under both versions exactly as its
    # sub-group says: the decisions that change, from what to what, and the diagnostics that come and go.
    old, new = shipped["2026.07.09"], shipped["2026.08.11"]
    for ctx in contexts:
        change = subgroups[ctx["subgroup"]]["change"]
        assert subgroups[ctx["subgroup"]]["group"] == ctx["group"]
        before, after = _resolve(old, ctx), _resolve(new, ctx)
        changed = {d["decision"] for d in change["decisions"]}
        for d in change["decisions"]:
            assert (before.values[d["decision"]], after.values[d["decision"]]) == (d["old"], d["new"]), ctx
        for name, value in before.values.items():
            if name not in changed:
                assert after.values[name] == value and after.decided_by[name] == before.decided_by[name], ctx

        def keys(r):
            return Counter((d.id, d.severity, d.decision) for d in r.diagnostics)

        assert keys(after) - keys(before) == Counter((d["id"], d["severity"], d["decision"]) for d in change["diagnostics_added"]), ctx
        assert keys(before) - keys(after) == Counter((d["id"], d["severity"], d["decision"]) for d in change["diagnostics_removed"]), ctx


def _one_row_edit(folder: Path, extra: str = "") -> tuple[Path, Path]:
    """2026.09.10 and the same file with GPT-OSS's runtime preference row PYTHON -> CPP."""
    text = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8") + extra
    assert text.count(GPT_OSS_ROW) == 1
    folder.mkdir(parents=True)
    old, new = folder / "a.toml", folder / "b.toml"
    old.write_text(text, encoding="utf-8")
    new.write_text(text.replace(GPT_OSS_ROW, GPT_OSS_ROW.replace("PYTHON", "CPP")), encoding="utf-8")
    return old, new


def test_a_one_row_edit_names_the_row_and_its_values_first_in_a_handful_of_groups(capsys, tmp_path) -> None:
    old, new = _one_row_edit(tmp_path / "d")
    code, out, _ = run(capsys, "diff", str(old), str(new))
    assert code == 0
    lines = out.splitlines()
    assert "1 row changed" in lines[1]
    assert lines[2].startswith("the edit (what changed in the files): 1 row changed")
    assert re.match(r"  E1 ~ row runtime-preference\[GptOssForCausalLM\]: value PYTHON -> CPP \(.*b\.toml:117\)$", lines[3])
    assert lines[4].strip() == "reason: GPT-OSS prefers the Python transceiver."
    assert lines[5].strip().startswith("source: NVIDIA/TensorRT-LLM #16479")
    ways = [line for line in lines if re.match(r"\[\d+\] ", line)]
    declared = int(re.search(r"in (\d+) ways?$", lines[1]).group(1))
    assert len(ways) == declared and 1 <= declared <= 6, (declared, ways)
    # Every way names the row as its cause; none says a rule was replaced by itself.
    assert out.count("  from E1 (row runtime-preference[GptOssForCausalLM])") == len(ways)
    assert not re.search(r"decided by (\S+) instead of \1(\W|$)", out), out
    assert "transceiver_runtime PYTHON -> CPP (still decided by runtime-preference[GptOssForCausalLM], whose value changed)" in out

    code, out, _ = run(capsys, "diff", str(old), str(new), "--format", "json")
    data = json.loads(out)
    assert data["headline"] == lines[1]
    (change,) = data["edit"]["changes"]
    assert change["edit"] == "E1" and change["kind"] == "row" and change["id"] == "runtime-preference[GptOssForCausalLM]"
    assert change["fields"] == [{"field": "value", "old": "PYTHON", "new": "CPP"}]
    assert change["groups"] == [g["group"] for g in data["groups"]] and len(data["groups"]) == len(ways)
    assert all(g["edits"] == ["E1"] for g in data["groups"])


def test_json_grows_with_the_edit_not_with_the_contexts_it_touches(capsys, tmp_path) -> None:
    sizes, changed = [], []
    for name, extra in (("narrow", ""), ("wide", WIDER_DOMAIN)):
        old, new = _one_row_edit(tmp_path / name, extra)
        code, out, _ = run(capsys, "diff", str(old), str(new), "--format", "json")
        assert code == 0
        data = json.loads(out)
        sizes.append(len(json.dumps({k: v for k, v in data.items() if k not in ("policies", "old", "new", "total", "changed", "headline")})))
        changed.append(data["changed"])
    assert changed[1] >= 4 * changed[0]  # the same edit touches several times more contexts ...
    assert abs(sizes[1] - sizes[0]) < sizes[0] / 100  # ... and says the same about them (counts have more digits)
    assert sizes[0] < 32_000  # a few kilobytes, where every leaf made ~900 KB


def test_files_and_folders_are_accepted(capsys, tmp_path) -> None:
    from kvpolicy.read.loader import shipped_root

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
    assert "+ checkpoint rule kimi-k3-text-checkpoint: model_type kimi_k3 or kimi_linear loads as KimiLinearForCausalLM" in out
    code = main(["diff", "2026.08.03", "2026.08.07", "--format", "json", "--policy", str(REPO / "policies")])
    data = json.loads(capsys.readouterr().out)
    assert data["checkpoint_rules"] == [
        {"change": "+", "rule": "kimi-k3-text-checkpoint: model_type kimi_k3 or kimi_linear loads as KimiLinearForCausalLM"}
    ]


def test_a_diff_is_answered_from_the_cache_the_second_time(capsys, tmp_path, monkeypatch) -> None:
    """The diff of two files depends only on their bytes, their paths and kvpolicy's code: the second
    run reads the rendered result back (the README's example: seconds cold, ~0.1 s warm)."""
    from kvpolicy.analyse import diff as diff_module

    monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(tmp_path / "cache"))
    code, first, _ = run(capsys, "diff", "2026.09.10", "2026.09.15", "--exit-code")
    calls = []
    original = diff_module.diff_policies
    monkeypatch.setattr("kvpolicy.cli.diff.diff_policies", lambda *a, **k: calls.append(a) or original(*a, **k))
    again_code, again, _ = run(capsys, "diff", "2026.09.10", "2026.09.15", "--exit-code")
    assert (again_code, again) == (code, first) and code == 1
    assert calls == []  # not computed again
    code, as_json, _ = run(capsys, "diff", "2026.09.10", "2026.09.15", "--format", "json")
    assert json.loads(as_json)["edit"] and len(calls) == 1  # another format is another entry
