"""No green light without knowing the model: the verdict over every model an unknown architecture may be.

The property: for a context whose architecture is unknown, the verdict is the union of the
per-architecture verdicts. Every architecture the policy names (and one it does not) resolved on its
own must land in the outcome the verdict lists it in, with the same values and start verdict; the
status is "starts" only when every one of them starts.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import kvpolicy
from kvpolicy.cli import main
from kvpolicy.evaluate.verdict import CANNOT_START, DEPENDS, STARTS

from tests.support import upstream

VERSIONS = list(upstream.VERSION_STATE)
_UNNAMED = "SomeModelNoPolicyNamesForCausalLM"

contexts = st.fixed_dictionaries(
    {
        "backend": st.sampled_from(["DEFAULT", "NIXL", "UCX", "MPI", "MOONCAKE"]),
        "transceiver_runtime": st.sampled_from(["auto", "CPP", "PYTHON", None]),
        "kv_transfer_timeout_ms": st.sampled_from([60000, None]),
        "kv_cache_manager": st.sampled_from(["auto", "V1", "V2"]),
        "env": st.sampled_from([{}, {"TRTLLM_USE_UCX_KVCACHE": "1"}, {"TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL": "1"}]),
    }
)


def _model_fields(architecture, model_type):
    if architecture is None:
        architecture = _UNNAMED
    if model_type is None:
        return {"architecture": architecture}
    return {"pretrained_config": {"architectures": [architecture], "model_type": model_type}}


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from(VERSIONS), fields=contexts)
def test_the_verdict_of_an_unknown_architecture_is_the_union_of_every_architectures_verdict(version, fields):
    policy_set = kvpolicy.load(version=version)
    verdict = policy_set.resolve(**fields).verdict()
    assert not verdict.known
    placed = {model: outcome for outcome in verdict.outcomes for model in outcome.models}
    models = policy_set.models()
    assert set(placed) == set(models), "every class of models is in exactly one outcome"
    assert sum(len(o.models) for o in verdict.outcomes) == len(models)
    oks = set()
    for model in models:
        alone = policy_set.resolve(**fields, **_model_fields(*model))
        outcome = placed[model]
        assert dict(alone.values) == dict(outcome.resolution.values), model
        assert alone.ok == outcome.ok, model
        oks.add(alone.ok)
    expected = STARTS if oks == {True} else CANNOT_START if oks == {False} else DEPENDS
    if fields["backend"] is not None:
        assert verdict.status == expected


def test_a_named_architecture_is_one_verdict():
    verdict = kvpolicy.resolve(architecture="LlamaForCausalLM", backend="UCX").verdict()
    assert verdict.known and len(verdict.outcomes) == 1
    assert verdict.status == CANNOT_START and verdict.exit_code == 1


def test_an_unknown_architecture_on_ucx_depends_on_the_model():
    verdict = kvpolicy.load(version="2026.09.10").verdict(backend="UCX")
    assert verdict.status == DEPENDS and verdict.exit_code == 3
    failing = {label for outcome in verdict.failing for label in outcome.labels}
    assert "DeepseekV3ForCausalLM" in failing and "LlamaForCausalLM" in failing
    assert "any other architecture" in {label for outcome in verdict.starting for label in outcome.labels}
    assert verdict.summary().startswith("depends on the model: cannot start for ")


def test_an_unknown_architecture_that_starts_for_every_model_says_so():
    verdict = kvpolicy.load(version="2026.09.10").verdict(backend="NIXL")
    assert verdict.status == STARTS and verdict.exit_code == 0
    assert "starts for every architecture" in verdict.summary()


def test_model_type_classes_are_told_apart():
    # 2026.07.23: DeepSeek-V3's class prefers PYTHON for GLM checkpoints only (adopted on NIXL
    # without a timeout check, so a null timeout then fails), the others keep C++.
    verdict = kvpolicy.load(version="2026.07.23").verdict(backend="NIXL", kv_transfer_timeout_ms=None)
    failing = {label for outcome in verdict.failing for label in outcome.labels}
    assert "DeepseekV3ForCausalLM (model_type glm_moe_dsa)" in failing
    assert "DeepseekV3ForCausalLM" not in failing


def test_the_cli_never_says_can_start_when_some_model_fails(capsys):
    code = main(["resolve", "--backend", "UCX", "--version", "2026.09.10"])
    out = capsys.readouterr().out
    assert code == 3
    assert "can start" not in out
    assert "depends on the model: cannot start for" in out and "starts for" in out


def test_the_cli_json_verdict_of_an_unknown_architecture(capsys):
    import json

    code = main(["resolve", "--backend", "UCX", "--version", "2026.09.10", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 3
    assert data["ok"] is False
    assert data["verdict"]["status"] == DEPENDS and data["verdict"]["architecture_known"] is False
    assert all(entry["resolutions"] for entry in data["verdict"]["outcomes"])


def test_the_classes_of_models_are_the_diffs_partition():
    # The verdict enumerates what the diff's domain enumerates: one machinery, not two.
    from kvpolicy.evaluate.domain import domain_of

    for version in VERSIONS:
        policy_set = kvpolicy.load(version=version)
        assert policy_set.models() == domain_of(policy_set.policy).models, version
