"""Upstream's strict LLM-argument models: a misspelt field or section name means the server does not
start, so kvpolicy refuses it with its location instead of saying "can start"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.serving.configfile import read_config
from kvpolicy.serving.llmargs import KV_CACHE_FIELDS, check_sections, misspelling_of
from kvpolicy.serving.layouts import CACHE_TRANSCEIVER_FIELDS, servers_of

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"

#: (section, misspelt field, the field meant)
TYPOS = [
    ("cache_transceiver_config", "kv_transfer_timout_ms", "kv_transfer_timeout_ms"),
    ("kv_cache_config", "tokens_per_blok", "tokens_per_block"),
    ("kv_cache_config", "Use_KV_Cache_Manager_V2", "use_kv_cache_manager_v2"),
]


def _settings(section: str, field: str) -> dict:
    """One server's LLM arguments with ``field`` set in ``section``."""
    settings: dict = {"cache_transceiver_config": {"backend": "NIXL"}}
    settings.setdefault(section, {})[field] = 1
    return settings


def _layouts(section: str, field: str) -> list[tuple[dict, dict[str, tuple]]]:
    """(document, {server name: expected key path}) for each layout upstream reads; servers not
    named must be read without problems."""
    bad = _settings(section, field)
    good = {"cache_transceiver_config": {"backend": "NIXL", "kv_transfer_timeout_ms": 1000}, "kv_cache_config": {"tokens_per_block": 32}}
    return [
        # disaggregated, in one section
        ({"context_servers": bad, "generation_servers": good}, {"context_servers": ("context_servers", section, field)}),
        # disaggregated, at the top level: inherited by both sections
        ({**bad, "context_servers": {"num_instances": 1}, "generation_servers": {"num_instances": 1}},
         {"context_servers": (section, field), "generation_servers": (section, field)}),
        # perf-sanity
        ({"worker_config": {"ctx": bad, "gen": good}}, {"worker_config.ctx": ("worker_config", "ctx", section, field)}),
        # single server
        (bad, {"server": (section, field)}),
    ]


@pytest.mark.parametrize("section,field,meant", TYPOS)
def test_a_misspelt_field_is_refused_in_every_layout(section, field, meant) -> None:
    for document, expected in _layouts(section, field):
        found = {s.name: s for s in servers_of(document)}
        for name, server in found.items():
            if name not in expected:
                assert not server.problems and server.fields is not None, (name, server.problems)
                continue
            (problem,) = server.problems
            assert problem.keys == expected[name]
            assert problem.message == (
                f"unknown field {field} of {section}; did you mean {meant!r}? TensorRT-LLM refuses unknown fields "
                '(pydantic extra="forbid"), so this server does not start'
            )
            assert server.fields is None  # not resolved


@pytest.mark.parametrize("key", ["cache_transciever_config", "Cache_Transceiver_Config", "cachetransceiverconfig"])
def test_a_near_miss_section_name_is_refused_even_when_it_is_the_only_one(key) -> None:
    (server,) = servers_of({key: {"backend": "NIXL"}})  # was None: "nothing to resolve"
    (problem,) = server.problems
    assert problem.keys == (key,)
    assert f"unknown LLM argument {key}; did you mean 'cache_transceiver_config'?" in problem.message
    assert server.fields is None


def test_a_near_miss_inside_a_section() -> None:
    document = {
        "context_servers": {"kv_cache_confg": {"tokens_per_block": 32}, "cache_transceiver_config": {"backend": "UCX"}},
        "generation_servers": {"cache_transceiver_config": {"backend": "UCX"}},
    }
    context, generation = servers_of(document)
    (problem,) = context.problems
    assert problem.keys == ("context_servers", "kv_cache_confg") and "did you mean 'kv_cache_config'?" in problem.message
    assert not generation.problems
    worker = {"worker_config": {"gen": {"cache_transceiver_confg": {"backend": "UCX"}}}}
    (gen,) = servers_of(worker)
    assert gen.problems[0].keys == ("worker_config", "gen", "cache_transceiver_confg")


def test_other_unknown_top_level_keys_are_left_alone() -> None:
    # kvpolicy does not know every LLM argument: only near misses of the two sections are refused.
    for key in ("peft_cache_config", "kv_connector_config", "cuda_graph_config", "kv_cache_retention_config",
                "cache_transceiver", "speculative_config", "my_own_key"):
        assert misspelling_of(key) is None, key
    (server,) = servers_of({"cache_transceiver_config": {"backend": "NIXL"}, "peft_cache_config": {"x": 1}, "whatever": 1})
    assert not server.problems and server.fields["backend"] == "NIXL"


