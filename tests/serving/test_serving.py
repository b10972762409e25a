"""Serving configs are read the way TensorRT-LLM reads them, in every layout, and say what they used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpolicy import ContextError
from kvpolicy.cli import main
from kvpolicy.serving.configfile import read_config
from kvpolicy.analyse.impact import impact_of
from kvpolicy.serving.layouts import servers_of

FIXTURES = Path(__file__).parent / "fixtures"


def servers(name: str):
    document, _ = read_config(FIXTURES / name)
    return servers_of(document)


def test_top_level_transceiver_config_and_env_overrides_reach_every_server(shipped) -> None:
    found = servers("disagg-top-level-transceiver.yaml")
    assert [s.role for s in found] == ["context", "generation"]
    for server in found:
        assert server.fields["backend"] == "DEFAULT"
        assert server.fields["env"] == {"TRTLLM_USE_UCX_KVCACHE": "1"}
        assert "env_overrides.TRTLLM_USE_UCX_KVCACHE = 1" in server.used
        assert "cache_transceiver_config.kv_transfer_poll_interval_ms = 5000" in server.used
        # DEFAULT follows the override, as upstream's _resolve_default_backend does.
        resolution = shipped["2026.09.10"].resolve(architecture="LlamaForCausalLM", **server.fields)
        assert resolution.backend == "UCX"
        assert resolution.runtime == "PYTHON" and not resolution.ok  # verbatim preference, then fails


def test_perf_sanity_layout(shipped) -> None:
    ctx, gen = servers("perf-sanity-kvcmv2-nixl.yaml")
    assert (ctx.name, gen.name) == ("worker_config.ctx", "worker_config.gen")
    assert ctx.fields["kv_cache_manager"] == "V2"
    assert "worker_config.ctx.kv_cache_config.use_kv_cache_manager_v2 = true" in ctx.used
    assert ctx.fields["env"]["TRTLLM_USE_NIXL_KVCACHE"] == "1"
    assert "TRTLLM_DISABLE_KV_CACHE_TRANSFER_OVERLAP" not in ctx.fields["env"]
    assert gen.fields["env"]["TRTLLM_DISABLE_KV_CACHE_TRANSFER_OVERLAP"] == "1"
    resolution = shipped["2026.09.10"].resolve(architecture="GptOssForCausalLM", **ctx.fields)
    assert (resolution.runtime, resolution.kv_cache_manager, resolution.ok) == ("PYTHON", "V2", True)


def test_trt_backend_is_never_resolved() -> None:
    found = servers("trt-backend.yaml")
    assert all(s.fields is None and s.fixed and "never resolved" in s.fixed for s in found)


def test_transceiver_config_without_backend_is_disaggregation_off(shipped) -> None:
    (server,) = servers("no-backend-is-off.yaml")
    assert server.fields["backend"] is None
    assert not shipped["2026.09.10"].resolve(**server.fields).enabled


def test_a_key_set_differently_at_both_levels_is_refused() -> None:
    context, generation = servers("clash.yaml")
    assert context.problems and "both at the top level and in context_servers" in context.problems[0].message
    assert not generation.problems and generation.fields["backend"] == "NIXL"


def test_every_real_transceiver_field_is_accepted(shipped) -> None:
    (server,) = servers("agent-bounce.json")
    assert server.fields["kv_cache_manager"] == "auto"
    resolution = shipped["2026.09.16"].resolve(**server.fields)
    assert resolution.ok and resolution.runtime == "PYTHON"
    # The bounce-buffer fields arrived with #15780 (2026.09.16): a version of an earlier upstream state
    # refuses them, as upstream's strict CacheTransceiverConfig refused unknown fields then.
    with pytest.raises(ContextError, match="agent_bounce_buffer_enable: policy 2026.09.15 models an upstream state before"):
        shipped["2026.09.15"].resolve(**server.fields)


def test_impact_reads_every_layout(shipped) -> None:
    results = {Path(r.path).name: r for r in impact_of([FIXTURES], shipped["2026.08.18"], shipped["2026.09.10"])}
    assert {s.name for s in results["perf-sanity-kvcmv2-nixl.yaml"].sections} == {"worker_config.ctx", "worker_config.gen"}
    trt = results["trt-backend.yaml"]
    assert [s.new.short() for s in trt.sections] == ["CPP (not resolved)"] * 2 and trt.status == "unchanged"
    assert results["clash.yaml"].problems
    assert "TRTLLM_USE_UCX_KVCACHE" in " ".join(results["disagg-top-level-transceiver.yaml"].sections[0].used)


@pytest.mark.parametrize("name", ["disagg-top-level-transceiver.yaml", "perf-sanity-kvcmv2-nixl.yaml"])
def test_resolve_config_resolves_each_server(capsys, name) -> None:
    code = main(["resolve", "--config", str(FIXTURES / name), "--arch", "LlamaForCausalLM", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    servers = data["servers"]
    assert len(servers) == 2 and all(entry["used"] for entry in servers)
    assert all(entry["model"]["source"] == "--arch" for entry in servers)
    assert code == (0 if all(e["resolution"]["ok"] for e in servers) else 1)
    assert code == (1 if name.startswith("disagg") else 0)
    assert data["ok"] is (code == 0) and data["verdict"]["architecture_known"] is True


def _resolve_text(capsys, path: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["resolve", "--config", str(path), "--arch", "LlamaForCausalLM", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_resolve_config_errors_point_at_the_line_to_change(capsys, tmp_path) -> None:
    """A bad field of a serving config is reported at its own file:line:col (the feature list, not
    its section); an error of a resolution names the config key it asks to change, with its line."""
    config = tmp_path / "serve.yaml"
    config.write_text("model: x\nkvpolicy_features: [cancel]\ncache_transceiver_config:\n  backend: NIXL\n")
    code, _, err = _resolve_text(capsys, config)
    assert code == 2 and err.startswith(f"kvpolicy: error: {config}:2:1: invalid features: unknown feature 'cancel'")

    config.write_text(
        "model: x\nkv_cache_config:\n  use_kv_cache_manager_v2: true\n"
        "cache_transceiver_config:\n  backend: UCX\n  transceiver_runtime: CPP\n"
    )
    code, out, _ = _resolve_text(capsys, config)
    assert code == 1
    assert f"== server ({config}:4:1) ==" in out
    lines = out.splitlines()
    error = next(i for i, line in enumerate(lines) if line.startswith("error[kv-cache-manager-v2-requires-python]"))
    assert lines[error + 1] == f"  config: {config}:3:3: kv_cache_config.use_kv_cache_manager_v2"
    assert lines[error + 2].startswith("  --> ") and ".toml:" in lines[error + 2]
    assert lines[-1] == "1 error: this configuration cannot start"


def test_resolve_config_unknown_model_errors_name_the_section(capsys, tmp_path) -> None:
    config = tmp_path / "disagg.yaml"
    config.write_text(
        "model: nowhere/model\ncontext_servers:\n  cache_transceiver_config:\n    backend: UCX\n"
        "generation_servers:\n  cache_transceiver_config:\n    backend: UCX\n"
    )
    code = main(["resolve", "--config", str(config), "--version", "2026.09.28"])
    out = capsys.readouterr().out
    assert code == 3
    assert f"== context_servers ({config}:3:3) ==" in out and f"== generation_servers ({config}:6:3) ==" in out
    assert f"      config: {config}:3:3: context_servers.cache_transceiver_config" in out
    assert f"      config: {config}:6:3: generation_servers.cache_transceiver_config" in out
    # From 1.4 (#17495) the left-out transceiver_runtime is PYTHON: on UCX no model can start.
    assert main(["resolve", "--config", str(config), "--version", "2026.10.22"]) == 1
    capsys.readouterr()


@pytest.mark.parametrize("command", [["resolve", "--config"], ["impact", "--from", "2026.09.02", "--to", "2026.09.10", "--configs"]])
def test_a_models_root_that_is_not_a_folder_is_refused(capsys, tmp_path, monkeypatch, command) -> None:
    config = FIXTURES / "disagg-top-level-transceiver.yaml"
    not_a_folder = tmp_path / "models.txt"
    not_a_folder.write_text("")
    code = main([*command, str(config), "--models-root", str(not_a_folder)])
    out, err = capsys.readouterr()
    assert code == 2 and out.count("\n") <= 1  # at most the "policies:" line
    assert err == f"kvpolicy: error: --models-root {not_a_folder}: not a folder; name the folder that holds the checkpoint folders\n"
    code = main([*command, str(config), "--models-root", str(tmp_path / "missing")])
    assert code == 2 and "no such folder" in capsys.readouterr().err
    # $LLM_MODELS_ROOT naming a file is refused too; one that does not exist here is only not looked in.
    monkeypatch.setenv("LLM_MODELS_ROOT", str(not_a_folder))
    code = main([*command, str(config)])
    err = capsys.readouterr().err
    assert code == 2 and f"$LLM_MODELS_ROOT={not_a_folder}: not a folder" in err and "unset it" in err
    monkeypatch.setenv("LLM_MODELS_ROOT", str(tmp_path / "missing"))
    assert main([*command, str(config)]) != 2
    capsys.readouterr()


def test_a_trt_backend_config_is_disaggregated_on_the_cpp_transceiver_not_off(capsys) -> None:
    code = main(["resolve", "--config", str(FIXTURES / "trt-backend.yaml"), "--arch", "LlamaForCausalLM"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.rstrip().endswith("disaggregated on the C++ transceiver (the only one this backend has): nothing for the policy to decide")
    assert "disaggregation is off" not in out
