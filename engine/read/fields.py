"""Upstream's ``CacheTransceiverConfig`` fields, as the loader (which features may name) and the
evaluator (which fields a context may carry) both read them: one list, no imports."""

from __future__ import annotations

__all__ = ["CACHE_TRANSCEIVER_FIELDS", "DATED_FIELDS", "MAPPING_FIELDS"]

#: Every field of upstream's ``CacheTransceiverConfig``; ``resolve`` reads some, the rest are passive.
CACHE_TRANSCEIVER_FIELDS = frozenset(
    {
        "backend",
        "transceiver_runtime",
        "kv_transfer_timeout_ms",
        "kv_transfer_sender_future_timeout_ms",
        "kv_transfer_poll_interval_ms",
        "max_tokens_in_buffer",
        "kv_cache_bounce_size_mb",
        "enable_pipelined_transfer",
        "agent_bounce_buffer_enable",
        "agent_bounce_params",
    }
)

#: Fields that exist only from some upstream state on (#15727: enable_pipelined_transfer; #15780: the
#: bounce-buffer fields). A policy version accepts one only through a feature tied to it
#: (``config_field``), so a version modelling a state before the field existed refuses it, as
#: upstream's strict config does.
DATED_FIELDS = frozenset({"enable_pipelined_transfer", "agent_bounce_buffer_enable", "agent_bounce_params"})

#: Dated fields whose value is a mapping (the feature is on when it is non-empty); the others are booleans.
MAPPING_FIELDS = frozenset({"agent_bounce_params"})
