"""What ``extract`` reads from an upstream-shaped tree, one construct at a time, each with its file:line."""

from __future__ import annotations

import ast

import pytest

from kvpolicy.upstream.fingerprint import fingerprint

from .trees import (
    ARGS,
    CONFIG_UTILS,
    IMPORTS,
    INDEX,
    LLM_UTILS,
    MODEL_LOADER,
    MODELS,
    TRANSCEIVER,
    UTILS_MODULE,
    Code,
    arch_index,
    facts_of,
    line,
    model_class,
    module,
    simple_tree,
    write,
)

PKG = "tensorrt_llm._torch.models"
RT = "transceiver_runtime"
KV = "kv_cache_manager"


def where(root, rel, needle, nth=1) -> str:
    return f"{rel}:{line(root, rel, needle, nth)}"


def reg(arch: str) -> str:
    return f'@register_auto_model("{arch}")'


# -- the registry --


def test_each_register_auto_model_decorator_names_an_architecture_at_its_line(tmp_path):
    rel = f"{MODELS}/modeling_foo.py"
    root = simple_tree(tmp_path, {"modeling_foo.py": module(IMPORTS, model_class("FooModel", ["FooForCausalLM", "FooAliasForCausalLM"], runtime="PYTHON"))})
    facts = facts_of(root)
    assert set(facts.architectures) == {"FooForCausalLM", "FooAliasForCausalLM"}
    for arch in ("FooForCausalLM", "FooAliasForCausalLM"):
        fact = facts.architectures[arch]
        assert fact.cls == f"{PKG}.modeling_foo.FooModel"
        assert str(fact.where) == where(root, rel, reg(arch))
        assert not fact.unread
        hook = fact.hooks[RT]
        assert (hook.value, hook.known) == ("PYTHON", True)
        assert str(hook.where) == where(root, rel, 'return "PYTHON"')


def test_register_auto_model_through_a_module_attribute_is_read(tmp_path):
    text = module(
        "from . import modeling_utils",
        model_class("Foo", ["FooForCausalLM"], bases=("modeling_utils.DecoderModelForCausalLM",), register="modeling_utils.register_auto_model", kv="V2"),
    )
    facts = facts_of(simple_tree(tmp_path, {"modeling_foo.py": text}))
    assert facts.architectures["FooForCausalLM"].hooks[KV].value == "V2"


def test_a_decorated_class_outside_the_models_folder_registers_nothing(tmp_path):
    root = simple_tree(tmp_path, {"modeling_foo.py": module(IMPORTS, model_class("Foo", ["FooForCausalLM"]))})
    (root / TRANSCEIVER).write_text((root / TRANSCEIVER).read_text() + "\n\n" + model_class("Stray", ["StrayForCausalLM"], bases=()))
    assert set(facts_of(root).architectures) == {"FooForCausalLM"}


def test_the_base_class_hooks_returning_none_state_no_preference(tmp_path):
    root = simple_tree(tmp_path, {"modeling_foo.py": module(IMPORTS, model_class("Foo", ["FooForCausalLM"]))})
    hooks = facts_of(root).architectures["FooForCausalLM"].hooks
    for decision, nth in ((RT, 1), (KV, 2)):
        assert (hooks[decision].value, hooks[decision].known) == (None, True)
        assert str(hooks[decision].where) == where(root, UTILS_MODULE, "return None", nth)


def test_a_class_with_no_hook_anywhere_in_its_bases_has_no_preference(tmp_path):
    text = module("from torch import nn\nfrom .modeling_utils import register_auto_model", model_class("Plain", ["PlainForCausalLM"], bases=("nn.Module",)))
    hook = facts_of(simple_tree(tmp_path, {"modeling_plain.py": text})).architectures["PlainForCausalLM"].hooks[RT]
    assert (hook.value, hook.known) == (None, True)
    assert "no hook in the class or its bases" in hook.why


# -- inheritance --


def _base_module() -> str:
    return module("from .modeling_utils import DecoderModelForCausalLM", model_class("SharedBase", runtime="PYTHON", kv="V2"))


