"""The finer rules of reading a serving config's servers: a section that is not a mapping, a key set
at both levels, a side left out, the environment in each form it is written, the feature list and
the parallel sizes, each read the way TensorRT-LLM reads it, with the problem at its own key.

Each case pins what a user sees: the servers found (name, role, keys), their fields and ``used``
lines, and each problem's message and location.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvpolicy.cli import main
from kvpolicy.serving.configfile import read_config
from kvpolicy.serving.identity import model_reference
from kvpolicy.serving.layouts import section_keys, servers_of, sides_disagree

NIXL = {"cache_transceiver_config": {"backend": "NIXL"}}


def read(tmp_path: Path, text: str):
    config = tmp_path / "serve.yaml"
    config.write_text(text)
    document, _ = read_config(config)
    return servers_of(document)


def problems(server) -> list[tuple[tuple, str]]:
    return [(p.keys, p.message) for p in server.problems]


def perf_sanity(environment: dict) -> list:
    return servers_of({"environment": environment, "worker_config": {"ctx": NIXL, "gen": NIXL}})


# -- servers and problems are values -------------------------------------------------------------------


def test_a_server_and_its_problems_are_immutable_values() -> None:
    (server,) = servers_of({"cache_transceiver_config": [1]})
    (problem,) = server.problems
    with pytest.raises(dataclasses.FrozenInstanceError):
        server.fields = {}  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.message = ""  # type: ignore[misc]
    assert problem in {problem} and hash(problem) == hash(servers_of({"cache_transceiver_config": [1]})[0].problems[0])


# -- the disaggregated layout --------------------------------------------------------------------------


def test_generation_servers_alone_are_read() -> None:
    (generation,) = servers_of({"generation_servers": NIXL})
    assert (generation.name, generation.role, generation.keys) == ("generation_servers", "generation", ("generation_servers", "cache_transceiver_config"))
    assert generation.fields["backend"] == "NIXL"


def test_a_side_that_is_not_a_mapping_is_a_problem_of_that_side_only(tmp_path) -> None:
    context, generation = read(tmp_path, "context_servers: 7\ngeneration_servers:\n  cache_transceiver_config:\n    backend: NIXL\n")
    assert (context.name, context.role, context.keys, context.fields) == ("context_servers", "context", ("context_servers",), None)
    assert problems(context) == [(("context_servers",), "context_servers: expected a mapping, got a number (7)")]
    assert (generation.role, generation.fields["backend"], generation.problems) == ("generation", "NIXL", ())


def test_a_null_side_is_a_problem_that_says_null(tmp_path) -> None:
    (context, generation) = read(tmp_path, "context_servers:\ngeneration_servers:\n  cache_transceiver_config:\n    backend: NIXL\n")
    assert problems(context) == [(("context_servers",), "context_servers: expected a mapping, got null")]
    assert generation.fields["backend"] == "NIXL"


def test_a_clash_names_the_first_clashing_key_and_every_clash() -> None:
    document = {
        "max_batch_size": 8, "max_num_tokens": 64, "cache_transceiver_config": {"backend": "NIXL"},
        "context_servers": {"max_batch_size": 4, "max_num_tokens": 32}, "generation_servers": {"max_batch_size": 8},
    }
    context, generation = servers_of(document)
    assert (context.name, context.role, context.keys, context.fields) == ("context_servers", "context", ("context_servers", "max_batch_size"), None)
    assert [p.keys for p in context.problems] == [("context_servers", "max_batch_size"), ("context_servers", "max_num_tokens")]
    assert context.problems[1].message == (
        "max_num_tokens is set both at the top level and in context_servers, with different values; TensorRT-LLM refuses this: keep one"
    )
    assert (generation.role, generation.fields["backend"]) == ("generation", "NIXL")


def test_a_single_side_config_resolves_with_no_disagreement(capsys, tmp_path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("model: x\ncontext_servers:\n  cache_transceiver_config:\n    backend: NIXL\n")
    code = main(["resolve", "--config", str(config), "--arch", "LlamaForCausalLM", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert [s["server"] for s in data["servers"]] == ["context_servers"]
    assert code == 0 and data["ok"] is True and data["verdict"]["status"] == "starts"


def test_sides_disagree_only_when_both_sides_resolved() -> None:
    python_nixl = SimpleNamespace(runtime="PYTHON", backend="NIXL")
    cpp_ucx = SimpleNamespace(runtime="CPP", backend="UCX")
    assert sides_disagree([("context", python_nixl), ("generation", None)]) is None
    assert sides_disagree([("context", None), ("generation", cpp_ucx)]) is None
    assert sides_disagree([("context", python_nixl)]) is None
    assert "different runtimes and backends (runtime PYTHON vs CPP; backend NIXL vs UCX)" in sides_disagree(
        [("context", python_nixl), ("generation", cpp_ucx)]
    )


# -- where a server's own settings are -----------------------------------------------------------------


def test_section_keys_name_each_servers_own_section() -> None:
    (single,) = servers_of(NIXL)
    context, generation = servers_of({"context_servers": NIXL, "generation_servers": NIXL})
    ctx, _ = servers_of({"worker_config": {"ctx": NIXL, "gen": NIXL}})
    assert [section_keys(s) for s in (single, context, generation, ctx)] == [(), ("context_servers",), ("generation_servers",), ("worker_config", "ctx")]
    document = {"model": "top", "context_servers": {**NIXL, "model": "own"}, "generation_servers": NIXL}
    assert [model_reference(document, section_keys(s)).text for s in servers_of(document)] == ["own", "top"]


# -- the perf-sanity layout ----------------------------------------------------------------------------


def test_a_worker_section_that_is_not_a_mapping_leaves_the_other_read() -> None:
    ctx, gen = servers_of({"worker_config": {"ctx": [1], "gen": NIXL}})
    assert (ctx.name, ctx.role, ctx.keys, ctx.fields) == ("worker_config.ctx", "context", ("worker_config", "ctx"), None)
    assert problems(ctx) == [(("worker_config", "ctx"), "worker_config.ctx: expected a mapping, got a list")]
    assert (gen.name, gen.fields["backend"], gen.problems) == ("worker_config.gen", "NIXL", ())


def test_a_worker_env_mapping_leaves_null_variables_unset() -> None:
    ctx, _ = perf_sanity({"worker_env_var": {"A": 1, "B": None}})
    assert ctx.fields["env"] == {"A": "1"}
    assert "environment.worker_env_var.A = 1" in ctx.used and not any(".B" in line for line in ctx.used)


def test_worker_env_words_that_cannot_be_split_are_a_problem() -> None:
    ctx, gen = perf_sanity({"worker_env_var": 'A="unclosed'})
    for server in (ctx, gen):
        assert problems(server) == [(("environment", "worker_env_var"), "environment.worker_env_var: cannot split 'A=\"unclosed': No closing quotation")]


@pytest.mark.parametrize("word", ["A", "=1"])
def test_a_worker_env_word_must_be_name_equals_value(word) -> None:
    ctx, _ = perf_sanity({"worker_env_var": f"B=2 {word}"})
    assert problems(ctx) == [(("environment", "worker_env_var"), f"environment.worker_env_var: expected NAME=VALUE, got {word!r}")]


def test_a_worker_env_that_is_neither_words_nor_a_mapping_is_a_problem_and_null_is_none() -> None:
    ctx, _ = perf_sanity({"worker_env_var": 7})
    assert problems(ctx) == [(("environment", "worker_env_var"), "environment.worker_env_var: expected NAME=VALUE words, got a number (7)")]
    ctx, _ = perf_sanity({"worker_env_var": None, "ctx_worker_env_var": "A=1"})
    assert ctx.problems == () and ctx.fields["env"] == {"A": "1"}


# -- each server's settings ----------------------------------------------------------------------------


def test_only_parallel_sizes_are_parallel() -> None:
    (server,) = servers_of({**NIXL, "tensor_parallel_size": 2, "max_batch_size": 8, "pipeline_parallel_size": 1})
    assert server.parallel == (("tensor_parallel_size", 2), ("pipeline_parallel_size", 1))


def test_env_overrides_are_read_after_a_bad_env() -> None:
    (server,) = servers_of({**NIXL, "env": 7, "env_overrides": {"A": 1}})
    assert server.fields is None
    assert problems(server) == [(("env",), "env: expected a mapping of variables, got a number (7)")]
    assert "env_overrides.A = 1" in server.used
    (server,) = servers_of({**NIXL, "env": 7, "env_overrides": "A=1"})
    assert [p.keys for p in server.problems] == [("env",), ("env_overrides",)]


def test_env_booleans_are_written_lowercase_and_strings_as_they_are() -> None:
    (server,) = servers_of({**NIXL, "env_overrides": {"TRTLLM_FLAG": True, "NAME": "Mixed"}})
    assert server.fields["env"] == {"TRTLLM_FLAG": "true", "NAME": "Mixed"}


@pytest.mark.parametrize("features", ["cancel", [1]], ids=["string", "number"])
def test_features_must_be_a_list_of_names(features) -> None:
    (server,) = servers_of({**NIXL, "kvpolicy_features": features})
    assert server.fields is None
    assert problems(server) == [(("kvpolicy_features",), f"kvpolicy_features: expected a list of feature names, got {features!r}")]
