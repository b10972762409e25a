"""``answer_config``: every server of a serving config is answered, every problem of every server is
reported with its location, and the answers are immutable values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import kvpolicy
from kvpolicy.serving.check import ConfigAnswer, ServingConfigError, answer_config


@pytest.fixture(scope="module")
def policy() -> kvpolicy.PolicySet:
    return kvpolicy.load()


def write(tmp_path: Path, text: str, name: str = "serve.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def bad_checkpoint(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": []}')


def problems_of(path: Path, policy: kvpolicy.PolicySet, **kwargs) -> list[str]:
    with pytest.raises(ServingConfigError) as caught:
        answer_config(path, policy, **kwargs)
    return caught.value.problems


SINGLE = "cache_transceiver_config:\n  backend: NIXL\n"


def test_answers_are_immutable(tmp_path: Path, policy) -> None:
    answer = answer_config(write(tmp_path, SINGLE), policy)
    with pytest.raises(dataclasses.FrozenInstanceError):
        answer.verdict = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        answer.servers[0].not_resolved = "changed"


def test_node_tree_is_left_out_of_repr_and_equality(tmp_path: Path, policy) -> None:
    answer = answer_config(write(tmp_path, SINGLE), policy)
    assert answer.node is not None
    assert "node=" not in repr(answer)
    path = tmp_path / "x.yaml"
    assert ConfigAnswer(path, (), None, object()) == ConfigAnswer(path, (), None, object())


def test_path_and_policy_may_be_named_but_options_may_not_be_positional(tmp_path: Path, policy) -> None:
    path = write(tmp_path, SINGLE)
    assert answer_config(path=path, policy_set=policy).servers[0].resolution is not None
    with pytest.raises(TypeError):
        answer_config(path, policy, None)


def test_unreadable_yaml_is_a_serving_config_error_with_its_location(tmp_path: Path, policy) -> None:
    path = write(tmp_path, "a: [\n")
    (problem,) = problems_of(path, policy)
    assert problem.startswith(f"{path}:2:1: invalid YAML")


def test_a_refused_server_does_not_hide_the_next_servers_problems(tmp_path: Path, policy) -> None:
    path = write(tmp_path, (
        "max_batch_size: 1\n"
        "context_servers:\n  max_batch_size: 2\n  cache_transceiver_config:\n    backend: NIXL\n"
        "generation_servers:\n  cache_transceiver_config:\n    backend: BOGUS\n"
    ))
    problems = problems_of(path, policy)
    assert len(problems) == 2
    assert "both at the top level and in context_servers" in problems[0]
    assert problems[1].startswith(f"{path}:8:5: invalid backend")


def test_every_server_of_a_tensorrt_backend_config_is_answered(tmp_path: Path, policy) -> None:
    path = write(tmp_path, (
        "backend: trt\n"
        "context_servers:\n  cache_transceiver_config:\n    backend: NIXL\n"
        "generation_servers:\n  cache_transceiver_config:\n    backend: NIXL\n"
    ))
    answer = answer_config(path, policy)
    assert [a.server.name for a in answer.servers] == ["context_servers", "generation_servers"]
    assert all("never resolved" in a.not_resolved for a in answer.servers)


def test_a_server_without_transceiver_config_does_not_stop_the_next_one(tmp_path: Path, policy) -> None:
    path = write(tmp_path, (
        "context_servers:\n  max_batch_size: 2\n"
        "generation_servers:\n  cache_transceiver_config:\n    backend: NIXL\n"
    ))
    context, generation = answer_config(path, policy).servers
    assert context.server.name == "context_servers" and "disaggregation off" in context.not_resolved
    assert generation.server.name == "generation_servers" and generation.resolution is not None
    # Where the missing config was expected: in that side's section, not at the top level.
    assert context.not_resolved == "no cache_transceiver_config at context_servers.cache_transceiver_config: disaggregation off"


def test_an_unusable_model_is_located_where_the_section_names_it(tmp_path: Path, policy) -> None:
    bad_checkpoint(tmp_path, "ctx-model")
    bad_checkpoint(tmp_path, "gen-model")
    path = write(tmp_path, (
        "context_servers:\n  model: ./ctx-model\n  cache_transceiver_config:\n    backend: NIXL\n"
        "generation_servers:\n  model: ./gen-model\n  cache_transceiver_config:\n    backend: NIXL\n"
    ))
    problems = problems_of(path, policy)
    assert len(problems) == 2
    assert "ctx-model" in problems[0] and problems[0].endswith(f"(the model of context_servers, named at {path}:2:3)")
    assert "gen-model" in problems[1] and problems[1].endswith(f"(the model of generation_servers, named at {path}:6:3)")


def test_an_unusable_explicit_model_without_reference_is_located_at_the_file(tmp_path: Path, policy) -> None:
    from kvpolicy.serving.identity import ModelIdentity

    path = write(tmp_path, SINGLE)
    (problem,) = problems_of(path, policy, explicit=ModelIdentity(problem="unusable model"))
    assert problem == f"unusable model (the model of server, named at {path})"


def test_an_invalid_field_in_one_server_does_not_hide_the_next_ones(tmp_path: Path, policy) -> None:
    path = write(tmp_path, (
        "context_servers:\n  cache_transceiver_config:\n    backend: BOGUS\n"
        "generation_servers:\n  cache_transceiver_config:\n    backend: WRONG\n"
    ))
    problems = problems_of(path, policy)
    assert len(problems) == 2
    assert problems[0].startswith(f"{path}:3:5: invalid backend") and "BOGUS" in problems[0]
    assert problems[1].startswith(f"{path}:6:5: invalid backend") and "WRONG" in problems[1]
