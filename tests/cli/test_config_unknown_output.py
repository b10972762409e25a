"""``kvpolicy resolve --config`` for a model it cannot identify (issue 35): each group of models is
listed once (later sides refer to it by number, the verdict by group), a group's deciding rule is named
for its family, and ``read:`` shows only the environment the policy reads."""

from __future__ import annotations

from kvpolicy.cli import main

CONFIG = """\
model: /models/not-here
backend: pytorch
context_servers:
  num_instances: 1
  env_overrides:
    TLLM_LOG_LEVEL: INFO
    TRTLLM_USE_UCX_KVCACHE: "1"
  cache_transceiver_config:
    backend: DEFAULT
generation_servers:
  num_instances: 1
  env_overrides:
    TRTLLM_USE_UCX_KVCACHE: "1"
  cache_transceiver_config:
    backend: DEFAULT
"""


def test_an_unknown_models_groups_are_listed_once_and_named_by_rule_family(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LLM_MODELS_ROOT", raising=False)
    config = tmp_path / "disagg.yaml"
    config.write_text(CONFIG)
    code = main(["resolve", "--config", str(config), "--version", "2026.09.28", "--models-root", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 3  # depends on the model
    context, generation = out.split("== generation_servers")
    # read: the variable the policy reads, not the logging one (counted instead)
    assert "env_overrides.TRTLLM_USE_UCX_KVCACHE = 1" in context
    assert "TLLM_LOG_LEVEL" not in out
    assert "(1 environment variable set that the policy never reads not shown)" in context
    # the first side lists each group's models; the second refers to them by number
    assert "[1] cannot start for DeepseekV32ForCausalLM, DeepseekV3ForCausalLM" in context
    assert "[1] cannot start for the models of [1] above:" in generation
    assert "cannot start for DeepseekV32ForCausalLM" not in generation
    # a group's rule is one of the family's rows, named as such (not the first member's alone)
    assert "runtime-preference[per model, e.g. DeepseekV32ForCausalLM]" in context
    # the verdict by group, without the lists again
    verdict = [line for line in out.splitlines() if line.startswith("depends on the model")]
    assert verdict and verdict[0].startswith("depends on the model: cannot start for [1] (") and verdict[0].endswith("(exit 3)")


def test_read_shows_a_variable_the_policy_reads_through_an_any_value_but_test():
    """TRTLLM_NIXL_KVCACHE_BACKEND is read by the in-flight-cancel gate as "any value but UCX": it
    must stay in `read:` (the notes' list of tested values leaves it out on purpose)."""
    import kvpolicy
    from kvpolicy.serving.check import read_line

    names = kvpolicy.load(version="2026.10.22").env_names()
    assert "TRTLLM_NIXL_KVCACHE_BACKEND" in names
    line = read_line(("context_servers.env_overrides.TRTLLM_NIXL_KVCACHE_BACKEND = LIBFABRIC",), names)
    assert line == "read: context_servers.env_overrides.TRTLLM_NIXL_KVCACHE_BACKEND = LIBFABRIC"
