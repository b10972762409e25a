"""Upstream's own unit tests of the decision area, restated as facts about the version of their state.

The reference is NVIDIA/TensorRT-LLM's newest stored ``tests/unittest/llmapi/test_llm_args.py`` (commit
0050262c: ``TestTransceiverRuntimeAutoResolution``, ``TestDeepseekRuntimePreferences``,
``TestKvCacheManagerV2AutoResolution`` with ``test_registered_models_prefer_v2`` and
``test_registered_models_keep_v2_on_nixl``) and ``test_mamba_cache_manager.py``'s
``test_hybrid_models_prefer_v2_and_python_transceiver`` (commit 000d3e98). Their state: #18134's
resolver (no preference: PYTHON on NIXL with a finite timeout, else C++; a preference adopted
verbatim), the V2 hook, #19004 and #19140 (Llama and the Nemotron-H multimodal names are in their
lists), and ``auto`` still the fields' default (before #17495): the newest version whose left-out
fields are ``auto`` (``NEWEST_AUTO``). Each case names the upstream test it restates; where upstream
uses a fake model class, a real architecture with the same preferences stands in for it. The facts are
restated, not the code: kvpolicy's own answer for the same inputs.
"""

from __future__ import annotations

import pytest

import kvpolicy

from tests.support.constants import NEWEST_AUTO

#: Stand-ins for upstream's fakes: a model that prefers PYTHON and V2, one that prefers only V2 (a
#: get_model_defaults V2 and no runtime hook), and one with no preference at all.
PREFERS_BOTH = "Gemma4ForConditionalGeneration"
PREFERS_V2_ONLY = "MiniMaxM2ForCausalLM"
NO_PREFERENCE = "Qwen2ForCausalLM"

#: test_registered_models_prefer_v2's 27 architectures.
PREFER_V2 = (
    "LlamaForCausalLM", "Llama4ForConditionalGeneration", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
    "GlmMoeDsaForCausalLM", "GptOssForCausalLM", "MistralLarge3ForCausalLM", "DeepseekV4ForCausalLM",
    "KimiK25ForConditionalGeneration", "MiniMaxM2ForCausalLM", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    "Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration", "MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration",
    "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedForConditionalGeneration", "NemotronH_Nano_VL_V2", "NemotronH_Nano_Omni_Reasoning_V3",
    "NemotronH_Omni_Reasoning_V3",
)
#: Where kvpolicy knowingly differs from that list, and why (docs/policies.md says the same).
NOT_MODELLED = {
    # No stored upstream code gives MiniMax-M3 a hook (modeling_minimaxm3.py at 016beb63 and c0261efa), and
    # no PR adding one was found: which state the test describes is open, so no version claims it.
    "MiniMaxM3SparseForCausalLM": "no stored code or PR gives MiniMax-M3 a V2 hook",
    "MiniMaxM3SparseForConditionalGeneration": "no stored code or PR gives MiniMax-M3 a V2 hook",
    # Registered on Nemotron-H's class by v1.4.0rc1; when is not known, so only 2026.10.22 names it.
    "NemotronHPuzzleForCausalLM": "registered by v1.4.0rc1, date not found: first shipped in 2026.10.22",
}
#: test_registered_models_keep_v2_on_nixl: the same list without Llama and MiniMax M2.
KEEP_V2_ON_NIXL = tuple(a for a in PREFER_V2 if a not in ("LlamaForCausalLM", "MiniMaxM2ForCausalLM"))
#: test_hybrid_models_prefer_v2_and_python_transceiver's classes, by a registered name of each.
HYBRIDS = ("NemotronHForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration", "NemotronH_Nano_VL_V2")


@pytest.fixture(scope="module")
def state():
    return kvpolicy.load(version=NEWEST_AUTO)


def _resolve(state, **context):
    resolution = state.resolve(**context)
    return resolution.values, resolution.verdict().status


def test_the_reference_state_is_the_newest_version_with_auto_defaults(state):
    # test_default_is_auto: the field defaults to auto in the state these tests describe.
    assert state.left_out() == {}
    assert NEWEST_AUTO == "2026.09.28"


def test_auto_with_no_model_preference_is_python_on_nixl(state):
    # test_auto_no_model_preference_defaults_to_python; test_context_parallelism_does_not_gate_resolution
    values, status = _resolve(state, architecture=NO_PREFERENCE, backend="NIXL", transceiver_runtime="auto")
    assert values["transceiver_runtime"] == "PYTHON" and status == "starts"


