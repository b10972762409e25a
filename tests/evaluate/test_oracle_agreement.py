"""Every shipped version agrees with TensorRT-LLM itself over the whole input domain.

``tests/support/upstream.py`` restates upstream's resolvers, model hooks and start-up checks independently of the
policy files. For every shipped version this test walks every architecture any version names (and
one none names; the list is the union of the policies' names and the oracle's registry), every backend with every combination of DEFAULT's variables, runtime
auto/CPP/PYTHON/null, a finite or null timeout, KV-cache manager auto/V1/V2, pipelined transfer
on/off and in-flight cancel on/off, and the cancel gate's variables where cancel is on, and checks
that the decided values and the start verdict are upstream's.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import kvpolicy

from tests.support import upstream
from tests.support.oracle_inputs import MODELS

VERSIONS = list(upstream.VERSION_STATE)
BACKENDS = ("DEFAULT", "NIXL", "UCX", "MPI", "MOONCAKE")
RUNTIMES = ("auto", "CPP", "PYTHON", None, upstream.LEFT_OUT)
MANAGERS = (("auto", "auto"), ("V1", False), ("V2", True), (upstream.LEFT_OUT, upstream.LEFT_OUT))
#: The cancel gate's variables, each unset or set to what the gate looks at. Set to "" the plugin
#: variable is not UCX: upstream's getenv(name, "UCX") returns "" and the gate refuses it.
GATE = [{}, {"TRTLLM_NIXL_KVCACHE_BACKEND": "UCX"}, {"TRTLLM_NIXL_KVCACHE_BACKEND": "LIBFABRIC"}, {"TRTLLM_NIXL_KVCACHE_BACKEND": ""}] + [
    {variable: "1"} for variable in upstream.GATE_ENV
]
#: The cancel switch: only the exact value "1" turns it on (#15238), so "0" and "true" leave it off.
CANCEL_VALUES = ("1", "0", "true")


def _backend_envs(backend: str) -> list[dict[str, str]]:
    if backend != "DEFAULT":
        return [{}]
    variables = [v for v, _ in upstream.BACKEND_ENV]
    combos = []
    for mask in itertools.product((False, True), repeat=len(variables)):
        combos.append({v: "1" for v, on in zip(variables, mask) if on})
    combos.append({"TRTLLM_USE_UCX_KVCACHE": "true"})  # only "1" counts
    return combos


def _contexts(cancel_gate: bool):
    for (architecture, model_type), backend, runtime, timeout, (manager, use_v2), pipelined in itertools.product(
        MODELS, BACKENDS, RUNTIMES, (60000, None), MANAGERS, (False, True)
    ):
        for env in _backend_envs(backend):
            gates = [(value, gate) for value in CANCEL_VALUES for gate in GATE] if cancel_gate else [(None, None)]
            for value, gate in gates:
                full = dict(env)
                if gate is not None:
                    full[upstream.CANCEL_ENV] = value
                    full.update(gate)
                yield (architecture, model_type, backend, runtime, timeout, manager, use_v2, pipelined, full)


def _given(**fields: Any) -> dict:
    """The fields a caller passes: one left out is not passed at all."""
    return {key: value for key, value in fields.items() if value is not upstream.LEFT_OUT}


def _fields(architecture, model_type, backend, runtime, timeout, manager, pipelined, env) -> dict:
    """The context as a caller passes it to the public ``resolve()``: the engine reads the cancel
    switch from the environment and pipelined transfer from its config field itself."""
    fields = {
        "backend": backend,
        "transceiver_runtime": runtime,
        "kv_transfer_timeout_ms": timeout,
        "kv_cache_manager": manager,
        "env": env,
    }
    # A field left out of the config: the version's field default applies (auto until #17495).
    fields = {key: value for key, value in fields.items() if value is not upstream.LEFT_OUT}
    if model_type is not None:
        fields["pretrained_config"] = {"architectures": [architecture] if architecture else [], "model_type": model_type}
    elif architecture is not None:
        fields["architecture"] = architecture
    if pipelined:
        fields["enable_pipelined_transfer"] = True
    return fields


def _check(version: str, cancel_gate: bool, models: list | None = None) -> int:
    policy_set = kvpolicy.load(version=version)
    mismatches = []
    count = 0
    for architecture, model_type, backend, runtime, timeout, manager, use_v2, pipelined, env in _contexts(cancel_gate):
        if models is not None and (architecture, model_type) not in models:
            continue
        count += 1
        want = upstream.resolve(version, architecture, model_type, backend, runtime, timeout, use_v2, env, pipelined)
        got_resolution = policy_set.resolve(**_fields(architecture, model_type, backend, runtime, timeout, manager, pipelined, env))
        got = (got_resolution.backend, got_resolution.runtime, got_resolution.kv_cache_manager)
        starts = got_resolution.ok
        diagnostics = got_resolution.diagnostics
        if got != (want.backend, want.runtime, want.kv_cache_manager) or starts != want.starts:
            mismatches.append(
                f"{architecture}/{model_type} backend={backend} runtime={runtime} timeout={timeout} kv={manager} "
                f"pipelined={pipelined} env={env}: kvpolicy {got} starts={starts} ({[d.id for d in diagnostics]}), "
                f"upstream {(want.backend, want.runtime, want.kv_cache_manager)} starts={want.starts}"
            )
    assert not mismatches, f"{len(mismatches)} of {count} contexts differ, e.g.:\n" + "\n".join(mismatches[:15])
    return count


@pytest.mark.parametrize("version", VERSIONS)
def test_version_reproduces_upstream(version: str) -> None:
    assert _check(version, cancel_gate=False) > 10_000


@pytest.mark.parametrize("version", VERSIONS)
def test_cancel_gate_reproduces_upstream(version: str) -> None:
    # Every gate variable with a model of each kind (none, PYTHON, PYTHON + V2, Kimi K3).
    models = [(None, None), ("GptOssForCausalLM", None), ("KimiLinearForCausalLM", None), ("MiniMaxM2ForCausalLM", None)]
    assert _check(version, cancel_gate=True, models=models) > 1_000


def test_every_shipped_version_is_checked() -> None:
    assert kvpolicy.load().versions() == VERSIONS


def test_disaggregation_off_resolves_nothing() -> None:
    for version in VERSIONS:
        assert upstream.resolve(version, "LlamaForCausalLM", None, None, "auto", 60000, "auto", {}, False) is None
        assert not kvpolicy.load(version=version).resolve(architecture="LlamaForCausalLM", backend=None).enabled


@pytest.mark.parametrize("version", VERSIONS)
def test_advice_never_changes_a_verdict(version: str) -> None:
    """serialized_state and sync_timing_output are advice (warnings), never values or errors."""
    policy_set = kvpolicy.load(version=version)
    for architecture, backend, runtime in itertools.product(("LlamaForCausalLM", None), BACKENDS, RUNTIMES):
        plain = policy_set.resolve(**_given(architecture=architecture, backend=backend, transceiver_runtime=runtime))
        advised = policy_set.resolve(**_given(
            architecture=architecture, backend=backend, transceiver_runtime=runtime,
            features={"serialized_state", "sync_timing_output"},
        ))
        assert dict(advised.values) == dict(plain.values)
        assert advised.ok == plain.ok
        assert {d.id for d in advised.errors} == {d.id for d in plain.errors}


#: Checkpoints as their config.json reads: (architectures, model_type, extra keys). Upstream's
#: load_pretrained_config rewrites some of them by model_type before the model registry reads
#: architectures[0]; kvpolicy's checkpoint rules must do the same, through the public resolve().
_COMPOSITE = {"text_config": {"hidden_size": 8}, "vision_config": {"hidden_size": 8}}
CHECKPOINTS = [
    (["KimiK3ForCausalLM"], "kimi_k3", {}),
    (["KimiK3ForConditionalGeneration"], "kimi_k3", _COMPOSITE),
    (["KimiK3ForConditionalGeneration"], "kimi_k3", {**_COMPOSITE, "language_model_only": True}),
    (["KimiK3ForConditionalGeneration"], "kimi_k3", {"text_config": {"hidden_size": 8}, "vision_config": {}}),
    (["KimiLinearForCausalLM"], "kimi_linear", {}),
    (["SomeNewModelForCausalLM"], "kimi_linear", {}),
    (["DeepseekV4ForCausalLM"], "deepseek_v4", {}),
    (["LlamaForCausalLM"], "llama", _COMPOSITE),
]


@pytest.mark.parametrize("version", VERSIONS)
def test_checkpoints_resolve_as_upstream_loads_them(version: str) -> None:
    """The raw checkpoint through ``resolve(pretrained_config=...)``: the architecture upstream runs
    after its load-time rewrites, then its values and start verdict."""
    policy_set = kvpolicy.load(version=version)
    mismatches = []
    for (architectures, model_type, extra), backend, runtime, timeout, (manager, use_v2) in itertools.product(
        CHECKPOINTS, ("NIXL", "UCX"), RUNTIMES, (60000, None), MANAGERS
    ):
        composite = bool(extra.get("text_config")) and bool(extra.get("vision_config")) and extra.get("language_model_only") is not True
        want = upstream.resolve(version, architectures[0], model_type, backend, runtime, timeout, use_v2, {}, False, composite)
        got = policy_set.resolve(**_given(
            pretrained_config={"architectures": architectures, "model_type": model_type, **extra},
            backend=backend, transceiver_runtime=runtime, kv_transfer_timeout_ms=timeout, kv_cache_manager=manager,
        ))
        values = (got.backend, got.runtime, got.kv_cache_manager)
        if values != (want.backend, want.runtime, want.kv_cache_manager) or got.ok != want.starts:
            mismatches.append(f"{architectures}/{model_type}/{sorted(extra)} {backend} {runtime} {timeout} {manager}: "
                              f"kvpolicy {values} ok={got.ok}, upstream {want}")
    assert not mismatches, f"{len(mismatches)} differ, e.g.:\n" + "\n".join(mismatches[:10])


def test_the_kimi_k3_text_checkpoint_is_read_as_upstream_reads_it() -> None:
    """The issue's case: a Kimi K3 text checkpoint with explicit CPP on NIXL fails upstream (it loads as
    KimiLinearForCausalLM, which refuses every route but NIXL + PYTHON), whatever architectures[0] says."""
    resolution = kvpolicy.load(version="2026.09.10").resolve(
        pretrained_config={"architectures": ["KimiK3ForCausalLM"], "model_type": "kimi_k3"}, backend="NIXL", transceiver_runtime="CPP"
    )
    assert resolution.context["architecture"] == "KimiLinearForCausalLM"
    assert not resolution.ok
