"""Hypothesis strategies: contexts over the shipped vocabulary, and small random policies.

The random policies are deliberately wide and reach every construct of the policy language:
requirements, preferences (with ``adopt_when`` and a notice when not adopted; a plain row beside a
model_type-qualified row for one architecture), ordered conditionals, defaults, adjustments (which
may read every decision), ``null = "policy"`` or a value, conditions on ``requested.*`` (what the
user wrote: ``DEFAULT``, ``auto``, ``null``), environment matchers that name '' (unset), lists and
negations, notices, features (one bound to a variable), constraints, and a backend set that can
differ between two versions. The read, evaluate, lint and analyse suites all draw from them.
"""

from __future__ import annotations

from typing import Any

import tomlkit
from hypothesis import strategies as st

import kvpolicy
from kvpolicy.read.loader import shipped_root


def _named_by_the_policies() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """Every architecture a shipped version names, and every (architecture, model_type) a row or
    checkpoint rule reads."""
    names: set[str] = set()
    qualified: set[tuple[str, str]] = set()
    for version in kvpolicy.load().versions():
        policy = kvpolicy.load(version=version).policy
        names |= set(policy.architectures())
        qualified |= {(row.architecture, row.model_type) for row in policy.rows() if row.model_type}
        for rule in policy.checkpoint_rules:
            names.add(rule.architecture)
            qualified |= {(rule.architecture, model_type) for model_type in rule.model_type}
    return tuple(sorted(names)), tuple(sorted(qualified))


#: The architectures the shipped policies name, and the model_types their rows and checkpoint rules read.
ARCHITECTURES, QUALIFIED = _named_by_the_policies()
FEATURES = ("serialized_state", "inflight_cancel", "sync_timing_output", "pipelined_transfer")
BACKEND_ENV = ("TRTLLM_USE_NIXL_KVCACHE", "TRTLLM_USE_UCX_KVCACHE", "TRTLLM_USE_MOONCAKE_KVCACHE", "TRTLLM_USE_MPI_KVCACHE")
ENV_VARS = (*BACKEND_ENV, "TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL", "TRTLLM_NIXL_KVCACHE_BACKEND", "TRTLLM_DISAGG_LAYERWISE")


