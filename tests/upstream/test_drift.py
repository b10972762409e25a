"""``compare``: every kind of drift between a tree and a policy version, one test (or more) per kind,
each starting from a tree that states the version exactly and changing one thing."""

from __future__ import annotations

import pytest

import kvpolicy
from kvpolicy.upstream.drift import KINDS, version_fields

from . import trees
from .trees import ARGS, CONFIG_UTILS, IMPORTS, INDEX, LLM_UTILS, MODELS, POLICIES, TRANSCEIVER, Code, drift_of, kinds, line, model_class, module, tree_matching

RT = "transceiver_runtime"
KV = "kv_cache_manager"
POLICY_FILE = "2026.10.22.toml"


def text_at(root, where) -> str:
    return (root / where.file).read_text(encoding="utf-8").splitlines()[where.line - 1]


def policy_line(needle: str, nth: int = 1) -> int:
    return line(POLICIES, POLICY_FILE, needle, nth)


def the_one(drift, kind):
    found = [d for d in drift if d.kind != "no-baseline"]
    assert [d.kind for d in found] == [kind], [(d.kind, d.message) for d in found]
    assert found[0].code == KINDS[kind][0]
    return found[0]


def _shipped_without_model_type_rows() -> list[str]:
    out = []
    for version in kvpolicy.load(str(POLICIES)).versions():
        policy = kvpolicy.load(str(POLICIES), version=version).policy
        if not any(row.model_type for d in policy.decisions.values() if d.preference for row in d.preference.rows):
            out.append(version)
    return out


# -- a tree that states the version --


def test_a_tree_stating_the_version_drifts_only_by_the_missing_baseline(matching, shipped_policy):
    drift = drift_of(matching, shipped_policy)
    assert [d.kind for d in drift] == ["no-baseline"]
    [item] = drift
    assert item.code == "UPS050" and not item.draftable and item.where is None
    assert "2026.10.22 records no [upstream] baseline" in item.message
    assert "8 rule-bearing functions and 9 environment names" in item.message


@pytest.mark.parametrize("version", _shipped_without_model_type_rows())
def test_every_shipped_version_has_no_row_field_or_checkpoint_drift_from_a_tree_stating_it(tmp_path, version):
    policy = kvpolicy.load(str(POLICIES), version=version).policy
    root = tree_matching(policy, tmp_path)
    assert kinds(drift_of(root, policy)) == []


def test_a_tree_recorded_in_the_baseline_has_no_drift_at_all(baselined):
    assert drift_of(baselined.root, baselined.policy) == []


def test_the_matching_tree_exercises_every_idiom(matching):
    """The generator spreads the rows over grouped, defaults, subclass, delegation and super idioms."""
    facts = trees.facts_of(matching)
    classes = {fact.cls.rsplit(".", 2)[-2] for fact in facts.architectures.values()}
    assert {"modeling_kvp_grouped", "modeling_family"} <= classes
    chains = [str(w) for fact in facts.architectures.values() for h in fact.hooks.values() for w in h.chain]
    assert any("modeling_kvp_targets.py" in c for c in chains)  # delegation
    assert any("modeling_kvp_bases.py" in c for c in chains)  # subclass and super
    assert any("TransceiverRuntime." in text_at(matching, h.where) for fact in facts.architectures.values() for h in fact.hooks.values() if h.where)
    assert any("use_kv_cache_manager_v2" in text_at(matching, fact.hooks[KV].where) for fact in facts.architectures.values())
    assert len({fact.cls for fact in facts.architectures.values()}) < len(facts.architectures)  # some classes carry several decorators


# -- rows --


def test_row_missing_when_the_tree_prefers_a_value_the_version_has_no_row_for(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path, edit={"NovelForCausalLM": ("PYTHON", None)})
    item = the_one(drift_of(root, shipped_policy), "row-missing")
    assert (item.decision, item.architecture, item.old, item.new, item.policy_line) == (RT, "NovelForCausalLM", None, "PYTHON", None)
    assert item.draftable
    assert item.where.file.startswith(MODELS) and "PYTHON" in text_at(root, item.where)