@pytest.mark.parametrize(
    ("folder", "imports", "base"),
    [
        ("", "from .modeling_base import SharedBase\nfrom .modeling_utils import register_auto_model", "SharedBase"),
        ("family/", "from ..modeling_base import SharedBase\nfrom ..modeling_utils import register_auto_model", "SharedBase"),
        ("", "import tensorrt_llm._torch.models.modeling_base as mb\nfrom .modeling_utils import register_auto_model", "mb.SharedBase"),
        ("", "from . import modeling_base\nfrom .modeling_utils import register_auto_model", "modeling_base.SharedBase"),
        ("", "from .modeling_base import SharedBase as Renamed\nfrom .modeling_utils import register_auto_model", "Renamed"),
    ],
    ids=["relative-level-1", "relative-level-2-from-subpackage", "absolute-import-alias", "module-attribute", "import-as"],
)
def test_a_hook_is_inherited_from_a_base_class_in_another_module(tmp_path, folder, imports, base):
    child = f"{MODELS}/{folder}modeling_child.py"
    files = {"modeling_base.py": _base_module(), f"{folder}modeling_child.py": module(imports, model_class("Child", ["ChildForCausalLM"], bases=(base,)))}
    if folder:
        files[f"{folder}__init__.py"] = ""
    root = simple_tree(tmp_path, files)
    fact = facts_of(root).architectures["ChildForCausalLM"]
    base_rel = f"{MODELS}/modeling_base.py"
    assert fact.cls == f"{PKG}.{folder.replace('/', '.')}modeling_child.Child"
    assert (fact.hooks[RT].value, fact.hooks[KV].value) == ("PYTHON", "V2")
    assert str(fact.hooks[RT].where) == where(root, base_rel, 'return "PYTHON"')
    chain = [str(w) for w in fact.hooks[RT].chain]
    assert where(root, child, "class Child(") in chain and where(root, base_rel, "class SharedBase(") in chain


def test_method_resolution_follows_c3_order_not_depth_first(tmp_path):
    text = module(
        IMPORTS,
        model_class("Left", runtime="CPP"),
        model_class("Right", runtime="PYTHON"),
        model_class("Middle"),
        model_class("LeftFirst", ["LeftFirstForCausalLM"], bases=("Left", "Right")),
        model_class("RightFirst", ["RightFirstForCausalLM"], bases=("Right", "Left")),
        model_class("Diamond", ["DiamondForCausalLM"], bases=("Middle", "Right")),
    )
    facts = facts_of(simple_tree(tmp_path, {"modeling_mro.py": text}))
    assert facts.architectures["LeftFirstForCausalLM"].hooks[RT].value == "CPP"
    assert facts.architectures["RightFirstForCausalLM"].hooks[RT].value == "PYTHON"
    # Diamond -> Middle -> Right -> DecoderModelForCausalLM: Right's hook comes before the base's None.
    assert facts.architectures["DiamondForCausalLM"].hooks[RT].value == "PYTHON"


def test_super_continues_along_the_method_order(tmp_path):
    rel = f"{MODELS}/modeling_foo.py"
    text = module(
        IMPORTS,
        model_class("Base", runtime="PYTHON"),
        model_class("Child", ["ChildForCausalLM"], bases=("Base",), runtime=Code("return super().get_preferred_transceiver_runtime(pretrained_config)")),
    )
    root = simple_tree(tmp_path, {"modeling_foo.py": text})
    hook = facts_of(root).architectures["ChildForCausalLM"].hooks[RT]
    assert (hook.value, hook.known) == ("PYTHON", True)
    assert str(hook.where) == where(root, rel, 'return "PYTHON"')
    assert where(root, rel, "return super()") in [str(w) for w in hook.chain]


# -- delegation --


def test_a_hook_returning_another_class_hook_delegates_to_it(tmp_path):
    rel = f"{MODELS}/modeling_vlm.py"
    text_rel = f"{MODELS}/modeling_text.py"
    files = {
        "modeling_text.py": module("from .modeling_utils import DecoderModelForCausalLM", model_class("TextModel", runtime="PYTHON", kv="V2")),
        "modeling_vlm.py": module(
            f"from .modeling_text import TextModel\n{IMPORTS}",
            model_class(
                "VisionLanguage",
                ["VisionLanguageForConditionalGeneration"],
                runtime=Code("return TextModel.get_preferred_transceiver_runtime(pretrained_config)"),
                kv=Code("return TextModel.get_preferred_kv_cache_manager_version(pretrained_config)"),
            ),
        ),
    }
    root = simple_tree(tmp_path, files)
    hooks = facts_of(root).architectures["VisionLanguageForConditionalGeneration"].hooks
    assert (hooks[RT].value, hooks[KV].value) == ("PYTHON", "V2")
    assert str(hooks[RT].where) == where(root, text_rel, 'return "PYTHON"')
    chain = [str(w) for w in hooks[RT].chain]
    assert where(root, rel, "return TextModel.get_preferred_transceiver_runtime") in chain
    assert where(root, text_rel, "class TextModel(") in chain


