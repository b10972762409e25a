"""``kvpolicy impact``: real configs under two versions, malformed input reported per file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.analyse.impact import impact_of, load_architecture_map

from tests.support import golden
from tests.support.constants import REPO

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    """Compare with the golden file NAME beside this module; ``KVPOLICY_UPDATE_GOLDEN=1`` rewrites it."""
    golden.check_golden(GOLDEN / name, text)


EXAMPLES = "examples/configs"
ARCH_MAP = "examples/configs/arch-map.yaml"

DISAGG = """\
model: {model}
backend: pytorch
context_servers:
  num_instances: 1
  cache_transceiver_config:
    backend: {ctx_backend}
generation_servers:
  num_instances: 1
  cache_transceiver_config:
    backend: {gen_backend}
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def in_repo(monkeypatch) -> Path:
    monkeypatch.chdir(REPO)
    return REPO


def test_examples_golden(capsys, in_repo) -> None:
    code, out, _ = run(capsys, "impact", "--configs", EXAMPLES, "--from", "2026.08.11", "--to", "2026.08.24", "--arch-map", ARCH_MAP)
    assert code == 1  # the UCX metrics config starts failing
    check_golden("impact_examples_2026.08.11_2026.08.24.txt", out)


def test_examples_github(capsys, in_repo) -> None:
    code, out, _ = run(
        capsys, "impact", "--configs", EXAMPLES, "--from", "2026.08.11", "--to", "2026.08.24", "--arch-map", ARCH_MAP,
        "--format", "github",
    )
    assert code == 1
    check_golden("impact_examples_github.txt", out)
    assert "::error file=examples/configs/disaggregated/llama-3.1-8b-ucx-metrics.yaml,line=10::" in out


def test_examples_json(capsys, in_repo) -> None:
    code, out, _ = run(
        capsys, "impact", "--configs", EXAMPLES, "--from", "2026.08.11", "--to", "2026.08.24", "--arch-map", ARCH_MAP,
        "--format", "json", "--fail-on", "never",
    )
    assert code == 0
    data = json.loads(out)
    by_path = {c["path"]: c for c in data["configs"]}
    llama = by_path["examples/configs/disaggregated/llama-3.1-8b-ucx-metrics.yaml"]
    assert llama["status"] == "starts failing"
    assert [s["new"]["values"]["transceiver_runtime"] for s in llama["sections"]] == ["PYTHON", "PYTHON"]
    assert "examples/configs/single/llm-api-options.yaml" in data["skipped"]
    assert by_path["examples/configs/single/mistral-7b-context.yaml"]["architecture"] is None


