"""The diff's own lookups, on small policies: which group a context falls in."""

from __future__ import annotations

import itertools
from pathlib import Path

import kvpolicy
from kvpolicy.analyse.cubes import points
from kvpolicy.analyse.diff import diff_policies
from kvpolicy.analyse.evaluators import outcome_of

from tests.support.constants import CLEAN
from tests.support.domain import context_of


def test_every_changed_context_falls_in_its_own_group_and_an_unchanged_one_in_none(tmp_path: Path) -> None:
    # Two edits that change different contexts in different ways: GPT-OSS's row (its runtime) and
    # the manager's default (every context's manager). Each point of each group is found in that
    # group, and a context neither edit reaches in none.
    base = CLEAN.read_text(encoding="utf-8")
    edited = base.replace('value = "PYTHON", reason = "GPT-OSS prefers PYTHON."', 'value = "CPP", reason = "GPT-OSS prefers PYTHON."')
    edited = edited.replace('default = { id = "kv-cache-manager-default-v1", value = "V1"', 'default = { id = "kv-cache-manager-default-v1", value = "V2"')
    assert edited.count('"V2"') == 2 and 'value = "CPP", reason = "GPT-OSS' in edited
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "p.toml").write_text(base, encoding="utf-8")
    (tmp_path / "new" / "p.toml").write_text(edited, encoding="utf-8")
    old, new = kvpolicy.load(tmp_path / "old" / "p.toml"), kvpolicy.load(tmp_path / "new" / "p.toml")
    result = diff_policies(old, new)
    assert len(result.groups) >= 2
    for group in result.groups:
        for cube in group.cubes:
            for point in itertools.islice(itertools.product(*(sorted(v, key=repr) for v in cube)), 200):
                assert result.group_of(point) is group
    unchanged = [
        p
        for p in itertools.islice(points(result.dimensions), 5000)
        if outcome_of(old, context_of(result.dimensions, p)) == outcome_of(new, context_of(result.dimensions, p))
    ]
    assert unchanged, "some context resolves alike (an explicit manager)"
    assert all(result.group_of(p) is None for p in unchanged[:50])


def test_a_rule_is_made_canonical_only_for_the_architecture_it_names() -> None:
    # A preference row's id names its architecture; only that architecture's slot is replaced, so
    # two canonical ids are equal for a context exactly when the real ids are.
    from kvpolicy.analyse.outcomes import canonical_rule, concrete_rule

    assert canonical_rule("pref[LlamaForCausalLM]", "LlamaForCausalLM") == "pref[{architecture}]"
    assert canonical_rule("pref[LlamaForCausalLM,model_type=llama]", "LlamaForCausalLM") == "pref[{architecture},model_type=llama]"
    assert canonical_rule("pref[MistralForCausalLM]", "LlamaForCausalLM") == "pref[MistralForCausalLM]"
    assert canonical_rule("pref[LlamaForCausalLMX]", "LlamaForCausalLM") == "pref[LlamaForCausalLMX]"
    assert canonical_rule("pref[LlamaForCausalLM]", None) == "pref[LlamaForCausalLM]"
    for rule in ("pref[LlamaForCausalLM]", "pref[LlamaForCausalLM,model_type=llama]", "runtime-default"):
        assert concrete_rule(canonical_rule(rule, "LlamaForCausalLM"), "LlamaForCausalLM") == rule