def test_row_changed_when_the_hook_gives_another_value(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path, edit={"LlamaForCausalLM": ("CPP", "V2")})
    item = the_one(drift_of(root, shipped_policy), "row-changed")
    assert (item.decision, item.architecture, item.old, item.new) == (RT, "LlamaForCausalLM", "PYTHON", "CPP")
    assert item.policy_line == policy_line('architecture = "LlamaForCausalLM", value = "PYTHON"')
    assert "CPP" in text_at(root, item.where)
    assert item.draftable


def test_row_extra_when_the_class_has_no_hook_behind_the_row(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path, edit={"LlamaForCausalLM": (None, "V2")})
    item = the_one(drift_of(root, shipped_policy), "row-extra")
    assert (item.decision, item.architecture, item.old, item.new) == (RT, "LlamaForCausalLM", "PYTHON", None)
    assert item.policy_line == policy_line('architecture = "LlamaForCausalLM", value = "PYTHON"')
    assert item.where is not None and "has no hook behind it" in item.message


def test_row_extra_for_both_decisions_when_the_architecture_is_not_registered(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path, edit={"LlamaForCausalLM": None})
    drift = [d for d in drift_of(root, shipped_policy) if d.kind != "no-baseline"]
    assert [(d.kind, d.decision, d.architecture, d.where) for d in drift] == [
        ("row-extra", RT, "LlamaForCausalLM", None),
        ("row-extra", KV, "LlamaForCausalLM", None),
    ]
    assert all("is not registered in the tree" in d.message for d in drift)
    assert drift[1].policy_line == policy_line('architecture = "LlamaForCausalLM", value = "V2"')


def test_row_extra_when_the_version_branches_on_model_type_and_the_hook_does_not(tmp_path):
    policy = kvpolicy.load(str(POLICIES), version="2026.07.23").policy
    text = module(IMPORTS, model_class("DeepseekV3", ["DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"], runtime="PYTHON"))
    root = trees.simple_tree(tmp_path, {"modeling_deepseekv3.py": text})
    drift = [d for d in drift_of(root, policy) if d.architecture == "DeepseekV32ForCausalLM" and d.decision == RT]
    assert [(d.kind, d.old, d.new) for d in drift] == [("row-extra", "PYTHON (model_type glm_moe_dsa)", "PYTHON"), ("row-missing", None, "PYTHON")]
    assert "branches on model_type 'glm_moe_dsa'" in drift[0].message
    assert drift[0].policy_line == line(POLICIES, "2026.07.23.toml", 'architecture = "DeepseekV32ForCausalLM", model_type = "glm_moe_dsa"')


BRANCHY = Code(
    """
    if getattr(pretrained_config, "model_type", None) == "glm_moe_dsa":
        return "PYTHON"
    return None
    """
)


def _branchy_file(name: str = "Branchy", arch: str = "BranchyForCausalLM", body: Code = BRANCHY) -> dict[str, str]:
    return {f"{MODELS}/modeling_{name.lower()}.py": module(IMPORTS, model_class(name, [arch], runtime=body))}


def test_row_unreadable_when_a_hook_branches_and_no_one_recorded_reading_it(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path, extra=_branchy_file())
    item = the_one(drift_of(root, shipped_policy), "row-unreadable")
    assert (item.decision, item.architecture, item.old, item.new) == (RT, "BranchyForCausalLM", None, None)
    assert not item.draftable
    assert "def get_preferred_transceiver_runtime" in text_at(root, item.where)
    assert (
        "read tensorrt_llm._torch.models.modeling_branchy.Branchy.get_preferred_transceiver_runtime" in item.message
        and "the version says no row" in item.message
    )


def test_an_unknown_hook_whose_fingerprint_the_baseline_records_is_not_drift(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path / "tree", extra=_branchy_file())
    facts = trees.facts_of(root)
    policy = trees.load_policy(trees.policy_folder(tmp_path / "p", upstream=trees.baseline_of(facts)))
    assert drift_of(root, policy) == []
    changed = Code(BRANCHY.text.replace('== "glm_moe_dsa"', '!= "glm_moe_dsa"'))
    trees.write(root, _branchy_file(body=changed))
    assert kinds(drift_of(root, policy)) == ["row-unreadable", "logic-changed"]