def test_a_hook_assigned_from_another_class_delegates_to_it(tmp_path):
    text = module(
        IMPORTS,
        model_class("TextModel", runtime="PYTHON"),
        '@register_auto_model("AssignedForCausalLM")\n'
        "class Assigned(DecoderModelForCausalLM):\n"
        "    get_preferred_transceiver_runtime = TextModel.get_preferred_transceiver_runtime\n",
    )
    rel = f"{MODELS}/modeling_assigned.py"
    root = simple_tree(tmp_path, {"modeling_assigned.py": text})
    hook = facts_of(root).architectures["AssignedForCausalLM"].hooks[RT]
    assert (hook.value, hook.known) == ("PYTHON", True)
    assert where(root, rel, "get_preferred_transceiver_runtime = TextModel") in [str(w) for w in hook.chain]


def test_delegation_to_a_class_in_a_module_not_read_is_unknown(tmp_path):
    text = module(
        f"from tensorrt_llm._torch.speculative.drafts import DraftModel\n{IMPORTS}",
        model_class("Foo", ["FooForCausalLM"], runtime=Code("return DraftModel.get_preferred_transceiver_runtime(pretrained_config)")),
    )
    hook = facts_of(simple_tree(tmp_path, {"modeling_foo.py": text})).architectures["FooForCausalLM"].hooks[RT]
    assert not hook.known
    assert "did not read" in hook.why


# -- values static analysis cannot tell --


def test_a_hook_that_branches_on_pretrained_config_is_unknown_with_its_fingerprint(tmp_path):
    rel = f"{MODELS}/modeling_branchy.py"
    branchy = Code(
        """
        if getattr(pretrained_config, "model_type", None) == "glm_moe_dsa":
            return "PYTHON"
        return None
        """
    )
    root = simple_tree(tmp_path, {"modeling_branchy.py": module(IMPORTS, model_class("Branchy", ["BranchyForCausalLM"], runtime=branchy))})
    facts = facts_of(root)
    hook = facts.architectures["BranchyForCausalLM"].hooks[RT]
    assert (hook.value, hook.known) == (None, False)
    assert "branches" in hook.why
    assert hook.logic == "tensorrt_llm._torch.models.modeling_branchy.Branchy.get_preferred_transceiver_runtime"
    assert str(hook.where) == where(root, rel, "def get_preferred_transceiver_runtime")
    logic = facts.logic[hook.logic]
    assert logic.where == hook.where
    node = next(n for n in ast.walk(ast.parse((root / rel).read_text())) if isinstance(n, ast.FunctionDef) and n.name == "get_preferred_transceiver_runtime")
    assert logic.fingerprint == fingerprint(node)


def test_a_computed_return_is_unknown(tmp_path):
    text = module(IMPORTS, model_class("Foo", ["FooForCausalLM"], runtime=Code("return cls._choose_runtime(pretrained_config)")))
    hook = facts_of(simple_tree(tmp_path, {"modeling_foo.py": text})).architectures["FooForCausalLM"].hooks[RT]
    assert not hook.known and "computes its value" in hook.why and hook.logic == "tensorrt_llm._torch.models.modeling_foo.Foo.get_preferred_transceiver_runtime"


def test_a_module_constant_and_enum_members_are_read_as_their_values(tmp_path):
    text = module(
        f'from enum import Enum\n\n{IMPORTS}\n\n_RUNTIME = "PYTHON"\n\n\nclass KvCacheManagerVersion(str, Enum):\n    V1 = "V1"\n    V2 = "V2"',
        model_class("ByConstant", ["ByConstantForCausalLM"], runtime=Code("return _RUNTIME")),
        model_class("ByEnum", ["ByEnumForCausalLM"], runtime=Code("return TransceiverRuntime.CPP"), kv=Code("return KvCacheManagerVersion.V2")),
    )
    facts = facts_of(simple_tree(tmp_path, {"modeling_values.py": text}))
    assert facts.architectures["ByConstantForCausalLM"].hooks[RT].value == "PYTHON"
    assert facts.architectures["ByEnumForCausalLM"].hooks[RT].value == "CPP"
    assert facts.architectures["ByEnumForCausalLM"].hooks[KV].value == "V2"


