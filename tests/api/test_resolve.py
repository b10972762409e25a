"""Resolution: each precedence step, each shipped version's history, the start-up errors, the API."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import kvpolicy
from kvpolicy import ContextError, ResolutionError

from tests.support.constants import NEWEST_AUTO, VERSIONS
from tests.support.policies import write

# -- upstream's history, version by version (tests/evaluate/test_oracle_agreement.py checks every context) ----

HISTORY = [
    # (version, architecture, backend, expected runtime, expected deciding rule)
    ("2026.07.09", "GptOssForCausalLM", "NIXL", "CPP", "runtime-default-cpp"),  # #16164: no preference yet
    ("2026.07.20", "GptOssForCausalLM", "NIXL", "PYTHON", "runtime-preference[GptOssForCausalLM]"),
    ("2026.07.20", "GptOssForCausalLM", "UCX", "CPP", "runtime-default-cpp"),
    ("2026.07.23", "GlmMoeDsaForCausalLM", "DEFAULT", "PYTHON", "runtime-preference[GlmMoeDsaForCausalLM]"),
    ("2026.07.23", "DeepseekV3ForCausalLM", "NIXL", "CPP", "runtime-default-cpp"),
    ("2026.08.03", "DeepseekV3ForCausalLM", "NIXL", "PYTHON", "runtime-preference[DeepseekV3ForCausalLM]"),
    ("2026.08.03", "DeepseekV3ForCausalLM", "UCX", "CPP", "runtime-default-cpp"),
    ("2026.08.11", "LlamaForCausalLM", "NIXL", "PYTHON", "runtime-preference[LlamaForCausalLM]"),
    ("2026.08.11", "Gemma3ForCausalLM", "DEFAULT", "PYTHON", "runtime-preference[Gemma3ForCausalLM]"),
    ("2026.08.11", "LlamaForCausalLM", "UCX", "CPP", "runtime-default-cpp"),
    ("2026.08.11", "Llama4ForConditionalGeneration", "NIXL", "CPP", "runtime-default-cpp"),
    ("2026.08.11", "MistralForCausalLM", "NIXL", "CPP", "runtime-default-cpp"),
    ("2026.08.11", "Gemma3ForConditionalGeneration", "NIXL", "CPP", "runtime-default-cpp"),
    ("2026.08.18", "Gemma3ForConditionalGeneration", "NIXL", "PYTHON", "runtime-preference[Gemma3ForConditionalGeneration]"),
    ("2026.08.24", "MistralForCausalLM", "NIXL", "PYTHON", "runtime-default-python"),
    ("2026.08.24", "MistralForCausalLM", "UCX", "CPP", "auto-cpp-off-nixl"),
    ("2026.08.24", "LlamaForCausalLM", "UCX", "PYTHON", "runtime-preference[LlamaForCausalLM]"),
    ("2026.08.24", "DeepseekV3ForCausalLM", "UCX", "PYTHON", "runtime-preference[DeepseekV3ForCausalLM]"),
    ("2026.09.10", "KimiLinearForCausalLM", "NIXL", "PYTHON", "runtime-preference[KimiLinearForCausalLM]"),
    ("2026.09.10", "Qwen3_5ForConditionalGeneration", "NIXL", "PYTHON", "runtime-preference[Qwen3_5ForConditionalGeneration]"),
    ("2026.09.10", "Llama4ForConditionalGeneration", "NIXL", "PYTHON", "runtime-preference[Llama4ForConditionalGeneration]"),
    ("2026.09.10", None, "MOONCAKE", "CPP", "auto-cpp-off-nixl"),
]


@pytest.mark.parametrize(("version", "architecture", "backend", "runtime", "rule"), HISTORY)
def test_history(shipped, version, architecture, backend, runtime, rule):
    resolution = shipped[version].resolve(architecture=architecture, backend=backend)
    assert resolution.runtime == runtime
    assert resolution.decided_by["transceiver_runtime"] == rule
    assert resolution.policy_version == version


def test_python_preference_on_ucx_fails_from_2026_08_24(shipped):
    for version in ("2026.08.24", "2026.09.10"):
        resolution = shipped[version].resolve(architecture="LlamaForCausalLM", backend="UCX")
        assert not resolution.ok
        (error,) = resolution.errors
        assert error.id == "python-requires-nixl"
        assert "set cache_transceiver_config.transceiver_runtime to CPP" in error.message
        assert error.location.startswith("policies/") or error.location.startswith("/")
        fixed = shipped[version].resolve(architecture="LlamaForCausalLM", backend="UCX", transceiver_runtime="CPP")
        assert fixed.ok and fixed.runtime == "CPP" and fixed.decided_by["transceiver_runtime"] == "explicit"


def test_glm_checkpoint_through_deepseek_class(shipped):
    glm = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "glm_moe_dsa"}
    deepseek = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    old = shipped["2026.07.23"]
    assert old.resolve(pretrained_config=glm, backend="NIXL").runtime == "PYTHON"
    assert old.resolve(pretrained_config=deepseek, backend="NIXL").runtime == "CPP"
    new = shipped["2026.09.10"]
    assert new.resolve(pretrained_config=deepseek, backend="NIXL").decided_by["transceiver_runtime"] == (
        "runtime-preference[DeepseekV3ForCausalLM]"
    )


def test_architecture_is_architectures_0_not_the_execution_class(newest):
    # A loader may swap in a draft class; the checkpoint's first architecture keeps its preference.
    config = SimpleNamespace(architectures=["LlamaForCausalLM", "EagleDraftForCausalLM"], model_type="llama")
    resolution = newest.resolve(pretrained_config=config, backend="NIXL")
    assert resolution.context["architecture"] == "LlamaForCausalLM"
    assert resolution.decided_by["transceiver_runtime"] == "runtime-preference[LlamaForCausalLM]"


# -- precedence ---------------------------------------------------------------------------------


def test_explicit_beats_everything_and_is_checked(newest):
    resolution = newest.resolve(architecture="GptOssForCausalLM", backend="NIXL", transceiver_runtime="CPP")
    assert resolution.runtime == "CPP"
    assert resolution.decided_by["transceiver_runtime"] == "explicit"
    assert resolution.ok
    steps = [s for s in resolution.trace if s.decision == "transceiver_runtime" and s.stage == "preference"]
    assert steps[0].outcome == "lost"


def test_null_runtime_is_cpp_decided_by_the_policy(newest):
    # Upstream keeps a null runtime (C++), but rewrites it at creation for pipelined transfer on NIXL.
    resolution = newest.resolve(architecture="LlamaForCausalLM", backend="NIXL", transceiver_runtime=None)
    assert resolution.runtime == "CPP" and resolution.decided_by["transceiver_runtime"] == "null-runtime-cpp"
    assert resolution.context["transceiver_runtime"] == "null"
    pipelined = newest.resolve(backend="NIXL", transceiver_runtime=None, enable_pipelined_transfer=True)
    assert pipelined.runtime == "PYTHON" and pipelined.ok
    assert pipelined.decided_by["transceiver_runtime"] == "pipelined-selects-python"
    assert [d.id for d in pipelined.warnings] == ["pipelined-selects-python"]


def test_adjustment_never_rewrites_an_explicit_value(newest):
    explicit = newest.resolve(backend="NIXL", transceiver_runtime="CPP", enable_pipelined_transfer=True)
    assert explicit.runtime == "CPP" and explicit.decided_by["transceiver_runtime"] == "explicit"
    assert [d.id for d in explicit.errors] == ["pipelined-transfer-explicit-cpp"]


#: A requirement and a second one that disagrees, added to the newest shipped policy's text.
REQUIREMENTS = """
[[decisions.transceiver_runtime.requirement]]
id = "serialized-state-requires-cpp"
when = { features.serialized_state = true }
value = "CPP"
notice = { severity = "info", message = "resolved to CPP for the serialized state protocol." }