def test_row_unreadable_for_an_index_entry_no_class_registers(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path)
    index = (root / INDEX).read_text().replace("}\n", '    "IndexedForCausalLM": "modeling_kvp_grouped",\n}\n')
    trees.write(root, {INDEX: index})
    drift = [d for d in drift_of(root, shipped_policy) if d.kind != "no-baseline"]
    assert {(d.kind, d.decision, d.architecture) for d in drift} == {("row-unreadable", RT, "IndexedForCausalLM"), ("row-unreadable", KV, "IndexedForCausalLM")}
    assert all("read it by hand" in d.message and d.where.file == INDEX for d in drift)


def test_a_same_named_class_in_another_module_with_different_logic_is_still_unreadable(tmp_path, shipped_policy):
    first = {f"{MODELS}/modeling_aaa.py": module(IMPORTS, model_class("MultimodalModel", ["AaaForConditionalGeneration"], runtime=BRANCHY))}
    root = tree_matching(shipped_policy, tmp_path / "tree", extra=first)
    policy = trees.load_policy(trees.policy_folder(tmp_path / "p", upstream=trees.baseline_of(trees.facts_of(root))))
    other = Code('if pretrained_config is None:\n    return "CPP"\nreturn "PYTHON"\n')
    trees.write(root, {f"{MODELS}/modeling_zzz.py": module(IMPORTS, model_class("MultimodalModel", ["ZzzForConditionalGeneration"], runtime=other))})
    drift = drift_of(root, policy)
    assert ("row-unreadable", "ZzzForConditionalGeneration") in [(d.kind, d.architecture) for d in drift]


# -- config fields --


def test_field_added_when_the_tree_has_a_field_the_version_refuses(tmp_path, shipped_policy):
    fields = sorted(version_fields(shipped_policy) | {"kv_transfer_budget_mb"})
    root = tree_matching(shipped_policy, tmp_path, fields=fields)
    item = the_one(drift_of(root, shipped_policy), "field-added")
    assert (item.subject, item.old, item.new) == ("cache_transceiver_config.kv_transfer_budget_mb", None, "kv_transfer_budget_mb")
    assert (item.where.file, item.where.line) == (ARGS, line(root, ARGS, "kv_transfer_budget_mb:"))


def test_field_removed_when_the_version_accepts_a_field_the_tree_lacks(tmp_path, shipped_policy):
    fields = sorted(version_fields(shipped_policy) - {"max_tokens_in_buffer"})
    item = the_one(drift_of(tree_matching(shipped_policy, tmp_path, fields=fields), shipped_policy), "field-removed")
    assert (item.subject, item.old, item.new, item.where) == ("cache_transceiver_config.max_tokens_in_buffer", "max_tokens_in_buffer", None, None)


def test_field_values_when_a_literal_differs_from_the_decision(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path, backend_literals=("DEFAULT", "UCX", "NIXL", "MOONCAKE"))
    item = the_one(drift_of(root, shipped_policy), "field-values")
    assert item.subject == "cache_transceiver_config.backend" and item.decision == "backend"
    assert (item.old, item.new) == ("DEFAULT, MOONCAKE, MPI, NIXL, UCX", "DEFAULT, MOONCAKE, NIXL, UCX")
    assert item.policy_line == policy_line("[decisions.backend]")
    assert item.where == trees.facts_of(root).fields["CacheTransceiverConfig"]["backend"].where


def test_field_values_are_compared_without_case(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path, runtime_literals=("cpp", "python", "AUTO"))
    assert kinds(drift_of(root, shipped_policy)) == []


