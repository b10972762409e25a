"""Upstream's strictness on the two LLM-argument sections kvpolicy reads.

TensorRT-LLM validates ``cache_transceiver_config`` and ``kv_cache_config`` with pydantic models
that forbid unknown fields (``CacheTransceiverConfig`` / ``KvCacheConfig``, both
``StrictBaseModel``, in ``tensorrt_llm/llmapi/llm_args.py``), and the LLM arguments themselves
(``BaseLlmArgs``) forbid unknown keys too: a misspelt field means the server does not start. The
models here mirror those two sections' field names, with loose types where kvpolicy does not read
a field, so :func:`check_sections` can say which key of a server's settings upstream refuses.

kvpolicy does not know every LLM argument, so an unknown top-level key is refused only when it is
a near miss of one of the two section names (:func:`misspelling_of`), e.g.
``cache_transciever_config``.

pydantic is imported on first use (and only for a section with a field outside the lists), never at
import: only reading a serving config needs it, and a plain ``kvpolicy resolve`` must not pay for it.
:mod:`kvpolicy.serving.layouts` turns each refusal into a problem of the server.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from ..read.fields import CACHE_TRANSCEIVER_FIELDS
from ..wording import closest

__all__ = ["KV_CACHE_FIELDS", "SECTIONS", "Refusal", "check_sections", "misspelling_of"]

#: Every field of upstream's ``KvCacheConfig`` (llm_args.py, stored commit 00043967; docs 1.3.0rc27).
KV_CACHE_FIELDS = frozenset(
    {
        "enable_block_reuse",
        "max_tokens",
        "max_attention_window",
        "sink_token_length",
        "free_gpu_memory_fraction",
        "host_cache_size",
        "disk_cache_size",
        "disk_cache_path",
        "cross_kv_cache_fraction",
        "secondary_offload_min_priority",
        "event_buffer_max_size",
        "attention_dp_events_gather_period_ms",
        "kv_events_config",
        "enable_partial_reuse",
        "copy_on_partial_reuse",
        "use_uvm",
        "max_gpu_total_bytes",
        "iteration_stats_interval",
        "dtype",
        "mamba_ssm_cache_dtype",
        "mamba_ssm_stochastic_rounding",
        "mamba_ssm_philox_rounds",
        "tokens_per_block",
        "mamba_state_cache_interval",
        "mamba_state_config",
        "use_kv_cache_manager_v2",
        "enable_swa_scratch_reuse",
        "kv_cache_event_hash_algo",
        "max_util_for_resume",
        "enable_kv_pool_rebalance",
        "kv_pool_rebalance_min_sampled_kv_caches",
        "kv_pool_rebalance_cooldown_secs",
        "kv_pool_rebalance_target_ratio_update_interval",
        "kv_pool_rebalance_ratio_threshold",
        "kv_pool_rebalance_moving_average_decay",
        "kv_pool_rebalance_check_interval",
        "disk_prefetch_num_reqs",
        "fp8_context_mla_kv_len_cap",
        "pool_ratio",
        "avg_seq_len",
        "block_reuse_config",
    }
)

#: The LLM-argument sections checked here, with their fields.
SECTIONS: Mapping[str, frozenset[str]] = {
    "cache_transceiver_config": CACHE_TRANSCEIVER_FIELDS,
    "kv_cache_config": KV_CACHE_FIELDS,
}

#: How close a key must be to a section name to be taken for it (difflib's ratio).
NEAR_MISS_RATIO = 0.85

_REFUSED = 'TensorRT-LLM refuses unknown {what} (pydantic extra="forbid"), so this server does not start'


@cache
def _models() -> dict[str, Any]:
    """The pydantic models of the two sections, built once, on first use."""
    from typing import Literal

    from pydantic import ConfigDict, create_model

    strict = ConfigDict(extra="forbid")
    # Types only where kvpolicy reads the field; their type errors are reported by serving.py's own
    # checks and the policy (one message per mistake), so only unknown fields are taken from here.
    typed: dict[str, Any] = {
        "backend": str | None,
        "transceiver_runtime": str | None,
        "use_kv_cache_manager_v2": bool | Literal["auto"] | None,
    }
    # Each field (type, default None); typed as Any values so that they can be keyword arguments
    # of create_model, whose own keywords (__base__, __module__...) are not of that type.
    cache_fields: dict[str, Any] = {name: (typed.get(name, Any), None) for name in sorted(CACHE_TRANSCEIVER_FIELDS)}
    kv_fields: dict[str, Any] = {name: (typed.get(name, Any), None) for name in sorted(KV_CACHE_FIELDS)}
    return {
        "cache_transceiver_config": create_model("CacheTransceiverConfig", __config__=strict, **cache_fields),
        "kv_cache_config": create_model("KvCacheConfig", __config__=strict, **kv_fields),
    }


def misspelling_of(key: Any) -> str | None:
    """The section name (``cache_transceiver_config`` or ``kv_cache_config``) that ``key`` is a near
    miss of: not equal, but equal ignoring case and underscores, or difflib ratio >= 0.85. None for
    the section names themselves and for every other key (kvpolicy does not know every LLM argument,
    so other unknown keys are left alone)."""
    if not isinstance(key, str) or key in SECTIONS:
        return None
    return closest(key.lower(), SECTIONS, cutoff=NEAR_MISS_RATIO, separators=True)


#: A refused key: its path in the document, and the message.
Refusal = tuple[tuple[Any, ...], str]


def check_sections(settings: Mapping[Any, Any], origin: Mapping[Any, tuple[Any, ...]]) -> list[Refusal]:
    """What upstream refuses in a server's effective LLM arguments: keys that are near misses of
    the two section names, and unknown fields inside either section. ``origin`` maps each key of
    ``settings`` to the path of the section it came from (``()`` for the top level), so each
    problem carries the exact key path, e.g. ``("context_servers", "cache_transceiver_config",
    "kv_transfer_timout_ms")``. A section that is not a mapping is left to the caller's checks."""
    problems: list[Refusal] = []
    for key in settings:
        meant = misspelling_of(key)
        if meant is not None:
            problems.append(
                (
                    (*origin.get(key, ()), key),
                    f"unknown LLM argument {key}; did you mean {meant!r}? " + _REFUSED.format(what="LLM arguments"),
                )
            )
    for section, known in SECTIONS.items():
        value = settings.get(section)
        if not isinstance(value, Mapping) or all(isinstance(k, str) and k in known for k in value):
            continue  # the common case needs no pydantic
        by_name = {str(k): k for k in value}
        from pydantic import ValidationError

        try:
            _models()[section].model_validate({str(k): v for k, v in value.items()})
            continue
        except ValidationError as exc:
            errors = exc.errors()
        at = (*origin.get(section, ()), section)
        for error in errors:
            if error.get("type") != "extra_forbidden" or not error.get("loc"):
                continue
            field = str(error["loc"][0])
            meant = closest(field.lower(), known, cutoff=0.7, separators=True)
            hint = f"; did you mean {meant!r}?" if meant else ";"
            problems.append(
                (
                    (*at, by_name.get(field, field)),
                    f"unknown field {field} of {section}{hint} " + _REFUSED.format(what="fields"),
                )
            )
    return problems
