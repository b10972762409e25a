"""The models the policies are compared with the upstream oracle over (tests/support/upstream.py).

Kept apart from the oracle itself: the oracle restates upstream independently of the policy files,
while this list is taken from the policies as well as from the oracle."""

from __future__ import annotations

import kvpolicy

from tests.support import upstream


def models() -> list[tuple[str | None, str | None]]:
    """(architecture, model_type) pairs: every architecture a shipped version names (rows, conditions,
    checkpoint rules) or upstream's registry holds, each model_type a version's rows or checkpoint
    rules read, one name nobody knows and no model at all. Taken from the policies as well as the
    oracle, so a row for a model the oracle lacks is still checked (against upstream's no-preference)."""
    names: set[str] = set(upstream.MODEL_CLASS_MAPPING)
    qualified: set[tuple[str, str]] = {("DeepseekV3ForCausalLM", "deepseek_v3")}
    for version in kvpolicy.load().versions():
        policy = kvpolicy.load(version=version).policy
        names |= set(policy.architectures())
        qualified |= {(row.architecture, row.model_type) for row in policy.rows() if row.model_type}
        for rule in policy.checkpoint_rules:
            names.add(rule.architecture)
            if rule.multimodal is not True:  # a plain checkpoint (no text and vision configs)
                for model_type in rule.model_type:  # whatever its architectures[0] says
                    qualified |= {(rule.architecture, model_type), ("SomeNewModelForCausalLM", model_type)}
    return [(a, None) for a in sorted(names)] + sorted(qualified) + [("SomeNewModelForCausalLM", None), (None, None)]


#: :func:`models`, computed once.
MODELS = models()