@pytest.mark.parametrize(
    ("override", "subject", "old", "new"),
    [
        ({"runtime_default": "auto"}, "CacheTransceiverConfig.transceiver_runtime", "PYTHON", None),
        ({"runtime_default": None}, "CacheTransceiverConfig.transceiver_runtime", "PYTHON", None),
        ({"runtime_default": "CPP"}, "CacheTransceiverConfig.transceiver_runtime", "PYTHON", "CPP"),
        ({"kv_default": "auto"}, "KvCacheConfig.use_kv_cache_manager_v2", "V2", None),
        ({"kv_default": False}, "KvCacheConfig.use_kv_cache_manager_v2", "V2", "V1"),
    ],
    ids=["runtime-auto", "runtime-null", "runtime-cpp", "kv-auto", "kv-false"],
)
def test_field_default_when_a_left_out_field_requests_something_else(tmp_path, shipped_policy, override, subject, old, new):
    root = tree_matching(shipped_policy, tmp_path, **override)
    item = the_one(drift_of(root, shipped_policy), "field-default")
    assert (item.subject, item.old, item.new) == (subject, old, new)
    assert item.where.file == ARGS and subject.rsplit(".", 1)[1] in text_at(root, item.where)
    decision = RT if "runtime" in subject else KV
    assert item.decision == decision and item.policy_line == policy_line(f"[decisions.{decision}]")


def test_a_tree_without_cache_transceiver_config_is_unread_not_field_drift(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path)
    trees.write(root, {ARGS: (root / ARGS).read_text().replace("class CacheTransceiverConfig(", "class RenamedTransceiverConfig(")})
    item = the_one(drift_of(root, shipped_policy), "unread")
    assert item.subject == "CacheTransceiverConfig" and "no drift is claimed" in item.message


# -- checkpoint rules --


def test_checkpoint_added_when_the_loader_writes_an_architecture_no_rule_has(tmp_path, shipped_policy):
    checkpoints = {**trees.matching_base(shipped_policy)["checkpoints"], "novel_type": "NovelForCausalLM"}
    root = tree_matching(shipped_policy, tmp_path, checkpoints=checkpoints)
    item = the_one(drift_of(root, shipped_policy), "checkpoint-added")
    assert (item.subject, item.new) == ("NovelForCausalLM", "NovelForCausalLM")
    assert (item.where.file, item.where.line) == (CONFIG_UTILS, line(root, CONFIG_UTILS, '"NovelForCausalLM"'))


def test_checkpoint_removed_when_the_loader_no_longer_writes_a_rule_architecture(tmp_path, shipped_policy):
    checkpoints = {k: v for k, v in trees.matching_base(shipped_policy)["checkpoints"].items() if v != "Qwen4ExpForCausalLM"}
    item = the_one(drift_of(tree_matching(shipped_policy, tmp_path, checkpoints=checkpoints), shipped_policy), "checkpoint-removed")
    assert (item.subject, item.old, item.where) == ("Qwen4ExpForCausalLM", "Qwen4ExpForCausalLM", None)
    assert item.policy_line == policy_line("[[checkpoint_rules]]", 4)  # the fourth rule: qwen4-exp-text-checkpoint


# -- the baseline --


def test_no_baseline_for_a_version_without_an_upstream_table(matching, shipped_policy):
    assert kinds(drift_of(matching, shipped_policy), ignore=()) == ["no-baseline"]


def test_env_added_when_the_area_names_a_variable_the_baseline_lacks(tmp_path, baselined):
    env = sorted(set(baselined.facts.env) | {"TRTLLM_USE_NEWNET_KVCACHE"})
    root = tree_matching(baselined.policy, tmp_path / "other", env=env)
    item = the_one(drift_of(root, baselined.policy), "env-added")
    assert (item.subject, item.new) == ("TRTLLM_USE_NEWNET_KVCACHE", "TRTLLM_USE_NEWNET_KVCACHE")
    assert item.where.file == ARGS and "TRTLLM_USE_NEWNET_KVCACHE" in text_at(root, item.where)
    assert item.policy_line == baselined.policy.upstream.location.line


def test_env_removed_when_a_modelled_variable_is_gone_from_the_tree(tmp_path, baselined):
    env = sorted(set(baselined.facts.env) - {"TRTLLM_USE_MPI_KVCACHE"})
    item = the_one(drift_of(tree_matching(baselined.policy, tmp_path / "other", env=env), baselined.policy), "env-removed")
    assert (item.subject, item.old, item.where) == ("TRTLLM_USE_MPI_KVCACHE", "TRTLLM_USE_MPI_KVCACHE", None)
    assert "is modelled" in item.message


