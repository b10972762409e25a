"""The model a serving config runs, found as TensorRT-LLM finds it, and no green light without it.

Every layout and every lookup rule has a model folder of its own (a ``config.json``), and each test
goes through the CLI a user runs (``kvpolicy resolve --config``, ``kvpolicy impact``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.serving.identity import ModelReference, find_model, model_reference

from tests.support.serving import DISAGG_UCX, VERSION, checkpoint, resolve_config

PERF_SANITY_UCX = """\
metadata:
  model_name: {name}
  model_dir_name: {folder}
worker_config:
  ctx:
    cache_transceiver_config:
      backend: UCX
  gen:
    cache_transceiver_config:
      backend: UCX
"""


@pytest.fixture(autouse=True)
def no_models_root(monkeypatch, tmp_path):
    monkeypatch.delenv("LLM_MODELS_ROOT", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.chdir(tmp_path)


def test_without_model_information_a_model_dependent_config_is_never_green(capsys, tmp_path):
    # DeepSeek prefers PYTHON, adopted verbatim: on UCX upstream refuses to start.
    config = tmp_path / "configs" / "ds.yaml"
    config.parent.mkdir()
    config.write_text(DISAGG_UCX.format(model="DeepSeek-V3-Lite/fp8"))
    code, out, _ = resolve_config(capsys, config)
    assert code == 3
    assert "can start" not in out
    assert "model: unknown (no config.json found for model 'DeepSeek-V3-Lite/fp8'" in out
    assert "depends on the model: cannot start for" in out and "DeepseekV3ForCausalLM" in out


def test_llm_models_root_finds_the_checkpoint(capsys, tmp_path, monkeypatch):
    root = tmp_path / "models"
    checkpoint(root / "DeepSeek-V3-Lite" / "fp8", "DeepseekV3ForCausalLM", "deepseek_v3")
    config = tmp_path / "configs" / "ds.yaml"
    config.parent.mkdir()
    config.write_text(DISAGG_UCX.format(model="DeepSeek-V3-Lite/fp8"))
    monkeypatch.setenv("LLM_MODELS_ROOT", str(root))
    code, out, _ = resolve_config(capsys, config)
    assert code == 1
    assert f"model: DeepseekV3ForCausalLM (model_type deepseek_v3), from config.json {root / 'DeepSeek-V3-Lite' / 'fp8' / 'config.json'}" in out
    assert "error[python-requires-nixl]" in out and "cannot start" in out


def test_models_root_option_wins_over_the_variable(capsys, tmp_path, monkeypatch):
    wrong, right = tmp_path / "wrong", tmp_path / "right"
    checkpoint(wrong / "m", "MistralForCausalLM")
    checkpoint(right / "m", "LlamaForCausalLM")
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="m"))
    monkeypatch.setenv("LLM_MODELS_ROOT", str(wrong))
    code, out, _ = resolve_config(capsys, config, "--models-root", str(right))
    assert code == 1 and "model: LlamaForCausalLM, from config.json" in out


def test_the_models_root_prefix_names_the_root(capsys, tmp_path, monkeypatch):
    checkpoint(tmp_path / "models" / "llama", "LlamaForCausalLM")
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="${LLM_MODELS_ROOT}/llama"))
    monkeypatch.setenv("LLM_MODELS_ROOT", str(tmp_path / "models"))
    code, out, _ = resolve_config(capsys, config)
    assert code == 1 and "model: LlamaForCausalLM" in out


def test_an_absolute_path_and_a_path_beside_the_config(capsys, tmp_path):
    absolute = checkpoint(tmp_path / "abs" / "gemma", "Gemma3ForCausalLM")
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model=str(absolute)))
    assert resolve_config(capsys, config)[0] == 1
    checkpoint(tmp_path / "configs" / "local-model", "GptOssForCausalLM")
    beside = tmp_path / "configs" / "c.yaml"
    beside.write_text(DISAGG_UCX.format(model="local-model"))
    code, out, _ = resolve_config(capsys, beside)
    assert code == 1 and "model: GptOssForCausalLM" in out


def test_the_config_folder_comes_before_the_working_directory(tmp_path):
    checkpoint(tmp_path / "m", "MistralForCausalLM")  # the working directory (the fixture chdirs here)
    checkpoint(tmp_path / "configs" / "m", "LlamaForCausalLM")
    identity = find_model(ModelReference("m", ("model",)), config_dir=tmp_path / "configs", root=None)
    assert identity.architecture == "LlamaForCausalLM"
    assert identity.tried == (str(tmp_path / "configs" / "m"),)
    identity = find_model(ModelReference("m", ("model",)), config_dir=tmp_path / "elsewhere", root=None)
    assert identity.architecture == "MistralForCausalLM"


def test_a_hub_id_is_found_in_the_local_hub_cache(capsys, tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    snapshot = hub / "models--deepseek-ai--DeepSeek-V3" / "snapshots" / "abc123"
    checkpoint(snapshot, "DeepseekV3ForCausalLM", "deepseek_v3")
    (hub / "models--deepseek-ai--DeepSeek-V3" / "refs").mkdir()
    (hub / "models--deepseek-ai--DeepSeek-V3" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="deepseek-ai/DeepSeek-V3"))
    code, out, _ = resolve_config(capsys, config)
    assert code == 1 and "model: DeepseekV3ForCausalLM" in out and "snapshots/abc123" in out


def test_a_section_names_its_own_model(capsys, tmp_path):
    checkpoint(tmp_path / "llama", "LlamaForCausalLM")
    checkpoint(tmp_path / "mistral", "MistralForCausalLM")
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="mistral").replace("context_servers:\n", "context_servers:\n  model: llama\n"))
    reference = model_reference({"model": "mistral", "context_servers": {"model": "llama"}}, ("context_servers",))
    assert reference == ModelReference("llama", ("context_servers", "model"))
    code, out, _ = resolve_config(capsys, config)
    assert "model: LlamaForCausalLM" in out and "model: MistralForCausalLM" in out
    assert code == 1  # the context side runs Llama: PYTHON on UCX


def test_perf_sanity_configs_name_the_model_in_metadata(capsys, tmp_path, monkeypatch):
    # The folder (model_dir_name) first, then the name (model_name) under the models root.
    root = tmp_path / "models"
    checkpoint(root / "gpt_oss_120b_fp4", "GptOssForCausalLM", "gpt_oss")
    config = tmp_path / "perf.yaml"
    config.write_text(PERF_SANITY_UCX.format(name="gpt_oss_120b_fp4", folder="GPT-OSS-120B-FP4"))
    monkeypatch.setenv("LLM_MODELS_ROOT", str(root))
    code, out, _ = resolve_config(capsys, config)
    assert code == 1 and "model: GptOssForCausalLM" in out
    assert "worker_config.ctx" in out and "worker_config.gen" in out


def test_an_arch_map_names_the_model_when_no_checkpoint_is_found(capsys, tmp_path):
    arch_map = tmp_path / "map.yaml"
    arch_map.write_text('"*GLM-5*": GlmMoeDsaForCausalLM\n')
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="zai/GLM-5-FP8"))
    code, out, _ = resolve_config(capsys, config, "--arch-map", str(arch_map))
    assert code == 1 and f"model: GlmMoeDsaForCausalLM, from arch-map {arch_map} (*GLM-5*)" in out


def test_a_misspelt_arch_map_value_is_refused(capsys, tmp_path):
    arch_map = tmp_path / "map.yaml"
    arch_map.write_text('"*Llama*": LLamaForCausalLM\n')
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="meta/Llama-3.1-8B"))
    code, _, err = resolve_config(capsys, config, "--arch-map", str(arch_map))
    assert code == 2 and "did you mean 'LlamaForCausalLM'?" in err


def test_a_kimi_k3_text_checkpoint_is_read_by_its_model_type(capsys, tmp_path):
    # Upstream's load_pretrained_config: model_type kimi_k3 loads as KimiLinearForCausalLM, which
    # refuses every route but NIXL + PYTHON (2026.09.10): explicit CPP on NIXL cannot start.
    checkpoint(tmp_path / "k3", "KimiK3ForCausalLM", "kimi_k3")
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="k3").replace("backend: UCX", "backend: NIXL\n    transceiver_runtime: CPP"))
    code, out, _ = resolve_config(capsys, config)
    assert code == 1
    assert "context: KimiLinearForCausalLM, model_type kimi_k3" in out
    assert "error[kimi-k3-requires-python]" in out


def test_a_composite_kimi_k3_checkpoint_loads_as_the_multimodal_class(capsys, tmp_path):
    checkpoint(tmp_path / "k3", "KimiK3ForConditionalGeneration", "kimi_k3", text_config={"hidden_size": 8}, vision_config={"hidden_size": 8})
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="k3").replace("backend: UCX", "backend: NIXL"))
    code, out, _ = resolve_config(capsys, config)
    assert code == 0
    assert "context: KimiK3ForConditionalGeneration, model_type kimi_k3" in out


def test_a_broken_checkpoint_config_is_bad_input_with_its_location(capsys, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"architectures": "LlamaForCausalLM"}')
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="m"))
    code, _, err = resolve_config(capsys, config)
    assert code == 2 and "config.json" in err and "architectures" in err


def test_impact_counts_unknown_architectures_and_fails_where_some_model_would(capsys, tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "ds.yaml").write_text(DISAGG_UCX.format(model="DeepSeek-V3-Lite/fp8"))
    policies = str(Path(__file__).resolve().parents[2] / "policies")
    code = main(["impact", "--configs", str(configs), "--from", "2026.07.09", "--to", VERSION, "--policy", policies])
    out = capsys.readouterr().out
    # Under 2026.07.09 every model falls back to C++ on UCX; under 2026.09.10 a PYTHON-preferring
    # model is adopted verbatim and fails: unknown, and some model would start failing.
    assert code == 1
    assert "architecture unknown for 1 of 1 config: 1 depends on the model (1 would start failing for some model)" in out
    assert "starts failing for DeepseekV32ForCausalLM, DeepseekV3ForCausalLM" in out
    code = main(["impact", "--configs", str(configs), "--from", "2026.07.09", "--to", VERSION, "--policy", policies, "--fail-on", "never"])
    capsys.readouterr()
    assert code == 0


def test_impact_fail_on_unknown_fails_on_any_unidentified_model(capsys, tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    # NIXL with the default runtime starts for every model under both versions: a definite status,
    # still unidentified.
    (configs / "nixl.yaml").write_text(DISAGG_UCX.format(model="unknown-model").replace("backend: UCX", "backend: NIXL"))
    policies = str(Path(__file__).resolve().parents[2] / "policies")
    argv = ["impact", "--configs", str(configs), "--from", "2026.09.02", "--to", VERSION, "--policy", policies, "--format", "json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["configs"][0]["architecture_known"] is False
    assert main([*argv, "--fail-on", "unknown"]) == 1
    capsys.readouterr()


def test_impact_with_the_checkpoints_has_no_unknown(capsys, tmp_path, monkeypatch):
    root = tmp_path / "models"
    checkpoint(root / "DeepSeek-V3-Lite" / "fp8", "DeepseekV3ForCausalLM", "deepseek_v3")
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "ds.yaml").write_text(DISAGG_UCX.format(model="DeepSeek-V3-Lite/fp8"))
    monkeypatch.setenv("LLM_MODELS_ROOT", str(root))
    policies = str(Path(__file__).resolve().parents[2] / "policies")
    code = main(["impact", "--configs", str(configs), "--from", "2026.07.09", "--to", VERSION, "--policy", policies, "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["configs"][0]["status"] == "starts failing" and data["configs"][0]["architecture_known"] is True


def test_the_example_checkpoints_identify_every_example_model(capsys, monkeypatch):
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    monkeypatch.setenv("LLM_MODELS_ROOT", str(repo / "examples" / "models"))
    main(["impact", "--configs", "examples/configs", "--from", "2026.08.11", "--to", "2026.08.24", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    unknown = [c["path"] for c in data["configs"] if not c["architecture_known"]]
    assert unknown == ["examples/configs/single/mistral-7b-context.yaml"]  # it names no model
    assert all(c["architecture_source"].startswith("config.json") for c in data["configs"] if c["architecture_known"])


def test_impact_sarif_flags_an_unknown_model_that_may_fail(capsys, tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "ds.yaml").write_text(DISAGG_UCX.format(model="DeepSeek-V3-Lite/fp8"))
    policies = str(Path(__file__).resolve().parents[2] / "policies")
    code = main(["impact", "--configs", str(configs), "--from", "2026.07.09", "--to", VERSION, "--policy", policies, "--format", "sarif"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    (result,) = data["runs"][0]["results"]
    assert result["ruleId"] == "architecture-unknown" and result["level"] == "error"
    assert "starts failing for DeepseekV32ForCausalLM" in result["message"]["text"]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("configs/ds.yaml")