def test_a_base_in_a_tensorrt_llm_module_not_read_makes_a_later_hook_unknown(tmp_path):
    text = module(
        f"from tensorrt_llm._torch.modules.mixins import KvMixin\n{IMPORTS}",
        model_class("MixinFirst", ["MixinFirstForCausalLM"], bases=("KvMixin", "DecoderModelForCausalLM")),
        model_class("BaseFirst", ["BaseFirstForCausalLM"], bases=("DecoderModelForCausalLM", "KvMixin")),
    )
    facts = facts_of(simple_tree(tmp_path, {"modeling_mixin.py": text}))
    unknown = facts.architectures["MixinFirstForCausalLM"].hooks[RT]
    assert not unknown.known and "tensorrt_llm._torch.modules.mixins.KvMixin" in unknown.why
    known = facts.architectures["BaseFirstForCausalLM"].hooks[RT]  # the base's hook comes before the mixin
    assert (known.value, known.known) == (None, True)


def test_bases_from_outside_tensorrt_llm_carry_no_hooks(tmp_path):
    text = module(
        "from transformers import PreTrainedModel\nfrom .modeling_utils import register_auto_model",
        model_class("Hf", ["HfForCausalLM"], bases=("PreTrainedModel",)),
    )
    hook = facts_of(simple_tree(tmp_path, {"modeling_hf.py": text})).architectures["HfForCausalLM"].hooks[RT]
    assert (hook.value, hook.known) == (None, True)


# -- get_model_defaults --


@pytest.mark.parametrize(
    ("body", "value", "known"),
    [
        (True, "V2", True),
        (False, "V1", True),
        ("auto", None, True),
        (Code('return {"kv_cache_config": {"use_kv_cache_manager_v2": llm_args.prefer_v2}}'), None, False),
        (Code('return {"kv_cache_config": dict(use_kv_cache_manager_v2=True, tokens_per_block=128)}'), "V2", True),
        (Code('return {"speculative_config": {"max_draft_len": 3}}'), None, True),
    ],
    ids=["true-is-V2", "false-is-V1", "auto-is-no-preference", "computed-is-unknown", "keyword-form", "other-settings-only"],
)
def test_get_model_defaults_use_kv_cache_manager_v2_is_the_kv_preference(tmp_path, body, value, known):
    rel = f"{MODELS}/modeling_defaults.py"
    root = simple_tree(tmp_path, {"modeling_defaults.py": module(IMPORTS, model_class("Defaults", ["DefaultsForCausalLM"], defaults=body))})
    hook = facts_of(root).architectures["DefaultsForCausalLM"].hooks[KV]
    assert (hook.value, hook.known) == (value, known)
    if known and value is not None:
        assert str(hook.where) == where(root, rel, "use_kv_cache_manager_v2")


def test_get_model_defaults_spreading_super_continues_to_the_base(tmp_path):
    text = module(
        IMPORTS,
        model_class("Base", defaults=True),
        model_class("Child", ["ChildForCausalLM"], bases=("Base",), defaults=Code('return {**super().get_model_defaults(llm_args), "speculative_config": {}}')),
    )
    assert facts_of(simple_tree(tmp_path, {"modeling_spread.py": text})).architectures["ChildForCausalLM"].hooks[KV].value == "V2"


def test_the_kv_hook_wins_over_get_model_defaults_and_defaults_fill_a_missing_hook(tmp_path):
    text = module(
        IMPORTS,
        model_class("HookWins", ["HookWinsForCausalLM"], kv="V1", defaults=True),
        model_class("DefaultsFill", ["DefaultsFillForCausalLM"], kv=None, defaults=True),
    )
    facts = facts_of(simple_tree(tmp_path, {"modeling_merge.py": text}))
    assert facts.architectures["HookWinsForCausalLM"].hooks[KV].value == "V1"
    assert facts.architectures["DefaultsFillForCausalLM"].hooks[KV].value == "V2"


