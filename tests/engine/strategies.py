"""Hypothesis strategies: contexts over the shipped vocabulary, and small random policies.

The random policies are deliberately wide: model_type-qualified rows, environment matchers that
name '' (unset), lists and negations, notices, features read by every stage, and a backend set
that can differ between two versions. The engine, lint and diff suites all draw from them.
"""

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

RANDOM_ARCHITECTURES = ("ArchA", "ArchB", "ArchC")
MODEL_TYPES = ("t1",)
RUNTIMES = ("CPP", "PYTHON")
BACKENDS = ("NIXL", "UCX", "MPI")
#: A later version may accept a backend an earlier one rejects.
BACKEND_SETS = (BACKENDS, (*BACKENDS, "MOONCAKE"))


def _matcher(values: tuple[str, ...]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(values),
        st.lists(st.sampled_from(values), min_size=1, max_size=2, unique=True),
        st.builds(lambda v: {"not": v}, st.sampled_from(values)),
    )


def _condition(reads: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    parts: dict[str, st.SearchStrategy[Any]] = {
        "architecture": _matcher(RANDOM_ARCHITECTURES[:2]),
        "model_type": _matcher(MODEL_TYPES),
        "kv_transfer_timeout_ms": st.sampled_from(("finite", "null")),
        "features": st.dictionaries(st.sampled_from(("f1", "f2")), st.booleans(), min_size=1, max_size=2),
        "env": st.fixed_dictionaries(
            {"E1": st.one_of(st.sampled_from(("1", "")), st.lists(st.sampled_from(("1", "", "x")), min_size=1, max_size=2, unique=True))}
        ),
    }
    for decision, values in (("backend", BACKENDS), ("transceiver_runtime", RUNTIMES)):
        if decision in reads:
            parts[decision] = _matcher(values)
    return st.fixed_dictionaries({}, optional=parts)


@st.composite
def _rules(draw: Any, prefix: str, values: tuple[str, ...], reads: tuple[str, ...], max_size: int, notice: bool) -> list[dict[str, Any]]:
    rules = []
    for i in range(draw(st.integers(0, max_size))):
        rule = {"id": f"{prefix}-{i}", "when": draw(_condition(reads)), "value": draw(st.sampled_from(values))}
        if notice and draw(st.booleans()):
            rule["notice"] = {"severity": draw(st.sampled_from(("info", "warning"))), "message": "note"}
        rules.append(rule)
    return rules


@st.composite
def _decision(draw: Any, name: str, values: tuple[str, ...], auto: str, reads: tuple[str, ...]) -> dict[str, Any]:
    spec: dict[str, Any] = {"description": name, "values": list(values), "auto": auto}
    if reads:
        spec["inputs"] = list(reads)
    requirements = draw(_rules(f"{name}-req", values, reads, 2, True))
    if requirements:
        spec["requirement"] = requirements
    archs = draw(st.lists(st.sampled_from(RANDOM_ARCHITECTURES), max_size=3, unique=True))
    if archs:
        rows = []
        for a in archs:
            row: dict[str, Any] = {"architecture": a, "value": draw(st.sampled_from(values))}
            if draw(st.integers(0, 3)) == 0:
                row["model_type"] = draw(st.sampled_from(MODEL_TYPES))
            rows.append(row)
        preference: dict[str, Any] = {"id": f"{name}-pref", "rows": rows}
        if draw(st.booleans()):
            preference["adopt_when"] = draw(_condition(reads))
            if draw(st.booleans()):
                preference["on_not_adopted"] = {"severity": "info", "message": "not adopted"}
        spec["preference"] = preference
    conditionals = draw(_rules(f"{name}-cond", values, reads, 2, True))
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
            "backend": draw(_decision("backend", draw(st.sampled_from(BACKEND_SETS)), "DEFAULT", ())),
            "transceiver_runtime": draw(_decision("transceiver_runtime", RUNTIMES, "auto", ("backend",))),
            "kv_cache_manager": draw(_decision("kv_cache_manager", ("V1", "V2"), "auto", ("backend", "transceiver_runtime"))),
        },
    }
    constraints = []
    for i in range(draw(st.integers(0, 2))):
        condition = draw(_condition(("backend", "transceiver_runtime"))) or {"backend": "UCX"}
        constraints.append(
            {"id": f"check-{i}", "severity": draw(st.sampled_from(("warning", "error"))), "when": condition,
             "message": "runtime {transceiver_runtime} on {backend}.", "fix": "change it"}
        )
    if constraints:
        data["constraints"] = constraints
    return tomlkit.dumps(data)


def random_contexts() -> st.SearchStrategy[dict[str, Any]]:
    """Contexts over the random policies' vocabulary."""
    return st.fixed_dictionaries(
        {
            "pretrained_config": st.builds(
                lambda a, t: {"architectures": [a] if a else None, "model_type": t},
                st.sampled_from((*RANDOM_ARCHITECTURES, None)),
                st.sampled_from((*MODEL_TYPES, None)),
            ),
            "backend": st.sampled_from(("DEFAULT", *BACKENDS)),
            "transceiver_runtime": st.sampled_from(("auto", *RUNTIMES)),
            "kv_cache_manager": st.sampled_from(("auto", "V1", "V2")),
            "kv_transfer_timeout_ms": st.sampled_from((1000, None)),
            "features": st.frozensets(st.sampled_from(("f1", "f2"))),
            "env": st.dictionaries(st.sampled_from(("E1", "E2")), st.sampled_from(("1", "x", "")), max_size=2),
        }
    )


from kvpolicy.loader import shipped_root  # noqa: E402

CLEAN = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")


@st.composite
def hostile_structures(draw: Any) -> tuple[bytes, bool]:
    """(policy bytes, whether they exceed a pre-parse bound): deep arrays and inline tables, long
    dotted keys and headers, long integers, around and beyond each bound."""
    from kvpolicy.policyfile import MAX_BARE_VALUE, MAX_KEY_PARTS, MAX_NESTING

    kind = draw(st.sampled_from(("array", "inline", "mixed", "dotted-key", "header", "integer")))
    if kind in ("array", "inline", "mixed"):
        depth = draw(st.one_of(st.integers(1, MAX_NESTING + 2), st.integers(MAX_NESTING, 3000)))
        opens = [draw(st.sampled_from("[{")) if kind == "mixed" else ("[" if kind == "array" else "{") for _ in range(depth)]
        value = "1"
        for bracket in reversed(opens):
            value = f"[{value}]" if bracket == "[" else f"{{a = {value}}}"
        return (CLEAN + f"\nx = {value}\n").encode(), depth > MAX_NESTING
    if kind in ("dotted-key", "header"):
        parts = draw(st.one_of(st.integers(1, MAX_KEY_PARTS + 2), st.integers(MAX_KEY_PARTS, 30_000)))
        key = ".".join(draw(st.sampled_from(["a", '"q.u"', "'l'", "b-c"])) for _ in range(1)) if parts == 1 else ".".join(["k"] * parts)
        line = f"[{key}]\n" if kind == "header" else f"{key} = 1\n"
        text = CLEAN + "\n" + line if kind == "header" else line + CLEAN
        return text.encode(), parts > MAX_KEY_PARTS
    digits = draw(st.one_of(st.integers(1, MAX_BARE_VALUE + 2), st.integers(MAX_BARE_VALUE, 20_000)))
    sign = draw(st.sampled_from(["", "-", "+"]))
    return CLEAN.replace("schema = 1", f"schema = {sign}{'1' * digits}", 1).encode(), len(sign) + digits > MAX_BARE_VALUE