@pytest.mark.parametrize("architecture", ["Gemma3ForCausalLM", "LlamaForCausalLM"])
def test_llama_and_gemma_preferences_are_adopted(state, architecture):
    # test_llama_and_gemma_model_preferences_adopted
    values, _ = _resolve(state, architecture=architecture, backend="NIXL", transceiver_runtime="auto")
    assert values["transceiver_runtime"] == "PYTHON"


@pytest.mark.parametrize(("given", "kept"), [("CPP", "CPP"), ("PYTHON", "PYTHON"), (None, "CPP")])
def test_an_explicit_value_is_never_overridden_by_a_preference(state, given, kept):
    # test_explicit_value_not_overridden_by_model_preference (None: the C++ transceiver)
    values, _ = _resolve(state, architecture=PREFERS_BOTH, backend="NIXL", transceiver_runtime=given)
    assert values["transceiver_runtime"] == kept


@pytest.mark.parametrize("backend", ["UCX", "MPI", "MOONCAKE"])
def test_no_preference_off_nixl_falls_back_to_cpp(state, backend):
    # test_no_preference_incompatible_backend_falls_back_to_cpp
    values, status = _resolve(state, architecture=NO_PREFERENCE, backend=backend, transceiver_runtime="auto")
    assert values["transceiver_runtime"] == "CPP" and status == "starts"


@pytest.mark.parametrize("backend", ["UCX", "MPI", "MOONCAKE"])
def test_a_python_preference_off_nixl_is_preserved_and_fails_at_start_up(state, backend):
    # test_python_preference_incompatible_backend_is_preserved ("creation is expected to fail loudly later")
    values, status = _resolve(state, architecture=PREFERS_BOTH, backend=backend, transceiver_runtime="auto")
    assert values["transceiver_runtime"] == "PYTHON" and status == "cannot start"


def test_a_python_preference_with_a_null_timeout_is_preserved(state):
    # test_python_preference_unsupported_config_is_preserved
    values, status = _resolve(state, architecture=PREFERS_BOTH, backend="NIXL", transceiver_runtime="auto", kv_transfer_timeout_ms=None)
    assert values["transceiver_runtime"] == "PYTHON" and status == "cannot start"


def test_no_preference_with_a_null_timeout_falls_back_to_cpp(state):
    # test_infinite_kv_transfer_timeout_falls_back_to_cpp
    values, _ = _resolve(state, architecture=NO_PREFERENCE, backend="NIXL", transceiver_runtime="auto", kv_transfer_timeout_ms=None)
    assert values["transceiver_runtime"] == "CPP"


def test_default_backend_is_nixl_and_the_preference_is_adopted(state):
    # test_default_backend_resolves_to_nixl_and_adopts_preference
    values, _ = _resolve(state, architecture=PREFERS_BOTH, backend="DEFAULT", transceiver_runtime="auto")
    assert (values["backend"], values["transceiver_runtime"]) == ("NIXL", "PYTHON")


@pytest.mark.parametrize("variable", ["TRTLLM_USE_UCX_KVCACHE", "TRTLLM_USE_MPI_KVCACHE"])
def test_an_env_backend_keeps_the_python_preference_but_not_v2(state, variable):
    # test_default_backend_env_override_keeps_preference: PYTHON kept, V2 off (the gate needs PYTHON on NIXL)
    values, _ = _resolve(state, architecture=PREFERS_BOTH, backend="DEFAULT", env={variable: "1"}, transceiver_runtime="auto", kv_cache_manager="auto")
    assert (values["transceiver_runtime"], values["kv_cache_manager"]) == ("PYTHON", "V1")


def test_backend_env_priority_is_nixl_ucx_mooncake_mpi(state):
    # test_resolve_default_backend_env_priority
    order = ["TRTLLM_USE_MPI_KVCACHE", "TRTLLM_USE_MOONCAKE_KVCACHE", "TRTLLM_USE_UCX_KVCACHE", "TRTLLM_USE_NIXL_KVCACHE"]
    assert _resolve(state, architecture=NO_PREFERENCE, backend="DEFAULT")[0]["backend"] == "NIXL"
    env: dict[str, str] = {}
    for variable, backend in zip(order, ["MPI", "MOONCAKE", "UCX", "NIXL"]):
        env[variable] = "1"
        assert _resolve(state, architecture=NO_PREFERENCE, backend="DEFAULT", env=dict(env))[0]["backend"] == backend
    assert _resolve(state, architecture=NO_PREFERENCE, backend="UCX", env=dict(env))[0]["backend"] == "UCX"