def test_env_removed_when_a_baseline_only_variable_is_gone_from_the_tree(tmp_path, baselined):
    upstream = trees.baseline_of(baselined.facts)
    upstream["env"] = [*upstream["env"], "TRTLLM_OLD_SWITCH"]
    policy = trees.load_policy(trees.policy_folder(tmp_path / "p2", upstream=upstream))
    item = the_one(drift_of(baselined.root, policy), "env-removed")
    assert item.subject == "TRTLLM_OLD_SWITCH" and "is in the baseline" in item.message


def test_logic_changed_when_a_rule_function_changed_since_the_baseline(baselined):
    root = baselined.root
    old = baselined.facts.logic["_transceiver_python_fallback_reason"].fingerprint
    trees.write(root, {LLM_UTILS: (root / LLM_UTILS).read_text().replace("if timeout_ms is None:", "if not timeout_ms:")})
    item = the_one(drift_of(root, baselined.policy), "logic-changed")
    assert item.subject == "_transceiver_python_fallback_reason" and item.old == old and item.new != old
    assert (item.where.file, item.where.line) == (LLM_UTILS, line(root, LLM_UTILS, "def _transceiver_python_fallback_reason("))
    assert item.policy_line == baselined.policy.upstream.location.line


def test_logic_missing_when_a_recorded_function_is_gone(baselined):
    root = baselined.root
    text = (root / LLM_UTILS).read_text()
    trees.write(root, {LLM_UTILS: text[: text.index("def apply_model_defaults_to_llm_args")]})
    item = the_one(drift_of(root, baselined.policy), "logic-missing")
    assert (item.subject, item.new, item.where) == ("apply_model_defaults_to_llm_args", None, None)
    assert item.old == baselined.facts.logic["apply_model_defaults_to_llm_args"].fingerprint


def test_a_recorded_hook_no_class_reaches_any_more_is_left_to_the_rows(tmp_path, baselined):
    upstream = trees.baseline_of(baselined.facts)
    upstream["fingerprints"] = {**upstream["fingerprints"], "GoneModel.get_preferred_transceiver_runtime": "0123456789abcdef"}
    policy = trees.load_policy(trees.policy_folder(tmp_path / "p2", upstream=upstream))
    assert drift_of(baselined.root, policy) == []


def test_logic_added_when_a_new_start_up_validator_appears(baselined):
    root = baselined.root
    trees.write(root, {TRANSCEIVER: (root / TRANSCEIVER).read_text() + '\n\ndef _require_nixl_for_python(config):\n    return config.backend == "NIXL"\n'})
    item = the_one(drift_of(root, baselined.policy), "logic-added")
    assert item.subject == "tensorrt_llm._torch.disaggregation.kv_cache_transceiver._require_nixl_for_python" and item.old is None and len(item.new) == 16
    assert (item.where.file, item.where.line) == (TRANSCEIVER, line(root, TRANSCEIVER, "def _require_nixl_for_python("))


# -- what was not read --


def test_unread_for_a_file_that_does_not_parse_at_its_line(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path, extra={f"{MODELS}/modeling_broken.py": "x = 1\n\ndef broken(:\n    pass\n"})
    item = the_one(drift_of(root, shipped_policy), "unread")
    assert (item.where.file, item.where.line) == (f"{MODELS}/modeling_broken.py", 3)
    assert "does not parse" in item.message


def test_rows_of_an_architecture_whose_module_is_not_in_the_tree_are_not_claimed_as_drift(tmp_path, shipped_policy):
    root = tree_matching(shipped_policy, tmp_path, edit={"LlamaForCausalLM": None})
    index = (root / INDEX).read_text().replace("}\n", '    "LlamaForCausalLM": "modeling_llama",\n}\n')
    trees.write(root, {INDEX: index})
    item = the_one(drift_of(root, shipped_policy), "unread")
    assert item.where.file == INDEX and "tensorrt_llm._torch.models.modeling_llama" in item.message and "LlamaForCausalLM" in item.message


def test_every_kind_has_a_distinct_code_and_only_rows_are_draftable():
    codes = [code for code, _, _ in KINDS.values()]
    assert len(set(codes)) == len(codes) == 17
    assert {kind for kind, (_, draftable, _) in KINDS.items() if draftable} == {"row-missing", "row-extra", "row-changed"}