[[decisions.transceiver_runtime.requirement]]
id = "timing-requires-python"
when = { features.sync_timing_output = true }
value = "PYTHON"
"""


@pytest.fixture
def with_requirements(tmp_path, policy_text):
    head, tail = policy_text.split("[decisions.kv_cache_manager]", 1)
    return kvpolicy.load(write(tmp_path, head + REQUIREMENTS + "\n[decisions.kv_cache_manager]" + tail))


def test_requirement_beats_preference(with_requirements):
    resolution = with_requirements.resolve(architecture="LlamaForCausalLM", backend="NIXL", features={"serialized_state"})
    assert resolution.runtime == "CPP"
    assert resolution.decided_by["transceiver_runtime"] == "serialized-state-requires-cpp"
    assert "serialized-state-requires-cpp" in [d.id for d in resolution.notes]


def test_requirement_against_explicit_is_an_error(with_requirements):
    resolution = with_requirements.resolve(
        architecture="LlamaForCausalLM", backend="NIXL", transceiver_runtime="PYTHON", features={"serialized_state"}
    )
    assert resolution.runtime == "PYTHON"  # never rewritten
    (error,) = [d for d in resolution.errors if d.id == "serialized-state-requires-cpp"]
    assert "explicitly PYTHON" in error.message and "set transceiver_runtime to CPP or auto" in error.message


def test_two_requirements_disagreeing_name_both(with_requirements):
    resolution = with_requirements.resolve(
        architecture="MistralForCausalLM", backend="NIXL", features={"serialized_state", "sync_timing_output"}
    )
    conflict = [d for d in resolution.errors if d.id == "requirements-conflict"]
    assert conflict
    assert "serialized-state-requires-cpp" in conflict[0].message
    assert "timing-requires-python" in conflict[0].message


def test_ordered_conditionals_first_match_wins(shipped):
    policy_set = shipped["2026.08.24"]
    both = policy_set.resolve(architecture=None, backend="UCX", kv_transfer_timeout_ms=None)
    assert both.decided_by["transceiver_runtime"] == "auto-cpp-off-nixl"
    timeout_only = policy_set.resolve(backend="NIXL", kv_transfer_timeout_ms=None)
    assert timeout_only.decided_by["transceiver_runtime"] == "auto-cpp-null-timeout"
    assert [d.severity for d in timeout_only.diagnostics] == ["info"]


def test_preference_adoption_is_policy_data(shipped, tmp_path, policy_text):
    # The same preference table adopted only on NIXL once `adopt_when` is added: no engine change.
    text = policy_text.replace(
        'id = "runtime-preference"\n', 'id = "runtime-preference"\nadopt_when = { backend = "NIXL" }\n', 1
    )
    edited = kvpolicy.load(write(tmp_path, text))
    assert edited.resolve(architecture="LlamaForCausalLM", backend="UCX").runtime == "CPP"
    assert shipped["2026.09.10"].resolve(architecture="LlamaForCausalLM", backend="UCX").runtime == "PYTHON"


def test_kv_cache_manager_depends_on_runtime_and_backend(newest):
    adopted = newest.resolve(architecture="Gemma4ForCausalLM", backend="NIXL")
    assert adopted.kv_cache_manager == "V2"
    demoted = newest.resolve(architecture="Gemma4ForCausalLM", backend="NIXL", transceiver_runtime="CPP")
    assert demoted.kv_cache_manager == "V1"
    assert demoted.ok
    assert [d.id for d in demoted.notes] == ["kv-cache-manager-preference"]
    explicit = newest.resolve(architecture="Gemma4ForCausalLM", transceiver_runtime="CPP", kv_cache_manager="V2")
    assert [d.id for d in explicit.errors] == ["kv-cache-manager-v2-requires-python"]


# -- DEFAULT backend and the environment ----------------------------------------------------------


#: DEFAULT's variables in upstream's priority order (_resolve_default_backend): the first set to "1" wins.
BACKEND_PRIORITY = (
    ("TRTLLM_USE_NIXL_KVCACHE", "NIXL"),
    ("TRTLLM_USE_UCX_KVCACHE", "UCX"),
    ("TRTLLM_USE_MOONCAKE_KVCACHE", "MOONCAKE"),
    ("TRTLLM_USE_MPI_KVCACHE", "MPI"),
)
#: Every pair of variables both set to "1" (and each alone): the higher-priority one decides.
PRIORITY_PAIRS = [
    (dict.fromkeys(variables, "1"), next(name for variable, name in BACKEND_PRIORITY if variable in variables))
    for variables in [(v,) for v, _ in BACKEND_PRIORITY] + [
        (first, second) for i, (first, _) in enumerate(BACKEND_PRIORITY) for second, _ in BACKEND_PRIORITY[i + 1:]
    ]
]


@pytest.mark.parametrize(("env", "backend"), PRIORITY_PAIRS + [(dict(reversed(list(e.items()))), b) for e, b in PRIORITY_PAIRS if len(e) == 2])
def test_default_backend_env_priority(newest, env, backend):
    resolution = newest.resolve(backend="DEFAULT", env=env)
    assert resolution.backend == backend
    assert resolution.decided_by["backend"] == f"backend-env-{backend.lower()}"
    # One warning says which variable decided; MPI adds its deprecation warning, nothing else does.
    expected = [f"backend-env-{backend.lower()}"] + (["mpi-backend-deprecated"] if backend == "MPI" else [])
    assert sorted(d.id for d in resolution.warnings) == sorted(expected)
    (env_warning,) = [d for d in resolution.warnings if d.id.startswith("backend-env-")]
    assert "instead of the environment variable" in env_warning.message


@pytest.mark.parametrize("env", [{}, {"TRTLLM_USE_UCX_KVCACHE": "true"}, {"TRTLLM_USE_MPI_KVCACHE": "0"}, {"TRTLLM_USE_UCX_KVCACHE": ""}])
def test_default_backend_without_a_variable_set_to_1_is_nixl_and_says_nothing(newest, env):
    resolution = newest.resolve(backend="DEFAULT", env=env)  # only the exact "1" counts
    assert resolution.backend == "NIXL" and resolution.decided_by["backend"] == "backend-default-nixl"
    assert not resolution.warnings


def test_explicit_backend_ignores_env(newest):
    resolution = newest.resolve(backend="NIXL", env={"TRTLLM_USE_UCX_KVCACHE": "1"})
    assert resolution.backend == "NIXL" and not resolution.diagnostics


def test_env_turns_on_inflight_cancel(newest):
    resolution = newest.resolve(
        architecture="LlamaForCausalLM", backend="NIXL", env={"TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL": "1"}
    )
    assert "inflight_cancel" in resolution.context["features"]
    # Upstream resolves auto as usual (PYTHON here) and then fails the in-flight-cancel gate.
    assert resolution.runtime == "PYTHON"
    assert [d.id for d in resolution.errors] == ["inflight-cancel-requires-cpp"]


def test_process_environment_is_never_read(newest, monkeypatch):
    monkeypatch.setenv("TRTLLM_USE_UCX_KVCACHE", "1")
    assert newest.resolve(backend="DEFAULT").backend == "NIXL"


# -- the start-up errors of background.md ---------------------------------------------------------

STARTUP_ERRORS = [
    (dict(transceiver_runtime="PYTHON", backend="UCX"), "python-requires-nixl"),
    (dict(transceiver_runtime="PYTHON", backend="NIXL", kv_transfer_timeout_ms=None), "python-requires-finite-timeout"),
    (dict(transceiver_runtime="CPP", backend="NIXL", enable_pipelined_transfer=True), "pipelined-transfer-explicit-cpp"),
    (dict(backend="UCX", enable_pipelined_transfer=True), "pipelined-transfer-needs-nixl"),
    (dict(transceiver_runtime="PYTHON", backend="NIXL", features={"inflight_cancel"}), "inflight-cancel-requires-cpp"),
    (dict(backend="MOONCAKE", transceiver_runtime="CPP", features={"inflight_cancel"}), "inflight-cancel-requires-literal-nixl"),
    (dict(backend="DEFAULT", transceiver_runtime="CPP", features={"inflight_cancel"}), "inflight-cancel-requires-literal-nixl"),
    (dict(backend="NIXL", features={"inflight_cancel"}, kv_transfer_timeout_ms=None), "inflight-cancel-requires-finite-timeout"),
    (dict(backend="NIXL", transceiver_runtime="CPP", kv_cache_manager="V2"), "kv-cache-manager-v2-requires-python"),
    (dict(architecture="KimiLinearForCausalLM", backend="NIXL", transceiver_runtime="CPP"), "kimi-k3-requires-python"),
]


@pytest.mark.parametrize(("fields", "error_id"), STARTUP_ERRORS)
def test_startup_errors(newest, fields, error_id):
    resolution = newest.resolve(**fields)
    assert error_id in [d.id for d in resolution.errors]
    assert not resolution.ok
    with pytest.raises(ResolutionError, match=error_id):
        resolution.raise_for_errors()
    for error in resolution.errors:
        assert "To fix:" in error.message and error.fix
        path, line, column = error.location.rsplit(":", 2)
        assert path.endswith(f"{NEWEST_AUTO}.toml") and int(line) > 1 and int(column) >= 1


def test_sync_timing_output_with_python_is_advice(newest):
    resolution = newest.resolve(architecture="LlamaForCausalLM", backend="NIXL", features={"sync_timing_output"})
    assert resolution.runtime == "PYTHON" and resolution.ok
    assert [d.id for d in resolution.warnings] == ["sync-timing-output-needs-cpp"]


def test_mpi_is_deprecated(newest):
    resolution = newest.resolve(backend="MPI")
    assert [d.id for d in resolution.warnings] == ["mpi-backend-deprecated"] and resolution.ok


# -- disaggregation off, contexts, API ------------------------------------------------------------


def test_disaggregation_off_resolves_and_reports_nothing(newest):
    resolution = newest.resolve(architecture="KimiK3ForCausalLM", backend=None, transceiver_runtime="CPP")
    assert not resolution.enabled
    assert dict(resolution.values) == {} and dict(resolution.decided_by) == {}
    assert resolution.runtime is None and resolution.backend is None
    assert resolution.diagnostics == () and resolution.ok


def test_whole_config_mapping_and_field_override(newest):
    config = {"backend": "NIXL", "transceiver_runtime": "auto", "kv_transfer_timeout_ms": 5000, "kv_cache_bounce_size_mb": 0}
    assert newest.resolve(config, architecture="LlamaForCausalLM").runtime == "PYTHON"
    assert newest.resolve(config, architecture="LlamaForCausalLM", transceiver_runtime="CPP").runtime == "CPP"


def test_defaults(newest):
    resolution = newest.resolve()
    assert resolution.context["transceiver_runtime"] == "auto"
    assert resolution.context["kv_transfer_timeout_ms"] == 60000
    assert resolution.context["features"] == frozenset()
    assert resolution.values == {"backend": "NIXL", "transceiver_runtime": "PYTHON", "kv_cache_manager": "V1"}


@pytest.mark.parametrize(
    ("fields", "field", "fragment"),
    [
        (dict(backnd="NIXL"), "backnd", "did you mean 'backend'"),
        (dict(backend="nixl"), "backend", "did you mean 'NIXL'"),
        (dict(transceiver_runtime="python"), "transceiver_runtime", "did you mean 'PYTHON'"),
        (dict(kv_transfer_timeout_ms=0), "kv_transfer_timeout_ms", "positive number"),
        (dict(kv_transfer_timeout_ms=True), "kv_transfer_timeout_ms", "positive number"),
        (dict(features={"inflight_cancle"}), "features", "did you mean 'inflight_cancel'"),
        (dict(features="inflight_cancel"), "features", "set of feature names"),
        (dict(env={"A": 1}), "env", "must be strings"),
        (dict(architecture=""), "architecture", "architecture name"),
        (dict(kv_cache_manager=None), "kv_cache_manager", "use 'auto'"),
        (dict(enable_pipelined_transfer="yes"), "enable_pipelined_transfer", "true or false"),
        (dict(pretrained_config={"architectures": "LlamaForCausalLM"}), "pretrained_config", "list of names"),
        (dict(architecture="A", pretrained_config={"architectures": ["B"]}), "architecture", "contradicts"),
    ],
)
def test_context_errors(newest, fields, field, fragment):
    with pytest.raises(ContextError) as info:
        newest.resolve(**fields)
    assert info.value.field == field
    assert fragment in str(info.value)


def test_config_must_be_a_mapping(newest):
    with pytest.raises(ContextError, match="mapping"):
        newest.resolve(["backend", "NIXL"])


def test_module_level_resolve_uses_newest():
    resolution = kvpolicy.resolve(architecture="LlamaForCausalLM", backend="NIXL")
    assert resolution.policy_version == VERSIONS[-1]
    assert resolution.runtime == "PYTHON"


def test_resolution_is_immutable_and_serialisable(newest):
    resolution = newest.resolve(architecture="LlamaForCausalLM", backend="UCX")
    with pytest.raises(AttributeError):
        resolution.runtime = "CPP"  # type: ignore[misc]
    with pytest.raises(TypeError):
        resolution.values["transceiver_runtime"] = "CPP"  # type: ignore[index]
    data = resolution.to_dict()
    assert data["values"]["transceiver_runtime"] == "PYTHON"
    assert data["diagnostics"][0]["id"] == "python-requires-nixl"
    assert data["policy_digest"] == newest.digest
    assert "error" in repr(resolution) or "ok=False" in repr(resolution)


def test_trace_names_winner_and_losers(newest):
    resolution = newest.resolve(architecture="LlamaForCausalLM", backend="UCX", transceiver_runtime="auto")
    steps = [s for s in resolution.trace if s.decision == "transceiver_runtime"]
    outcomes = {s.rule: s.outcome for s in steps}
    assert outcomes["runtime-preference[LlamaForCausalLM]"] == "decided"
    assert outcomes["auto-cpp-off-nixl"] == "lost"
    assert outcomes["runtime-default-python"] == "lost"
    assert outcomes["null-runtime-cpp"] == "skipped"
    text = str(resolution.trace)
    assert "transceiver_runtime:" in text and "adopted verbatim" in text


def test_config_mapping_without_backend_is_disaggregation_off(newest):
    # Upstream's CacheTransceiverConfig defaults backend to None: no transceiver starts.
    assert not newest.resolve({"kv_transfer_timeout_ms": 30000}).enabled
    assert newest.resolve({"kv_transfer_timeout_ms": 30000}, backend="NIXL").enabled
    assert newest.resolve(kv_transfer_timeout_ms=30000).backend == "NIXL"  # keywords: DEFAULT


def test_only_the_exact_value_1_turns_in_flight_cancel_on():
    # #15238: getenv("TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL", "0") == "1"; unset, "0", "true" and "" leave it off.
    variable = "TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL"
    unset = [{}, {"TRTLLM_USE_NIXL_KVCACHE": "1"}]  # the variable absent (another one set beside it)
    cases = [(env, False) for env in unset] + [
        ({variable: value}, value == "1") for value in ("1", "0", "", "true", "01", " 1")
    ]
    for env, on in cases:
        resolution = kvpolicy.resolve(backend="NIXL", transceiver_runtime="PYTHON", env=env)
        assert ("inflight_cancel" in resolution.context["features"]) is on, env
        assert resolution.ok is not on, env  # cancel refuses PYTHON
        assert ("inflight-cancel-requires-cpp" in [d.id for d in resolution.errors]) is on, env


def test_a_nixl_plugin_variable_set_to_empty_is_not_ucx():
    # The gate reads getenv("TRTLLM_NIXL_KVCACHE_BACKEND", "UCX"): unset is UCX, set to "" is not.
    import kvpolicy

    base = {"TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL": "1"}
    ok = kvpolicy.resolve(architecture="MistralForCausalLM", backend="NIXL", transceiver_runtime="CPP", kv_cache_manager="auto", env=base)
    assert ok.ok
    empty = kvpolicy.resolve(
        architecture="MistralForCausalLM", backend="NIXL", transceiver_runtime="CPP", kv_cache_manager="auto",
        env={**base, "TRTLLM_NIXL_KVCACHE_BACKEND": ""}
    )
    assert [d.id for d in empty.errors] == ["inflight-cancel-requires-ucx-plugin"]
    assert empty.to_dict()["context"]["env"]["TRTLLM_NIXL_KVCACHE_BACKEND"] == ""  # shown as written


def test_a_model_type_row_wins_over_the_plain_row_of_its_architecture(tmp_path, policy_text):
    # Upstream's hooks see the checkpoint's config: a model_type-qualified row is the more specific
    # one, whatever the order of the rows in the file.
    plain = '  { architecture = "LlamaForCausalLM", value = "PYTHON",'
    assert plain in policy_text
    qualified = (
        '  { architecture = "LlamaForCausalLM", model_type = "llama_cpp_only", value = "CPP", reason = "r", source = "s" },\n'
    )
    for text in (policy_text.replace(plain, qualified + plain, 1), policy_text.replace(plain, plain, 1).replace(
        "\n]\n\n[decisions.kv_cache_manager]", "\n" + qualified.rstrip("\n") + "\n]\n\n[decisions.kv_cache_manager]", 1
    )):
        edited = kvpolicy.load(write(tmp_path, text))
        special = edited.resolve(pretrained_config={"architectures": ["LlamaForCausalLM"], "model_type": "llama_cpp_only"}, backend="NIXL")
        assert special.runtime == "CPP"
        assert special.decided_by["transceiver_runtime"] == "runtime-preference[LlamaForCausalLM,model_type=llama_cpp_only]"
        usual = edited.resolve(pretrained_config={"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, backend="NIXL")
        assert usual.runtime == "PYTHON" and usual.decided_by["transceiver_runtime"] == "runtime-preference[LlamaForCausalLM]"


def test_a_left_out_field_requests_the_versions_field_default(capsys):
    # #17495 (TensorRT-LLM 1.4): CacheTransceiverConfig.transceiver_runtime defaults to PYTHON and
    # use_kv_cache_manager_v2 to true; before it both default to auto. A left-out field is not auto.
    from kvpolicy.cli import main

    v14, before = kvpolicy.load(version="2026.10.22"), kvpolicy.load(version="2026.09.28")
    assert set(v14.left_out()) == {"transceiver_runtime", "kv_cache_manager"} and before.left_out() == {}
    assert v14.left_out()["transceiver_runtime"][0] == "PYTHON" and v14.left_out()["kv_cache_manager"][0] == "V2"
    left_out = v14.resolve({"backend": "NIXL"}, architecture="MistralForCausalLM")  # a config's section
    assert left_out.context["transceiver_runtime"] == "PYTHON" and left_out.decided_by["transceiver_runtime"] == "explicit"
    assert (left_out.runtime, left_out.kv_cache_manager, left_out.ok) == ("PYTHON", "V2", True)
    on_ucx = v14.resolve(architecture="Qwen4ExpForCausalLM", backend="UCX")
    assert not on_ucx.ok and "python-requires-nixl" in [d.id for d in on_ucx.errors]  # no C++ fallback
    written = v14.resolve(architecture="Qwen4ExpForCausalLM", backend="UCX", transceiver_runtime="auto", kv_cache_manager="auto")
    assert (written.runtime, written.kv_cache_manager, written.ok) == ("CPP", "V1", True)  # #18134's auto, as before
    older = before.resolve(architecture="Qwen4ExpForCausalLM", backend="UCX")
    assert (older.runtime, older.kv_cache_manager, older.ok) == ("CPP", "V1", True)
    # The CLI says when a left-out field took the version's default, and not when it was given.
    assert main(["resolve", "--arch", "MistralForCausalLM", "--backend", "NIXL", "--version", "2026.10.22"]) == 0
    out = capsys.readouterr().out
    assert (
        "note: transceiver_runtime left out: PYTHON, the config field's default in policy 2026.10.22 (#17495);"
        " --runtime auto asks the policy to decide"
    ) in out
    assert "note: kv_cache_manager left out: V2" in out
    assert main(["resolve", "--arch", "MistralForCausalLM", "--backend", "NIXL", "--version", "2026.10.22", "--runtime", "auto"]) == 0
    out = capsys.readouterr().out
    assert "transceiver_runtime left out" not in out and "kv_cache_manager left out" in out