# -- the static index --


def test_arch_index_entries_are_read_and_a_decorator_wins_over_them(tmp_path):
    root = simple_tree(tmp_path, {"modeling_foo.py": module(IMPORTS, model_class("Foo", ["FooForCausalLM"], runtime="PYTHON"))})
    write(root, {INDEX: arch_index({"FooForCausalLM": "modeling_foo", "IndexedOnlyForCausalLM": "modeling_foo", "ElsewhereForCausalLM": "modeling_elsewhere"})})
    facts = facts_of(root)
    foo = facts.architectures["FooForCausalLM"]
    assert foo.cls == f"{PKG}.modeling_foo.Foo" and foo.where.file == f"{MODELS}/modeling_foo.py"

    only = facts.architectures["IndexedOnlyForCausalLM"]
    assert (only.cls, only.unread) == (None, False)
    assert str(only.where) == where(root, INDEX, '"IndexedOnlyForCausalLM"')
    assert not only.hooks[RT].known and "no class there registers it" in only.hooks[RT].why

    elsewhere = facts.architectures["ElsewhereForCausalLM"]
    assert elsewhere.unread and elsewhere.cls is None
    [(problem_where, problem)] = facts.problems
    assert str(problem_where) == where(root, INDEX, '"ElsewhereForCausalLM"')
    assert f"{PKG}.modeling_elsewhere" in problem and "ElsewhereForCausalLM" in problem


# -- config fields --

CONFIG_SOURCE = """
from typing import ClassVar, Dict, Literal, Optional

from pydantic import Field


class CacheTransceiverConfig(StrictBaseModel):
    ENV_ORDER: ClassVar[tuple] = ("NIXL", "UCX")
    _private: int = 3
    backend: Optional[Literal["DEFAULT", "UCX", "NIXL", "MOONCAKE", "MPI"]] = Field(
        default=None, description="The transfer backend.")
    transceiver_runtime: Optional[Literal["CPP", "PYTHON", "auto"]] = Field(default="auto")
    kv_transfer_timeout_ms: Optional[int] = Field(60000, description="positional default")
    max_tokens_in_buffer: int = 512
    agent_bounce_params: Dict[str, int] = Field(default_factory=dict)
    enable_pipelined_transfer: bool = Field(True)
    required_number: int


class KvCacheConfig(StrictBaseModel):
    use_kv_cache_manager_v2: bool | Literal["auto"] = Field(default="auto")
"""


def test_config_fields_are_read_with_their_literals_defaults_and_lines(tmp_path):
    root = simple_tree(tmp_path)
    write(root, {ARGS: CONFIG_SOURCE})
    fields = facts_of(root).fields
    config = fields["CacheTransceiverConfig"]
    assert set(config) == {
        "backend",
        "transceiver_runtime",
        "kv_transfer_timeout_ms",
        "max_tokens_in_buffer",
        "agent_bounce_params",
        "enable_pipelined_transfer",
        "required_number",
    }
    assert config["backend"].literals == ("DEFAULT", "UCX", "NIXL", "MOONCAKE", "MPI")
    assert config["backend"].default == "null"
    assert str(config["backend"].where) == where(root, ARGS, "backend:")
    assert (config["transceiver_runtime"].literals, config["transceiver_runtime"].default) == (("CPP", "PYTHON", "auto"), "auto")
    assert str(config["transceiver_runtime"].where) == where(root, ARGS, "transceiver_runtime:")
    assert config["kv_transfer_timeout_ms"].default == "60000"
    assert config["max_tokens_in_buffer"].literals is None and config["max_tokens_in_buffer"].default == "512"
    assert config["agent_bounce_params"].default == "dict()"
    assert config["enable_pipelined_transfer"].default == "true"
    assert config["required_number"].default == "required"
    kv = fields["KvCacheConfig"]["use_kv_cache_manager_v2"]
    assert (kv.literals, kv.default) == (("auto",), "auto")
    assert str(kv.where) == where(root, ARGS, "use_kv_cache_manager_v2:")


def test_a_field_declared_with_ellipsis_is_required(tmp_path):
    root = simple_tree(tmp_path)
    write(root, {ARGS: CONFIG_SOURCE.replace('Field(default="auto")\n    kv_transfer', 'Field(..., description="must be given")\n    kv_transfer')})
    assert facts_of(root).fields["CacheTransceiverConfig"]["transceiver_runtime"].default == "required"


