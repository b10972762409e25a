"""Hypothesis strategies: contexts over a policy's domain, and small random policies."""

from __future__ import annotations

from typing import Any

import tomlkit
from hypothesis import strategies as st

ARCHITECTURES = ("LlamaForCausalLM", "GptOssForCausalLM", "MistralForCausalLM", "KimiK3ForCausalLM", "Gemma4ForCausalLM")
FEATURES = ("serialized_state", "inflight_cancel", "sync_timing_output", "pipelined_transfer")
BACKEND_ENV = ("TRTLLM_USE_NIXL_KVCACHE", "TRTLLM_USE_UCX_KVCACHE", "TRTLLM_USE_MOONCAKE_KVCACHE", "TRTLLM_USE_MPI_KVCACHE")
ENV_VARS = (*BACKEND_ENV, "TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL")


def contexts(architectures: tuple[str, ...] = ARCHITECTURES) -> st.SearchStrategy[dict[str, Any]]:
    """``resolve`` keyword fields over the shipped vocabulary (disaggregation on)."""
    return st.fixed_dictionaries(
        {
            "architecture": st.sampled_from((*architectures, None, "SomeOtherForCausalLM")),
            "backend": st.sampled_from(("DEFAULT", "NIXL", "UCX", "MPI", "MOONCAKE")),
            "transceiver_runtime": st.sampled_from(("auto", "PYTHON", "CPP", None)),
            "kv_cache_manager": st.sampled_from(("auto", "V1", "V2")),
            "kv_transfer_timeout_ms": st.sampled_from((60000, 1, None)),
            "features": st.frozensets(st.sampled_from(FEATURES[:3])),
            "enable_pipelined_transfer": st.booleans(),
            "env": st.dictionaries(st.sampled_from(ENV_VARS), st.sampled_from(("1", "0", "", "true")), max_size=3),
        }
    )


# -- random policies ------------------------------------------------------------------------------

_RUNTIMES = ("CPP", "PYTHON")
_BACKENDS = ("NIXL", "UCX", "MPI")


def _matcher(values: tuple[str, ...]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(values),
        st.lists(st.sampled_from(values), min_size=1, max_size=2, unique=True),
        st.builds(lambda v: {"not": v}, st.sampled_from(values)),
    )


def _condition(reads: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    parts: dict[str, st.SearchStrategy[Any]] = {
        "architecture": _matcher(ARCHITECTURES[:3]),
        "kv_transfer_timeout_ms": st.sampled_from(("finite", "null")),
        "features": st.dictionaries(st.sampled_from(("f1", "f2")), st.booleans(), min_size=1, max_size=2),
        "env": st.dictionaries(st.sampled_from(("E1", "E2")), st.sampled_from(("1", "x")), min_size=1, max_size=1),
    }
    if "backend" in reads:
        parts["backend"] = _matcher(_BACKENDS)
    if "transceiver_runtime" in reads:
        parts["transceiver_runtime"] = _matcher(_RUNTIMES)
    return st.fixed_dictionaries({}, optional=parts)


@st.composite
def _rules(draw: Any, prefix: str, values: tuple[str, ...], reads: tuple[str, ...], max_size: int) -> list[dict[str, Any]]:
    count = draw(st.integers(0, max_size))
    return [
        {"id": f"{prefix}-{i}", "when": draw(_condition(reads)), "value": draw(st.sampled_from(values))}
        for i in range(count)
    ]


@st.composite
def _decision(draw: Any, name: str, values: tuple[str, ...], auto: str, reads: tuple[str, ...]) -> dict[str, Any]:
    spec: dict[str, Any] = {"description": name, "values": list(values), "auto": auto}
    if reads:
        spec["inputs"] = list(reads)
    requirements = draw(_rules(f"{name}-req", values, reads, 2))
    if requirements:
        spec["requirement"] = requirements
    archs = draw(st.lists(st.sampled_from(ARCHITECTURES), max_size=3, unique=True))
    if archs or draw(st.booleans()):
        preference: dict[str, Any] = {
            "id": f"{name}-pref",
            "rows": [{"architecture": a, "value": draw(st.sampled_from(values))} for a in archs],
        }
        if draw(st.booleans()):
            preference["adopt_when"] = draw(_condition(reads))
        spec["preference"] = preference
    conditionals = draw(_rules(f"{name}-cond", values, reads, 3))
    if conditionals:
        spec["conditional"] = conditionals
    spec["default"] = {"id": f"{name}-default", "value": draw(st.sampled_from(values))}
    return spec


@st.composite
def policies(draw: Any, version: str = "2026.01.01") -> str:
    """The TOML text of a small, valid random policy."""
    data: dict[str, Any] = {
        "schema": 1,
        "version": version,
        "summary": "random",
        "source": "hypothesis",
        "features": {"f1": {"description": "one"}, "f2": {"description": "two", "env": "E2"}},
        "decisions": {
            "backend": draw(_decision("backend", _BACKENDS, "DEFAULT", ())),
            "transceiver_runtime": draw(_decision("transceiver_runtime", _RUNTIMES, "auto", ("backend",))),
            "kv_cache_manager": draw(
                _decision("kv_cache_manager", ("V1", "V2"), "auto", ("backend", "transceiver_runtime"))
            ),
        },
    }
    constraints = []
    for i in range(draw(st.integers(0, 3))):
        condition = draw(_condition(("backend", "transceiver_runtime")))
        if not condition:
            condition = {"backend": "UCX"}
        constraints.append(
            {
                "id": f"check-{i}",
                "severity": draw(st.sampled_from(("warning", "error"))),
                "when": condition,
                "message": "runtime {transceiver_runtime} on {backend}.",
                "fix": "change it",
            }
        )
    if constraints:
        data["constraints"] = constraints
    return tomlkit.dumps(data)


def random_contexts() -> st.SearchStrategy[dict[str, Any]]:
    """Contexts over the random policies' vocabulary."""
    return st.fixed_dictionaries(
        {
            "architecture": st.sampled_from((*ARCHITECTURES[:3], None)),
            "backend": st.sampled_from(("DEFAULT", *_BACKENDS)),
            "transceiver_runtime": st.sampled_from(("auto", *_RUNTIMES)),
            "kv_cache_manager": st.sampled_from(("auto", "V1", "V2")),
            "kv_transfer_timeout_ms": st.sampled_from((1000, None)),
            "features": st.frozensets(st.sampled_from(("f1", "f2"))),
            "env": st.dictionaries(st.sampled_from(("E1", "E2")), st.sampled_from(("1", "x")), max_size=2),
        }
    )