def test_every_upstream_field_is_accepted() -> None:
    settings = {
        "cache_transceiver_config": {name: None for name in CACHE_TRANSCEIVER_FIELDS} | {"backend": "NIXL"},
        "kv_cache_config": {name: None for name in KV_CACHE_FIELDS},
    }
    assert check_sections(settings, {}) == []
    (server,) = servers_of(settings)
    assert not server.problems


def test_a_kv_cache_typo_without_any_transceiver_config_is_still_nothing_to_resolve() -> None:
    assert servers_of({"kv_cache_config": {"tokens_per_blok": 32}}) is None
    assert servers_of({"context_servers": {"kv_cache_config": {"tokens_per_blok": 32}}, "generation_servers": {}}) is None


def test_type_errors_stay_with_the_existing_checks() -> None:
    (server,) = servers_of({"cache_transceiver_config": {"backend": "NIXL"}, "kv_cache_config": {"use_kv_cache_manager_v2": "yes"}})
    (problem,) = server.problems  # one message, not a second one from pydantic
    assert problem.keys == ("kv_cache_config", "use_kv_cache_manager_v2") and "expected true, false, null or auto" in problem.message


def _real_configs() -> list[Path]:
    configs = sorted(p for p in (REPO / "examples" / "configs").rglob("*") if p.suffix in (".yaml", ".json"))
    return configs + sorted(FIXTURES.iterdir())


@pytest.mark.parametrize("path", _real_configs(), ids=lambda p: p.name)
def test_real_configs_still_pass(path) -> None:
    document, _ = read_config(path)
    for server in servers_of(document) or []:
        assert all("unknown" not in p.message for p in server.problems), server.problems


NEAR_MISS = """\
model: Llama-3.1-8B-Instruct
cache_transciever_config:
  backend: NIXL
"""


def test_resolve_config_refuses_a_near_miss_with_its_location(tmp_path, capsys) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(NEAR_MISS, encoding="utf-8")
    code = main(["resolve", "--config", str(path), "--arch", "LlamaForCausalLM"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path}:2:1: unknown LLM argument cache_transciever_config; did you mean 'cache_transceiver_config'?" in err


def test_resolve_config_refuses_a_misspelt_field_with_its_location(tmp_path, capsys) -> None:
    path = tmp_path / "disagg.yaml"
    path.write_text(
        "context_servers:\n  cache_transceiver_config:\n    backend: NIXL\n    kv_transfer_timout_ms: 1000\n"
        "generation_servers:\n  cache_transceiver_config:\n    backend: NIXL\n",
        encoding="utf-8",
    )
    code = main(["resolve", "--config", str(path), "--arch", "LlamaForCausalLM"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path}:4:5: unknown field kv_transfer_timout_ms of cache_transceiver_config; did you mean 'kv_transfer_timeout_ms'?" in err


def test_impact_reports_a_near_miss_as_malformed(tmp_path, capsys) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(NEAR_MISS, encoding="utf-8")
    code = main(["impact", "--configs", str(path), "--from", "2026.08.11", "--to", "2026.08.24", "--format", "json", "--fail-on", "malformed"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    (config,) = data["configs"]
    assert config["status"] == "malformed"
    (problem,) = config["problems"]
    assert problem["location"] == f"{path}:2" and "did you mean 'cache_transceiver_config'?" in problem["message"]


def test_impact_reports_an_inherited_typo_once(tmp_path, capsys) -> None:
    path = tmp_path / "disagg.yaml"
    path.write_text(
        "cache_transceiver_config:\n  backend: NIXL\nkv_cache_config:\n  tokens_per_blok: 32\n"
        "context_servers:\n  num_instances: 1\ngeneration_servers:\n  num_instances: 1\n",
        encoding="utf-8",
    )
    code = main(["impact", "--configs", str(path), "--from", "2026.08.11", "--to", "2026.08.24"])
    out = capsys.readouterr().out
    # Malformed under both versions: reported and counted, not a failure the edit caused.
    assert code == 0 and "gate: passes (exit 0); 1 config malformed under both versions" in out
    assert out.count(f"{path}:4: error: unknown field tokens_per_blok of kv_cache_config; did you mean 'tokens_per_block'?") == 1


def test_a_plain_resolve_never_imports_pydantic(tmp_path) -> None:
    probe = (
        "import sys; from kvpolicy.cli import main; main(['resolve', '--arch', 'LlamaForCausalLM']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))"
    )
    environment = {**os.environ, "KVPOLICY_CACHE_DIR": str(tmp_path / "cache")}
    for _ in range(2):  # cold cache, then warm
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO, env=environment)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stdout.strip().splitlines()[-1] == "[]"