# -- environment names --


def test_env_names_are_read_from_the_decision_area_only(tmp_path):
    root = simple_tree(tmp_path, {"modeling_foo.py": module(IMPORTS, 'MODEL_ONLY = "TRTLLM_MODEL_ONLY_FLAG"', model_class("Foo", ["FooForCausalLM"]))})
    args = (root / ARGS).read_text() + '\n\n_LOG_LEVEL = "TRTLLM_LOG_LEVEL"\n_KVCACHE_DEBUG_ENV = "TRTLLM_KVCACHE_DEBUG"\n'
    args = args.replace("    tokens_per_block: int = 32\n", '    tokens_per_block: int = 32\n    ENV: ClassVar[str] = "TRTLLM_KV_TOKENS_OVERRIDE"\n')
    write(root, {ARGS: args, CONFIG_UTILS: (root / CONFIG_UTILS).read_text() + '\n\nLOWER = "TRTLLM_lowercase"\n'})
    env = facts_of(root).env
    assert str(env["TRTLLM_USE_NIXL_KVCACHE"]) == where(root, ARGS, "_CACHE_TRANSCEIVER_BACKEND_ENV_VARS")
    assert str(env["TRTLLM_KVCACHE_DEBUG"]) == where(root, ARGS, "TRTLLM_KVCACHE_DEBUG")  # a constant named after the area
    assert str(env["TRTLLM_KV_TOKENS_OVERRIDE"]) == where(root, ARGS, "TRTLLM_KV_TOKENS_OVERRIDE")  # inside a config class
    assert str(env["TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL"]) == where(root, TRANSCEIVER, "TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL")
    assert "TRTLLM_LOG_LEVEL" not in env  # llm_args.py outside the config classes and their constants
    assert "TRTLLM_MODEL_ONLY_FLAG" not in env  # a model file is not the decision area
    assert "TRTLLM_lowercase" not in env


# -- checkpoint rewrites --


def test_every_form_of_writing_architectures_in_config_utils_is_a_checkpoint_target(tmp_path):
    source = """
    def load_pretrained_config(path, config, model_type):
        if model_type == "kimi_k3":
            config.architectures = ["KimiLinearForCausalLM"]
        elif model_type == "qwen4_exp":
            config["architectures"] = ("Qwen4ExpForCausalLM",)
        elif model_type == "qwen4_exp_vl":
            setattr(config, "architectures", ["Qwen4ExpForConditionalGeneration"])
        else:
            config.update({"architectures": ["KimiK3ForConditionalGeneration"]})
        config.architectures = [config.architectures[0]]
        return config
    """
    root = simple_tree(tmp_path)
    write(root, {CONFIG_UTILS: source})
    targets = facts_of(root).checkpoint_targets
    assert {arch: str(w) for arch, w in targets.items()} == {
        arch: where(root, CONFIG_UTILS, f'"{arch}"')
        for arch in ("KimiLinearForCausalLM", "Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration", "KimiK3ForConditionalGeneration")
    }


def test_the_default_checkpoint_branch_sets_kimi_linear(tmp_path):
    root = simple_tree(tmp_path)
    assert {a: str(w) for a, w in facts_of(root).checkpoint_targets.items()} == {
        "KimiLinearForCausalLM": where(root, CONFIG_UTILS, 'config.architectures = ["KimiLinearForCausalLM"]')
    }


# -- rule-bearing functions --


def test_the_rule_bearing_functions_are_fingerprinted_where_they_are_defined(tmp_path):
    root = simple_tree(tmp_path)
    logic = facts_of(root).logic
    for name, rel in (
        ("_resolve_transceiver_runtime_auto", LLM_UTILS),
        ("_transceiver_python_fallback_reason", LLM_UTILS),
        ("_resolve_kv_cache_manager_v2_auto", LLM_UTILS),
        ("apply_model_defaults_to_llm_args", LLM_UTILS),
        ("load_pretrained_config", CONFIG_UTILS),
        ("resolve_cache_transceiver_config", CONFIG_UTILS),
        ("create_kv_cache_transceiver", TRANSCEIVER),
        ("_validate_inflight_cancel", TRANSCEIVER),
    ):
        # Validators are keyed by their module (two transceiver files may each have one of a name).
        key = f"{TRANSCEIVER[:-3].replace('/', '.')}.{name}" if name.startswith("_validate") else name
        assert str(logic[key].where) == where(root, rel, f"def {name}("), name
        assert len(logic[key].fingerprint) == 16 and int(logic[key].fingerprint, 16) >= 0