def test_fail_on_change(capsys, in_repo) -> None:
    # Kimi K2.5's PYTHON preference arrives with 2026.07.21: the runtime changes, nothing fails.
    argv = ("impact", "--configs", "examples/configs/disaggregated/kimi-k2.5-nixl.json", "--from", "2026.07.20",
            "--to", "2026.07.21", "--arch-map", ARCH_MAP)
    assert run(capsys, *argv)[0] == 0
    assert run(capsys, *argv, "--fail-on", "change")[0] == 1


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_malformed_configs_are_reported_per_file_and_do_not_stop_the_report(tmp_path, shipped) -> None:
    write(tmp_path, "a-bad-yaml.yaml", "model: x\ncontext_servers:\n  cache_transceiver_config: {backend: NIXL\n")
    write(tmp_path, "b-wrong-type.yaml", "cache_transceiver_config:\n  backend: NIXL\n  kv_transfer_timeout_ms: soon\n")
    write(tmp_path, "c-unknown-backend.yaml", DISAGG.format(model="m", ctx_backend="NIXX", gen_backend="NIXL"))
    write(tmp_path, "d-not-a-mapping.yaml", "context_servers:\n  - cache_transceiver_config: {}\n")
    write(tmp_path, "e-bad.json", '{"cache_transceiver_config": {"backend": "NIXL",}}')
    write(tmp_path, "f-good.yaml", DISAGG.format(model="m", ctx_backend="NIXL", gen_backend="NIXL"))
    write(tmp_path, "g-list-config.yaml", "cache_transceiver_config: [NIXL]\n")
    results = {Path(r.path).name: r for r in impact_of([tmp_path], shipped["2026.08.11"], shipped["2026.08.24"])}
    problems = {name: [str(p) for p in r.problems] for name, r in results.items()}
    bad_yaml = problems["a-bad-yaml.yaml"][0]
    assert bad_yaml.endswith("invalid YAML: expected ',' or '}', but got '<stream end>'") or "a-bad-yaml.yaml:4" in bad_yaml
    assert problems["a-bad-yaml.yaml"][0].startswith(str(tmp_path / "a-bad-yaml.yaml") + ":")
    assert problems["b-wrong-type.yaml"] == [
        f"{tmp_path / 'b-wrong-type.yaml'}:3: cache_transceiver_config: kv_transfer_timeout_ms: "
        "expected a positive number of milliseconds or null, got 'soon'"
    ]
    (unknown,) = problems["c-unknown-backend.yaml"]
    assert unknown.startswith(f"{tmp_path / 'c-unknown-backend.yaml'}:6: context_servers/cache_transceiver_config: backend:")
    assert "'NIXX'" in unknown and "NIXL" in unknown
    # The good side of the file with a bad side is still resolved.
    assert [s.name for s in results["c-unknown-backend.yaml"].sections] == ["generation_servers"]
    assert "context_servers: expected a mapping, got a list" in problems["d-not-a-mapping.yaml"][0]
    assert problems["e-bad.json"][0].startswith(f"{tmp_path / 'e-bad.json'}:1:")
    assert "cache_transceiver_config: expected a mapping, got a list" in problems["g-list-config.yaml"][0]
    # Its model "m" is unknown: PYTHON by default (#18134) changes the runtime for a model without a
    # preference, not for one that preferred PYTHON already. The status says it depends.
    good = results["f-good.yaml"]
    assert good.status == "architecture unknown" and not good.problems and not good.architecture_known
    statuses = dict(good.possibilities)
    assert "any other architecture" in statuses["runtime changes"] and "GptOssForCausalLM" in statuses["unchanged"]
    assert all(results[n].status == "malformed" for n in problems if problems[n])


def test_malformed_text_report_keeps_going(capsys, tmp_path) -> None:
    write(tmp_path, "bad.yaml", "cache_transceiver_config: {backend: [\n")
    write(tmp_path, "good.yaml", "cache_transceiver_config: {backend: NIXL}\n")
    code, out, _ = run(capsys, "impact", "--configs", str(tmp_path), "--from", "2026.08.11", "--to", "2026.08.24")
    assert code == 0 and "gate: passes (exit 0); 1 config malformed under both versions, not caused by the edit" in out
    assert f"{tmp_path / 'bad.yaml'}:2:1: error: invalid YAML" in out
    assert "good.yaml" in out and "runtime changes" in out


def test_architecture_from_models_root(tmp_path, shipped) -> None:
    root = tmp_path / "models"
    write(root, "glm/GLM-5/config.json", json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "glm_moe_dsa"}))
    config = write(tmp_path / "configs", "glm.yaml", DISAGG.format(model="${LLM_MODELS_ROOT}/glm/GLM-5", ctx_backend="NIXL", gen_backend="NIXL"))
    (result,) = impact_of([config], shipped["2026.07.23"], shipped["2026.09.10"], models_root=root)
    assert result.architecture == "DeepseekV3ForCausalLM" and result.model_type == "glm_moe_dsa"
    assert result.architecture_source.startswith("config.json")
    # GLM checkpoints preferred PYTHON through the model_type-qualified row (#16524); later every DeepSeek-V3.
    assert [s.old.resolution.decided_by["transceiver_runtime"] for s in result.sections] == [
        "runtime-preference[DeepseekV3ForCausalLM,model_type=glm_moe_dsa]"
    ] * 2
    # Without the models root, the arch map decides; without either, the architecture is unknown.
    arch_map = load_architecture_map(write(tmp_path, "map.yaml", '"*GLM-5*": {architecture: GlmMoeDsaForCausalLM}\n'))
    (mapped,) = impact_of([config], shipped["2026.08.11"], shipped["2026.09.10"], architecture_map=arch_map)
    assert mapped.architecture == "GlmMoeDsaForCausalLM"
    assert mapped.architecture_source == f"arch-map ({tmp_path / 'map.yaml'} (*GLM-5*))"
    (unknown,) = impact_of([config], shipped["2026.08.11"], shipped["2026.09.10"])
    assert unknown.architecture is None