@pytest.mark.parametrize("architecture", ["GlmMoeDsaForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"])
def test_deepseek_class_architectures_prefer_python(state, architecture):
    # TestDeepseekRuntimePreferences: test_preference_per_architecture, test_deepseek_resolves_auto_to_python_on_nixl
    values, _ = _resolve(state, architecture=architecture, backend="NIXL", transceiver_runtime="auto")
    assert values["transceiver_runtime"] == "PYTHON"


@pytest.mark.parametrize("explicit_auto", [False, True])
def test_v2_preference_is_used_under_auto(state, explicit_auto):
    # TestKvCacheManagerV2AutoResolution.test_auto_uses_model_preference
    context = {"kv_cache_manager": "auto"} if explicit_auto else {}
    values, _ = _resolve(state, architecture=PREFERS_V2_ONLY, backend="NIXL", transceiver_runtime="auto", **context)
    assert values["kv_cache_manager"] == "V2"


def test_without_a_v2_preference_auto_is_v1(state):
    # test_auto_without_preference_falls_back_to_v1
    assert _resolve(state, architecture=NO_PREFERENCE, backend="NIXL", kv_cache_manager="auto")[0]["kv_cache_manager"] == "V1"


@pytest.mark.parametrize(("backend", "runtime"), [("NIXL", "CPP"), ("UCX", None), ("MPI", None)])
def test_v2_preference_falls_back_to_v1_off_nixl_python(state, backend, runtime):
    # test_auto_v2_falls_back_for_incompatible_disagg
    values, _ = _resolve(state, architecture=PREFERS_V2_ONLY, backend=backend, transceiver_runtime=runtime, kv_cache_manager="auto")
    assert values["kv_cache_manager"] == "V1"


def test_v2_preference_is_kept_on_nixl_python(state):
    # test_auto_v2_keeps_python_nixl_preference
    values, _ = _resolve(state, architecture=PREFERS_V2_ONLY, backend="NIXL", transceiver_runtime="PYTHON", kv_cache_manager="auto")
    assert values["kv_cache_manager"] == "V2"


def test_an_explicit_v1_overrides_a_v2_preference(state):
    # test_explicit_value_overrides_model_preference[explicit-v1]
    values, _ = _resolve(state, architecture=PREFERS_V2_ONLY, backend="NIXL", transceiver_runtime="PYTHON", kv_cache_manager="V1")
    assert values["kv_cache_manager"] == "V1"


def test_the_registered_models_upstream_lists_prefer_v2(state):
    # test_registered_models_prefer_v2: each has a V2 row (the hook or a get_model_defaults V2)
    rows = {row.architecture for row in state.policy.decisions["kv_cache_manager"].preference.rows if row.value == "V2"}
    assert {a for a in PREFER_V2 if a not in rows} == set(NOT_MODELLED)


@pytest.mark.parametrize("architecture", [a for a in KEEP_V2_ON_NIXL if a not in NOT_MODELLED])
def test_the_registered_models_keep_v2_on_nixl(state, architecture):
    # test_registered_models_keep_v2_on_nixl: runtime first (PYTHON on NIXL under auto), then V2 kept
    values, status = _resolve(state, architecture=architecture, backend="NIXL", transceiver_runtime="auto", kv_cache_manager="auto")
    assert (values["transceiver_runtime"], values["kv_cache_manager"], status) == ("PYTHON", "V2", "starts")


def test_minimax_m2_resolves_to_v1_on_the_keep_v2_route_without_a_runtime_preference(state):
    # keep_v2_on_nixl's docstring: MiniMax-M2 deliberately has no transceiver preference; it is left out
    # there. Under #18134 auto still gives PYTHON on NIXL, so kvpolicy keeps its V2 default: the test's
    # reason for leaving it out is its route (the runtime hook), not the outcome.
    assert "MiniMaxM2ForCausalLM" not in {r.architecture for r in state.policy.decisions["transceiver_runtime"].preference.rows}


@pytest.mark.parametrize("architecture", HYBRIDS)
def test_hybrid_models_prefer_v2_and_python(state, architecture):
    # test_mamba_cache_manager.py: test_hybrid_models_prefer_v2_and_python_transceiver (backend DEFAULT, no variables)
    values, status = _resolve(state, architecture=architecture, backend="DEFAULT", transceiver_runtime="auto", kv_cache_manager="auto")
    assert (values["transceiver_runtime"], values["kv_cache_manager"], status) == ("PYTHON", "V2", "starts")


def test_the_puzzle_name_is_modelled_from_the_1_4_state():
    assert "NemotronHPuzzleForCausalLM" in {r.architecture for r in kvpolicy.load(version="2026.10.22").policy.rows()}