def _model(architectures: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """The model as a caller names it: an architecture, a checkpoint's config (architectures[0] and
    model_type, as the qualified rows and checkpoint rules read it), or nothing."""
    unknown = "SomeOtherForCausalLM"
    return st.one_of(
        st.builds(lambda a: {"architecture": a}, st.sampled_from((*architectures, None, unknown))),
        st.builds(
            lambda pair: {"pretrained_config": {"architectures": [pair[0]], "model_type": pair[1]}},
            st.sampled_from((*QUALIFIED, (unknown, "kimi_k3"), ("DeepseekV3ForCausalLM", "deepseek_v3"))),
        ),
    )


def contexts(architectures: tuple[str, ...] = ARCHITECTURES) -> st.SearchStrategy[dict[str, Any]]:
    """``resolve`` keyword fields over the shipped vocabulary (disaggregation on)."""
    fields = st.fixed_dictionaries(
        {
            "backend": st.sampled_from(("DEFAULT", "NIXL", "UCX", "MPI", "MOONCAKE")),
            "transceiver_runtime": st.sampled_from(("auto", "PYTHON", "CPP", None)),
            "kv_cache_manager": st.sampled_from(("auto", "V1", "V2")),
            "kv_transfer_timeout_ms": st.sampled_from((60000, 1, None)),
            "features": st.frozensets(st.sampled_from(FEATURES[:3])),
            "enable_pipelined_transfer": st.booleans(),
            "env": st.dictionaries(st.sampled_from(ENV_VARS), st.sampled_from(("1", "0", "", "true", "UCX")), max_size=3),
        }
    )
    return st.builds(lambda model, rest: {**model, **rest}, _model(architectures), fields)


# -- random policies ------------------------------------------------------------------------------

RANDOM_ARCHITECTURES = ("ArchA", "ArchB", "ArchC")
MODEL_TYPES = ("t1",)
RUNTIMES = ("CPP", "PYTHON")
BACKENDS = ("NIXL", "UCX", "MPI")
#: A later version may accept a backend an earlier one rejects.
BACKEND_SETS = (BACKENDS, (*BACKENDS, "MOONCAKE"))
#: A runtime's explicit null: decided by the policy (``requested.transceiver_runtime = "null"``) or a value.
NULLS = ("policy", "policy", "CPP", "PYTHON")


def _matcher(values: tuple[str, ...]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(values),
        st.lists(st.sampled_from(values), min_size=1, max_size=2, unique=True),
        st.builds(lambda v: {"not": v}, st.sampled_from(values)),
    )


def _requested(requests: dict[str, tuple[str, ...]]) -> st.SearchStrategy[dict[str, Any]]:
    """``requested.NAME``: a matcher over what the user may write for one decision."""
    return st.sampled_from(tuple(requests)).flatmap(lambda name: st.builds(lambda m: {name: m}, _matcher(requests[name])))


def _condition(
    reads: tuple[str, ...], requests: dict[str, tuple[str, ...]] | None = None, model: bool = True
) -> st.SearchStrategy[dict[str, Any]]:
    parts: dict[str, st.SearchStrategy[Any]] = {}
    if model:
        parts["architecture"] = _matcher(RANDOM_ARCHITECTURES[:2])
        parts["model_type"] = _matcher(MODEL_TYPES)
    parts |= {
        "kv_transfer_timeout_ms": st.sampled_from(("finite", "null")),
        "features": st.dictionaries(st.sampled_from(("f1", "f2")), st.booleans(), min_size=1, max_size=2),
        "env": st.fixed_dictionaries(
            {"E1": st.one_of(st.sampled_from(("1", "")), st.lists(st.sampled_from(("1", "", "x")), min_size=1, max_size=2, unique=True))}
        ),
    }
    values = {"backend": BACKENDS, "transceiver_runtime": RUNTIMES, "kv_cache_manager": ("V1", "V2")}
    for decision in ("backend", "transceiver_runtime", "kv_cache_manager"):
        if decision in reads:
            parts[decision] = _matcher(values[decision])
    if requests:
        parts["requested"] = _requested(requests)  # what the user wrote, whatever the rule may read
    return st.fixed_dictionaries({}, optional=parts)


@st.composite
def _rules(
    draw: Any, prefix: str, values: tuple[str, ...], reads: tuple[str, ...], max_size: int, notice: bool,
    requests: dict[str, tuple[str, ...]] | None = None, model: bool = True,
) -> list[dict[str, Any]]:
    rules = []
    for i in range(draw(st.integers(0, max_size))):
        rule = {"id": f"{prefix}-{i}", "when": draw(_condition(reads, requests, model)), "value": draw(st.sampled_from(values))}
        if notice and draw(st.booleans()):
            rule["notice"] = {"severity": draw(st.sampled_from(("info", "warning"))), "message": "note"}
        rules.append(rule)
    return rules


@st.composite
def _rows(draw: Any, values: tuple[str, ...]) -> list[dict[str, Any]]:
    """Preference rows: plain, model_type-qualified, or both for one architecture (the qualified
    row is the more specific: it wins where the model_type matches, the plain row elsewhere)."""
    rows = []
    for architecture in draw(st.lists(st.sampled_from(RANDOM_ARCHITECTURES), max_size=3, unique=True)):
        kind = draw(st.sampled_from(("plain", "plain", "qualified", "both")))
        if kind in ("plain", "both"):
            rows.append({"architecture": architecture, "value": draw(st.sampled_from(values))})
        if kind in ("qualified", "both"):
            rows.append({"architecture": architecture, "model_type": MODEL_TYPES[0], "value": draw(st.sampled_from(values))})
    if len(rows) > 1 and draw(st.booleans()):
        rows.reverse()  # the qualified row first or last: order must not matter
    return rows


@st.composite
def _decision(
    draw: Any, name: str, values: tuple[str, ...], auto: str, reads: tuple[str, ...], requests: dict[str, tuple[str, ...]],
    null: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"description": name, "values": list(values), "auto": auto}
    if null is not None:
        spec["null"] = null
    if reads:
        spec["inputs"] = list(reads)
    # requested.* of this decision and its inputs only: what the user wrote is known before deciding.
    visible = {k: v for k, v in requests.items() if k == name or k in reads}
    requirements = draw(_rules(f"{name}-req", values, reads, 2, True, visible))
    if requirements:
        spec["requirement"] = requirements
    rows = draw(_rows(values))
    if rows:
        preference: dict[str, Any] = {"id": f"{name}-pref", "rows": rows}
        if draw(st.booleans()):
            preference["adopt_when"] = draw(_condition(reads, visible))
            if draw(st.booleans()):
                preference["on_not_adopted"] = {"severity": "info", "message": "not adopted"}
        spec["preference"] = preference
    conditionals = draw(_rules(f"{name}-cond", values, reads, 2, True, visible))
    if conditionals:
        spec["conditional"] = conditionals
    spec["default"] = {"id": f"{name}-default", "value": draw(st.sampled_from(values))}
    # Creation-time rewrites: after every decision, so they may read every decision. Not the model:
    # the lint analysis does not yet see an adjustment that alone reads the architecture (see
    # tests/lint/test_analysis.py, the xfail test); once it does, drop ``model=False``.
    adjustments = draw(_rules(f"{name}-adj", values, ("backend", "transceiver_runtime", "kv_cache_manager"), 1, True, requests, model=False))
    if adjustments:
        spec["adjustment"] = adjustments
    return spec


@st.composite
def policies(draw: Any, version: str = "2026.01.01") -> str:
    """The TOML text of a small, valid random policy."""
    backends = draw(st.sampled_from(BACKEND_SETS))
    null = draw(st.sampled_from(NULLS))
    requests = {
        "backend": ("DEFAULT", *backends),
        "transceiver_runtime": ("auto", *(("null",) if null == "policy" else ()), *RUNTIMES),
        "kv_cache_manager": ("auto", "V1", "V2"),
    }
    data: dict[str, Any] = {
        "schema": 1,
        "version": version,
        "summary": "random",
        "source": "hypothesis",
        "features": {"f1": {"description": "one"}, "f2": {"description": "two", "env": "E2"}},
        "decisions": {
            "backend": draw(_decision("backend", backends, "DEFAULT", (), requests)),
            "transceiver_runtime": draw(_decision("transceiver_runtime", RUNTIMES, "auto", ("backend",), requests, null)),
            "kv_cache_manager": draw(_decision("kv_cache_manager", ("V1", "V2"), "auto", ("backend", "transceiver_runtime"), requests)),
        },
    }
    constraints = []
    for i in range(draw(st.integers(0, 2))):
        condition = draw(_condition(("backend", "transceiver_runtime", "kv_cache_manager"), requests)) or {"backend": "UCX"}
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
            "transceiver_runtime": st.sampled_from(("auto", *RUNTIMES, None)),  # every random policy declares null
            "kv_cache_manager": st.sampled_from(("auto", "V1", "V2")),
            "kv_transfer_timeout_ms": st.sampled_from((1000, None)),
            "features": st.frozensets(st.sampled_from(("f1", "f2"))),
            "env": st.dictionaries(st.sampled_from(("E1", "E2")), st.sampled_from(("1", "x", "")), max_size=2),
        }
    )


CLEAN = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")


@st.composite
def hostile_structures(draw: Any) -> tuple[bytes, bool]:
    """(policy bytes, whether they exceed a pre-parse bound): deep arrays and inline tables, long
    dotted keys and headers, long integers, around and beyond each bound."""
    from kvpolicy.read.policyfile import MAX_BARE_VALUE, MAX_KEY_PARTS, MAX_NESTING

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