def test_sides_that_disagree_are_an_error(tmp_path, shipped) -> None:
    config = write(tmp_path, "split.yaml", DISAGG.format(model="Llama-3.1-8B", ctx_backend="NIXL", gen_backend="UCX"))
    arch_map = load_architecture_map(write(tmp_path, "map.json", '{"*Llama-3.1-8B*": "LlamaForCausalLM"}'))
    results = impact_of([tmp_path], shipped["2026.07.09"], shipped["2026.08.11"], architecture_map=arch_map)
    (result,) = [r for r in results if r.path == str(config)]
    assert result.mismatch_old is not None and "backend NIXL vs UCX" in result.mismatch_old
    assert "runtime PYTHON vs CPP" in (result.mismatch_new or "")
    assert result.status == "fails differently"


def test_env_and_features_are_read(tmp_path, shipped) -> None:
    text = (
        "env: {TRTLLM_USE_UCX_KVCACHE: 1}\n"
        "kvpolicy_features: [serialized_state]\n"
        "cache_transceiver_config: {backend: DEFAULT}\n"
    )
    config = write(tmp_path, "env.yaml", text)
    (result,) = impact_of([config], shipped["2026.08.24"], shipped["2026.09.10"])
    (section,) = result.sections
    assert section.new.resolution.backend == "UCX"
    assert "serialized_state" in section.new.resolution.context["features"]
    assert section.new.resolution.decided_by["transceiver_runtime"] == "auto-cpp-off-nixl"


def test_unknown_policy_and_arch_map_are_usage_errors(capsys, tmp_path) -> None:
    code, _, err = run(capsys, "impact", "--configs", str(tmp_path), "--from", "1999.01.01", "--to", "2026.08.24")
    assert code == 2 and "--from" in err
    bad = write(tmp_path, "map.yaml", "- just a list\n")
    code, _, err = run(capsys, "impact", "--configs", str(tmp_path), "--from", "2026.08.11", "--to", "2026.08.24", "--arch-map", str(bad))
    assert code == 2 and "--arch-map" in err


def test_missing_configs_are_a_usage_error(capsys, tmp_path) -> None:
    code, _, err = run(capsys, "impact", "--configs", str(tmp_path / "nope"), "--from", "2026.08.11", "--to", "2026.08.24")
    assert code == 2 and "no such file or folder" in err


def test_parallel_sizes_are_in_json(capsys, in_repo) -> None:
    code, out, _ = run(capsys, "impact", "--configs", "examples/configs/disaggregated/gemma-3-1b-nixl.yaml",
                       "--from", "2026.08.11", "--to", "2026.08.24", "--format", "json")
    assert code == 0
    (config,) = json.loads(out)["configs"]
    assert [s["parallel"]["tensor_parallel_size"] for s in config["sections"]] == [2, 1]


def test_a_null_transceiver_config_means_disaggregation_off(tmp_path, shipped) -> None:
    config = write(tmp_path, "off.yaml", "cache_transceiver_config: null\n")
    (result,) = impact_of([config], shipped["2026.08.11"], shipped["2026.08.24"])
    (section,) = result.sections
    assert section.old.short() == section.new.short() == "off" and result.status == "unchanged"