def test_a_rule_function_that_moved_is_found_in_its_new_file(tmp_path):
    root = simple_tree(tmp_path)
    moved = "\n\ndef _resolve_kv_cache_manager_v2_auto(model_cls, config, runtime, backend):\n    return False\n"
    utils = (root / LLM_UTILS).read_text()
    start = utils.index("def _resolve_kv_cache_manager_v2_auto")
    end = utils.index("def apply_model_defaults_to_llm_args")
    write(root, {LLM_UTILS: utils[:start] + utils[end:], CONFIG_UTILS: (root / CONFIG_UTILS).read_text() + moved})
    assert str(facts_of(root).logic["_resolve_kv_cache_manager_v2_auto"].where) == where(root, CONFIG_UTILS, "def _resolve_kv_cache_manager_v2_auto(")


def test_validators_are_module_functions_of_the_transceiver_files_named_as_checks(tmp_path):
    extra = """

def check_layerwise(config):
    return True


def ensure_zero_copy_off(config):
    return True


def validated_helper(config):
    return True


class Gate:
    def _validate(self):
        return True
"""
    root = simple_tree(tmp_path)
    write(
        root,
        {
            TRANSCEIVER: (root / TRANSCEIVER).read_text() + extra,
            CONFIG_UTILS: (root / CONFIG_UTILS).read_text() + "\n\ndef _validate_elsewhere():\n    return 1\n",
        },
    )
    logic = facts_of(root).logic
    module = TRANSCEIVER[:-3].replace("/", ".")
    assert str(logic[f"{module}.check_layerwise"].where) == where(root, TRANSCEIVER, "def check_layerwise(")
    assert f"{module}.ensure_zero_copy_off" in logic
    names = {key.rpartition(".")[2] for key in logic}
    assert "validated_helper" not in names  # "validated" is not a word that says it checks
    assert not any(key.endswith("Gate._validate") for key in logic)  # methods are not start-up validators
    assert "_validate_elsewhere" not in names  # outside the transceiver's files


def test_auto_model_resolve_class_is_fingerprinted_as_a_method(tmp_path):
    source = "class AutoModelForCausalLM:\n    @staticmethod\n    def _resolve_class(config):\n        return config.architectures[0]\n"
    root = simple_tree(tmp_path, {"modeling_auto.py": source})
    assert str(facts_of(root).logic["AutoModelForCausalLM._resolve_class"].where) == where(root, f"{MODELS}/modeling_auto.py", "def _resolve_class(")


def test_the_release_is_read_from_version_py(tmp_path):
    root = simple_tree(tmp_path)
    write(root, {"tensorrt_llm/version.py": '__version__ = "1.4.0rc1"\n'})
    assert facts_of(root).release == "1.4.0rc1"


def test_the_model_loader_is_part_of_the_decision_area(tmp_path):
    root = simple_tree(tmp_path)
    write(
        root,
        {
            MODEL_LOADER: (
                "import os\n\n\ndef load_config_and_apply_defaults(checkpoint_dir, llm_args):\n"
                '    if os.environ.get("TRTLLM_SKIP_MODEL_DEFAULTS") == "1":\n'
                "        return llm_args\n"
                "    return llm_args\n"
            )
        },
    )
    facts = facts_of(root)
    assert str(facts.logic["load_config_and_apply_defaults"].where) == where(root, MODEL_LOADER, "def load_config_and_apply_defaults(")
    assert str(facts.env["TRTLLM_SKIP_MODEL_DEFAULTS"]) == where(root, MODEL_LOADER, "TRTLLM_SKIP_MODEL_DEFAULTS")


def test_a_tree_beside_a_git_folder_is_a_checkout(tmp_path):
    from kvpolicy.upstream.source import open_tree

    root = simple_tree(tmp_path)
    assert (open_tree(root).kind, open_tree(root).is_git) == ("directory", False)
    (root / ".git").mkdir()
    assert (open_tree(root).kind, open_tree(root).is_git) == ("checkout", True)