def test_a_config_only_the_new_version_rejects_starts_failing_and_the_other_way_stops_failing(capsys, tmp_path) -> None:
    # Llama on UCX: 2026.08.11 adopts its PYTHON preference only on NIXL (CPP here, starts);
    # 2026.08.24 adopts it verbatim (PYTHON on UCX, python-requires-nixl: cannot start).
    config = write(tmp_path, "llama-ucx.yaml", DISAGG.format(model="Llama-3.1-8B", ctx_backend="UCX", gen_backend="UCX"))
    arch_map = write(tmp_path, "map.yaml", '"*Llama-3.1-8B*": {architecture: LlamaForCausalLM}\n')
    common = ("impact", "--configs", str(config), "--arch-map", str(arch_map), "--format", "json")

    code, out, _ = run(capsys, *common, "--from", "2026.08.11", "--to", "2026.08.24")
    (report,) = json.loads(out)["configs"]
    assert report["status"] == "starts failing" and code == 1
    assert {s["status"] for s in report["sections"]} == {"starts failing"}
    for section in report["sections"]:
        assert section["old"]["values"]["transceiver_runtime"] == "CPP" and section["old"]["ok"] is True
        assert section["new"]["values"]["transceiver_runtime"] == "PYTHON" and section["new"]["ok"] is False

    code, out, _ = run(capsys, *common, "--from", "2026.08.24", "--to", "2026.08.11")
    (report,) = json.loads(out)["configs"]
    assert report["status"] == "stops failing" and code == 0
    assert {s["status"] for s in report["sections"]} == {"stops failing"}


def test_output_files_in_several_formats_from_one_run(capsys, in_repo, tmp_path) -> None:
    """-o FILE takes the --format report; -o FORMAT=FILE writes others from the same run (as lint)."""
    sarif, text = tmp_path / "impact.sarif", tmp_path / "impact.txt"
    code, out, err = run(
        capsys, "impact", "--configs", EXAMPLES, "--from", "2026.08.11", "--to", "2026.08.24", "--arch-map", ARCH_MAP,
        "--format", "github", "-o", f"sarif={sarif}", "-o", f"text={text}",
    )
    assert code == 1
    assert out.startswith("::error file=examples/configs/disaggregated/llama-3.1-8b-ucx-metrics.yaml,line=10::")
    document = json.loads(sarif.read_text())
    rules = document["runs"][0]["tool"]["driver"]["rules"]
    assert all(rule["helpUri"].endswith("diff-impact/#what-each-status-means") for rule in rules)
    assert text.read_text().splitlines()[-1] == "gate: fails (exit 1) on 1 config starts failing (--fail-on failing)"
    assert "gate: fails" in err
    code, out, err = run(capsys, "impact", "--configs", EXAMPLES, "--from", "2026.08.11", "--to", "2026.08.24", "-o", "a", "-o", "b")
    assert code == 2 and "already goes to a" in err


def test_github_annotations_stay_within_what_github_shows(capsys, tmp_path, monkeypatch) -> None:
    """GitHub shows 10 annotations of a level per step: with 14 configs starting to fail, nine are
    annotated (in file order), one says how many more, and the step summary gets every one."""
    from kvpolicy.analyse.impactreport import GITHUB_PER_LEVEL

    configs = tmp_path / "configs"
    configs.mkdir()
    for n in range(14):
        (configs / f"c{n:02d}.yaml").write_text(DISAGG.format(model="/m", ctx_backend="UCX", gen_backend="UCX"))
    arch_map = tmp_path / "map.yaml"
    arch_map.write_text('"*": LlamaForCausalLM\n')
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, _ = run(
        capsys, "impact", "--configs", str(configs), "--from", "2026.08.11", "--to", "2026.08.24", "--arch-map", str(arch_map),
        "--format", "github",
    )
    assert code == 1
    errors = [line for line in out.splitlines() if line.startswith("::error")]
    assert len(errors) == GITHUB_PER_LEVEL == 10
    assert errors[-1].endswith(f"{28 - 9} more errors than GitHub shows; every one is in the step summary")  # two sides each
    assert "c00.yaml" in errors[0]
    table = summary.read_text()
    assert table.count("| error |") == 28 and "c13.yaml" in table


def test_counts_read_as_nouns_after_one_and_many() -> None:
    """Issue 35: "1 runtime changes" read as a plural after one; what changed reads as a noun."""
    from types import SimpleNamespace

    from kvpolicy.analyse.impactreport import _counts

    def results(*statuses):
        return [SimpleNamespace(status=s, skipped=None) for s in statuses]

    assert _counts(results("runtime changes", "changes", "new warning", "unchanged")) == (
        "1 runtime change, 1 change, 1 new warning, 1 unchanged"
    )
    assert _counts(results("runtime changes", "runtime changes", "backend changes", "starts failing")) == (
        "1 starts failing, 2 runtime changes, 1 backend change"
    )
