"""TensorRT-LLM's own resolution, restated independently of the policy files, to check them against.

Written from upstream's code and tests (NVIDIA/TensorRT-LLM), in upstream's own style: model classes
with ``get_preferred_*`` hooks registered under checkpoint architecture names, the load-time
resolvers of ``tensorrt_llm/llmapi/llm_utils.py`` (era A: #16164, era C: #18134) and the creation-
time checks of ``create_kv_cache_transceiver`` / ``resolve_cache_transceiver_config``. Nothing here
reads kvpolicy's TOML: the shipped policies must agree with this over the whole input domain
(``tests/evaluate/test_oracle_agreement.py``). Where upstream's record is uncertain, the reading is a switch of
:class:`Assumptions`: its default is the shipped policy's assumption (``ASSUMED``), and
``test_assumptions.py`` checks that the other reading of each changes only the contexts
``docs/policies.md`` lists as uncertain, so nothing outside them rests on an assumption.

Dates are the upstream merge dates; a version ``YYYY.MM.DD`` of kvpolicy is the state of upstream
on the date of its last change (see ``VERSION_STATE``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

#: kvpolicy version -> the upstream merge date whose state it reproduces.
VERSION_STATE = {
    "2026.07.09": "2026-07-16",  # #16164 merged on 07-16 (described 07-09)
    "2026.07.20": "2026-07-20",
    "2026.07.21": "2026-07-21",
    "2026.07.23": "2026-07-23",
    "2026.07.28": "2026-07-28",  # #16598 (hybrid models prefer PYTHON)
    "2026.08.03": "2026-08-03",
    "2026.08.07": "2026-08-07",
    "2026.08.10": "2026-08-10",
    "2026.08.11": "2026-08-11",
    "2026.08.13": "2026-08-13",
    "2026.08.17": "2026-08-17",
    "2026.08.18": "2026-08-18",
    "2026.08.24": "2026-08-28",  # #18134 merged on 08-28 (described 08-24)
    "2026.09.02": "2026-09-02",
    "2026.09.04": "2026-09-04",  # #18585 (Qwen4-Exp)
    "2026.09.10": "2026-09-15",  # #19004 merged on 09-15 (reviewed 09-10); #18585 before it
    "2026.09.15": "2026-09-15.1",  # #19140, merged after #19004 the same day
    "2026.09.16": "2026-09-16",  # #15780 (bounce-buffer fields)
    "2026.09.28": "2026-09-28",  # #19136 (GLM-5.3-Flash)
    "2026.10.22": "2026-10-22",  # #17495 (field defaults) and #19727 (DeepSeek-V4.1): v1.4.0rc1's state
}

PYTHON_BY_DEFAULT = "2026-08-28"  # #18134
#: #16598 (07-28): Nemotron-H, Qwen3-Next and the Qwen3.5 VL base get the PYTHON hook.
HYBRID_PYTHON = "2026-07-28"
PIPELINED = "2026-09-02"  # #15727
KIMI_K3_GATE = "2026-08-17"  # #17480
#: #17050 (08-13): a composite kimi_k3 checkpoint loads as KimiK3ForConditionalGeneration.
KIMI_MULTIMODAL_REWRITE = "2026-08-13"
#: #18585 (09-04): qwen4_exp checkpoints load as Qwen4-Exp's text or multimodal class.
QWEN4_EXP = "2026-09-04"
#: #19140 (merged 09-15, after #19004): dates compare as strings, so the same day's later merge is "2026-09-15.1".
NEMOTRON_MULTIMODAL = "2026-09-15.1"
#: #15780 (09-16): agent_bounce_buffer_enable and agent_bounce_params become CacheTransceiverConfig fields.
BOUNCE_FIELDS = "2026-09-16"
#: #17495 (in v1.4.0rc1, 10-22): CacheTransceiverConfig.transceiver_runtime defaults to "PYTHON" and
#: KvCacheConfig.use_kv_cache_manager_v2 to True (before: both "auto").
FIELD_DEFAULTS_1_4 = "2026-10-22"


class _LeftOut:
    """A config field left out: the pydantic default of the state applies."""

    def __repr__(self) -> str:
        return "LEFT_OUT"


LEFT_OUT = _LeftOut()


@dataclass(frozen=True)
class Assumptions:
    """How this restatement reads each upstream fact whose record is uncertain. ``True`` is the
    reading the shipped policies make (``ASSUMED``); ``False`` the other plausible one. Each field's
    docstring names the line of ``docs/policies.md``'s list of uncertain facts it stands for."""

    hybrids_with_18134: bool = True
    """**Hybrid models' hooks**: the V2 hooks' PR not found (none at rc24, present at rc25's tag commit of
    08-27); taken as arriving with #18134's state (08-28). Otherwise: with #16060 (08-11). (The PYTHON
    hooks are #16598's, 07-28: not an assumption.)"""
    glm_test_reads_either: bool = True
    """**#16524's GLM test**: either the architecture (GlmMoeDsaForCausalLM) or the model_type
    (glm_moe_dsa) counts. Otherwise: only the model_type."""
    nemotron_puzzle_by_rc1: bool = True
    """**Nemotron-H Puzzle**: NemotronHPuzzleForCausalLM, a second registered name of Nemotron-H's class,
    taken as registered from v1.4.0rc1's state (when it was registered was not found). Otherwise: from
    the first modelled state."""
    hooks_inherited: bool = True
    """**Inherited hooks**: Mistral Large 3 inherits DeepSeek-V3's, Qwen3.5 text Qwen3-Next's, Kimi K3
    multimodal Kimi K2.5's PYTHON preference, Qwen3.5 MoE VL the shared VL base's. Otherwise: none."""
    kimi_k3_vl_without_v2: bool = True
    """**Kimi K3 multimodal and V2**: its get_model_defaults override drops Kimi K2.5's V2 default.
    Otherwise: inherited (from #17050, 08-13)."""
    gemma_python_from_17396: bool = True
    """**Gemma3 multimodal / Gemma4 text PYTHON**: Gemma4 text prefers PYTHON from #17396 (08-18).
    Otherwise: from #16787 (08-11), with Gemma3 text."""
    pipelined_not_a_field: bool = True
    """**`enable_pipelined_transfer` before #15727**: not a CacheTransceiverConfig field, so the
    strict config refuses it. Otherwise: accepted and ignored."""
    v2_with_cpp_fails: bool = True
    """**Plain KV-cache manager V2 with the C++ transceiver**: fails at start-up (the perf-sanity
    precheck). Otherwise: starts."""
    v2_guard_by_07_28: bool = True
    """**DeepSeek-V4's V2 default**: the guard that keeps a V2 default only on NIXL + PYTHON was
    present by 07-28 (its PR not found; #16942, described 07-28, cites it), so earlier states keep
    V2 with C++. Otherwise: there from the first version's state."""
    kimi_route_check_at_load: bool = True
    """**Kimi K3's route check** sees the runtime resolved at load, before pipelined transfer switches
    a null runtime to PYTHON. Otherwise: the runtime the transceiver is created with."""
    qwen4_rules_with_18585: bool = True
    """**Qwen4-Exp's checkpoint rules**: load_pretrained_config's qwen4_exp branches came with #18585
    (09-04; read at a later commit). Otherwise: after every modelled state."""
    nemotron_multimodal_python: bool = True
    """**Nemotron-H multimodal's PYTHON preference**: #19140 delegates the runtime hook as well as the
    V2 one. Otherwise: V2 only within the modelled states."""
    glm5_next_python: bool = True
    """**GLM-5.3-Flash's PYTHON preference**: the merged file has the runtime hook. Otherwise: V2 only."""
    v2_default_in_1_4: bool = True
    """**KV-cache manager V2 by default in 1.4**: #17495 makes use_kv_cache_manager_v2 default to True
    (its release note). Otherwise: it stays "auto" (only the runtime's default changed)."""

    @property
    def hybrids(self) -> str:
        """The date the hybrid models' hooks arrive."""
        return "2026-08-28" if self.hybrids_with_18134 else "2026-08-11"

    @property
    def v2_guard(self) -> str:
        """The date of the guard that demotes a V2 default off NIXL + PYTHON."""
        return "2026-07-28" if self.v2_guard_by_07_28 else "2026-07-01"

    @property
    def nemotron_puzzle(self) -> str:
        """The date NemotronHPuzzleForCausalLM names Nemotron-H's class."""
        return "2026-10-22" if self.nemotron_puzzle_by_rc1 else "2026-07-01"

    @property
    def kimi_text_rewrite(self) -> str:
        """The date kimi_k3 / kimi_linear text checkpoints start loading as KimiLinearForCausalLM: #17269's
        merge (2026-08-06, commit 36922c72, upstream's weekly commit list)."""
        return "2026-08-06"

    def flipped(self, name: str) -> Assumptions:
        """These assumptions with ``name`` read the other way."""
        assert name in SWITCHES, name
        return Assumptions(**{f: (getattr(self, f) if f != name else not getattr(self, f)) for f in SWITCHES})


SWITCHES = tuple(f.name for f in fields(Assumptions))
#: The shipped policies' readings.
ASSUMED = Assumptions()

BACKEND_ENV = (
    ("TRTLLM_USE_NIXL_KVCACHE", "NIXL"),
    ("TRTLLM_USE_UCX_KVCACHE", "UCX"),
    ("TRTLLM_USE_MOONCAKE_KVCACHE", "MOONCAKE"),
    ("TRTLLM_USE_MPI_KVCACHE", "MPI"),
)
CANCEL_ENV = "TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL"
GATE_ENV = ("TRTLLM_DISABLE_KV_CACHE_TRANSFER_OVERLAP", "TRTLLM_DISAGG_LAYERWISE", "TRTLLM_TRY_ZCOPY_FOR_KVCACHE_TRANSFER")


# -- model classes, as upstream declares them -------------------------------------------------------


class PreTrainedModel:
    """Upstream's base: no preference (both hooks return None)."""

    @classmethod
    def runtime(cls, date: str, architectures: list[str], model_type: str | None, assume: Assumptions) -> str | None:
        return None

    @classmethod
    def kv_version(cls, date: str, assume: Assumptions) -> str | None:
        return None


class GptOss(PreTrainedModel):
    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        return "PYTHON" if date >= "2026-07-20" else None  # #16479

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= "2026-08-10" else None  # #16942 (get_model_defaults)


class KimiK25(PreTrainedModel):
    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        return "PYTHON" if date >= "2026-07-21" else None  # #16482

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= "2026-08-07" else None  # #17125 (get_model_defaults)


class KimiK3VL(KimiK25):
    """#17050 (08-13): a Kimi K2.5 subclass; it overrides get_model_defaults, so K2.5's V2 default
    (a get_model_defaults entry) is not inherited. Before 08-13 the name was registered on KimiLinear."""

    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        if date < "2026-08-13":
            return KimiLinear.runtime(date, architectures, model_type, assume)
        return super().runtime(date, architectures, model_type, assume) if assume.hooks_inherited else None

    @classmethod
    def kv_version(cls, date, assume):
        if assume.kimi_k3_vl_without_v2 or date < "2026-08-13":
            return None
        return super().kv_version(date, assume)


class KimiLinear(PreTrainedModel):
    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        return "PYTHON" if date >= "2026-08-17" else None  # #17480


class MiniMaxM2(PreTrainedModel):
    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= "2026-08-07" else None  # #17360 (get_model_defaults)


class DeepseekV3(PreTrainedModel):
    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        if date >= "2026-08-03":  # #16908: every checkpoint
            return "PYTHON"
        if date >= "2026-07-23":  # #16524: GLM checkpoints only (which signal counts: an assumption)
            glm = model_type == "glm_moe_dsa" or (assume.glm_test_reads_either and "GlmMoeDsaForCausalLM" in architectures)
            return "PYTHON" if glm else None
        return None

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= "2026-08-11" else None  # #16060


class DeepseekV4(PreTrainedModel):
    """#15633 (07-03; the merge date the held-out check gives, its thread was not found):
    get_model_defaults sets use_kv_cache_manager_v2, which auto then keeps like a preference."""

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= "2026-07-03" else None


class MistralLarge3(DeepseekV3):
    """Subclasses DeepseekV3ForCausalLM and inherits both hooks (inferred)."""


class Llama(PreTrainedModel):
    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        return "PYTHON" if date >= "2026-08-11" else None  # #16787

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= "2026-09-15" else None  # #19004


class Llama4(PreTrainedModel):
    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        return "PYTHON" if date >= "2026-09-15" else None  # #19004

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= "2026-09-15" else None


class Gemma3(PreTrainedModel):
    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        return "PYTHON" if date >= "2026-08-11" else None  # #16787

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= "2026-08-18" else None  # #17396


class Gemma3VL(PreTrainedModel):
    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        return "PYTHON" if date >= "2026-08-18" else None  # #17396

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= "2026-08-18" else None


class Gemma4(Gemma3VL):
    """Gemma4 multimodal: both hooks from #17396 (08-18)."""


class Gemma4Text(Gemma4):
    """Gemma4 text: both hooks from #17396 (08-18); its PYTHON preference may be #16787's (08-11)."""

    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        if not assume.gemma_python_from_17396:
            return Gemma3.runtime(date, architectures, model_type, assume)
        return super().runtime(date, architectures, model_type, assume)


class Hybrid(PreTrainedModel):
    """Nemotron-H, Qwen3-Next and Qwen3.5: PYTHON from #16598 (07-28), V2 from an unfound PR."""

    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        return "PYTHON" if date >= HYBRID_PYTHON else None

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= assume.hybrids else None


class NemotronHPuzzle(Hybrid):
    """A second registered name of Nemotron-H's class; registered by v1.4.0rc1 (when is not known)."""

    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        return Hybrid.runtime(date, architectures, model_type, assume) if date >= assume.nemotron_puzzle else None

    @classmethod
    def kv_version(cls, date, assume):
        return Hybrid.kv_version(date, assume) if date >= assume.nemotron_puzzle else None


class Qwen4Exp(PreTrainedModel):
    """#18585 (09-04): both classes prefer V2; no runtime hook at the merge (a draft's PYTHON never merged)."""

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= QWEN4_EXP else None


class NemotronHMultimodal(PreTrainedModel):
    """#19140 (09-15): the multimodal class restates both of Nemotron-H's hooks by delegation."""

    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        if date < NEMOTRON_MULTIMODAL or not assume.nemotron_multimodal_python:
            return None
        return Hybrid.runtime(date, architectures, model_type, assume)

    @classmethod
    def kv_version(cls, date, assume):
        return Hybrid.kv_version(date, assume) if date >= NEMOTRON_MULTIMODAL else None


class Glm5Next(PreTrainedModel):
    """#19136 (09-28): GLM-5.3-Flash; its VL wrapper delegates every hook to it."""

    @classmethod
    def runtime(cls, date, architectures, model_type, assume):
        return "PYTHON" if date >= "2026-09-28" and assume.glm5_next_python else None

    @classmethod
    def kv_version(cls, date, assume):
        return "V2" if date >= "2026-09-28" else None


class DeepseekV41(DeepseekV4):
    """#19727 (in v1.4.0rc1): subclasses DeepSeek-V4's class without overriding a hook; the
    multimodal wrapper delegates to it. Registered from the 1.4 state."""

    @classmethod
    def kv_version(cls, date, assume):
        return super().kv_version(date, assume) if date >= FIELD_DEFAULTS_1_4 else None


class Qwen4ExpAlias(Qwen4Exp):
    """The Qwen3_8FlashNext* names: the same classes as Qwen4-Exp's (PR not found; in the 1.4 state)."""

    @classmethod
    def kv_version(cls, date, assume):
        return super().kv_version(date, assume) if date >= FIELD_DEFAULTS_1_4 else None


#: MODEL_CLASS_MAPPING: checkpoint architectures[0] -> model class.
MODEL_CLASS_MAPPING: dict[str, type[PreTrainedModel]] = {
    "GptOssForCausalLM": GptOss,
    "KimiK25ForConditionalGeneration": KimiK25,
    "KimiK3ForConditionalGeneration": KimiK3VL,
    "KimiLinearForCausalLM": KimiLinear,
    "MiniMaxM2ForCausalLM": MiniMaxM2,
    "DeepseekV3ForCausalLM": DeepseekV3,
    "DeepseekV32ForCausalLM": DeepseekV3,
    "DeepseekV4ForCausalLM": DeepseekV4,
    "GlmMoeDsaForCausalLM": DeepseekV3,
    "MistralLarge3ForCausalLM": MistralLarge3,
    "LlamaForCausalLM": Llama,
    "Llama4ForConditionalGeneration": Llama4,
    "Gemma3ForCausalLM": Gemma3,
    "Gemma3ForConditionalGeneration": Gemma3VL,
    "Gemma4ForCausalLM": Gemma4Text,
    "Gemma4ForConditionalGeneration": Gemma4,
    "Gemma4UnifiedForConditionalGeneration": Gemma4,
    "NemotronHForCausalLM": Hybrid,
    "NemotronHPuzzleForCausalLM": NemotronHPuzzle,
    "Qwen3NextForCausalLM": Hybrid,
    "Qwen3_5ForCausalLM": Hybrid,
    "Qwen3_5MoeForCausalLM": Hybrid,
    "Qwen3_5ForConditionalGeneration": Hybrid,
    "Qwen3_5MoeForConditionalGeneration": Hybrid,
    "MistralForCausalLM": PreTrainedModel,
    "Qwen4ExpForCausalLM": Qwen4Exp,
    "Qwen4ExpForConditionalGeneration": Qwen4Exp,
    "NemotronH_Nano_VL_V2": NemotronHMultimodal,
    "NemotronH_Nano_Omni_Reasoning_V3": NemotronHMultimodal,
    "NemotronH_Omni_Reasoning_V3": NemotronHMultimodal,
    "Glm5NextForCausalLM": Glm5Next,
    "Glm5NextForConditionalGeneration": Glm5Next,
    "DeepseekV41ForCausalLM": DeepseekV41,
    "DeepseekV41ForConditionalGeneration": DeepseekV41,
    "Qwen3_8FlashNextForCausalLM": Qwen4ExpAlias,
    "Qwen3_8FlashNextForConditionalGeneration": Qwen4ExpAlias,
}
#: Classes whose hooks are inherited (inferred from the class hierarchy, not read): without
#: ``Assumptions.hooks_inherited`` they have none of their own.
INHERITING = ("MistralLarge3ForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration")
#: Kimi K3 checks its route in get_kv_cache_manager_cls (#17480); the VL class is assumed covered.
KIMI_K3 = ("KimiLinearForCausalLM", "KimiK3ForConditionalGeneration")


def model_class(architecture: str | None, assume: Assumptions = ASSUMED) -> type[PreTrainedModel]:
    """The model registry's class for ``architectures[0]`` (the base class for a name it lacks)."""
    if not assume.hooks_inherited and architecture in INHERITING:
        return PreTrainedModel
    return MODEL_CLASS_MAPPING.get(architecture or "", PreTrainedModel)


@dataclass(frozen=True)
class Outcome:
    """What upstream ends with: the runtime and manager it would run, and whether it starts."""

    backend: str
    runtime: str
    kv_cache_manager: str
    starts: bool


def load_pretrained_config(
    date: str, architectures: list[str], model_type: str | None, multimodal: bool, assume: Assumptions = ASSUMED
) -> list[str]:
    """``load_pretrained_config``'s rewrites by model_type (config_utils.py): the architectures the
    model registry then reads, whatever the checkpoint's own list says."""
    if model_type == "kimi_k3" and multimodal and date >= KIMI_MULTIMODAL_REWRITE:
        return ["KimiK3ForConditionalGeneration"]
    if model_type in ("kimi_k3", "kimi_linear") and date >= assume.kimi_text_rewrite:
        return ["KimiLinearForCausalLM"]
    qwen4 = date >= QWEN4_EXP and assume.qwen4_rules_with_18585
    # The Qwen3.8-Flash-Next model types normalise to Qwen4-Exp's from the 1.4 state.
    composite = ("qwen4_exp", "qwen3_8_flash_next") if date >= FIELD_DEFAULTS_1_4 else ("qwen4_exp",)
    text = ("qwen4_exp", "qwen4_exp_text", "qwen3_8_flash_next", "qwen3_8_flash_next_text") if date >= FIELD_DEFAULTS_1_4 else ("qwen4_exp", "qwen4_exp_text")
    if qwen4 and model_type in composite and multimodal:
        return ["Qwen4ExpForConditionalGeneration"]
    if qwen4 and model_type in text:
        return ["Qwen4ExpForCausalLM"]
    return architectures


def effective_backend(backend: str, env: dict[str, str]) -> str:
    """``CacheTransceiverConfig._resolve_default_backend``."""
    if backend != "DEFAULT":
        return backend
    for variable, name in BACKEND_ENV:
        if env.get(variable) == "1":
            return name
    return "NIXL"


def resolve(
    version: str,
    architecture: str | None,
    model_type: str | None,
    backend: str | None,
    runtime: str | None,
    timeout: int | None,
    use_v2: bool | str,
    env: dict[str, str],
    pipelined: bool,
    multimodal: bool = False,
    assume: Assumptions = ASSUMED,
) -> Outcome | None:
    """Upstream's outcome for one serving context (None: disaggregation off). ``architecture`` and
    ``model_type`` are the checkpoint's own; ``multimodal``: it has text and vision configs;
    ``assume``: how the uncertain facts are read (the shipped policies' reading by default)."""
    date = VERSION_STATE[version]
    if backend is None:
        return None
    if runtime is LEFT_OUT:  # the field's pydantic default
        runtime = "PYTHON" if date >= FIELD_DEFAULTS_1_4 else "auto"
    if use_v2 is LEFT_OUT:
        use_v2 = True if date >= FIELD_DEFAULTS_1_4 and assume.v2_default_in_1_4 else "auto"
    architectures = load_pretrained_config(date, [architecture] if architecture else [], model_type, multimodal, assume)
    architecture = architectures[0] if architectures else None
    model = model_class(architecture, assume)
    eff = effective_backend(backend, env)

    # Load time (ModelLoader): the runtime first, then the KV-cache manager.
    resolved = runtime
    if runtime == "auto":
        preferred = model.runtime(date, architectures, model_type, assume)
        if date < PYTHON_BY_DEFAULT:
            if preferred == "PYTHON" and eff != "NIXL":
                preferred = None
            resolved = preferred
        else:
            resolved = preferred if preferred is not None else "PYTHON"
            if preferred is None and (eff != "NIXL" or timeout is None):
                resolved = None
    v2 = use_v2
    if use_v2 == "auto":
        v2 = model.kv_version(date, assume) == "V2"
        if v2 and date >= assume.v2_guard and (eff != "NIXL" or resolved != "PYTHON"):
            v2 = False

    # Creation time.
    starts = True
    created = resolved
    if date >= PIPELINED:
        if created is None and pipelined:
            if eff != "NIXL":
                starts = False
            else:
                created = "PYTHON"
        elif created == "CPP" and pipelined:
            starts = False
    elif pipelined and assume.pipelined_not_a_field:
        starts = False  # not a CacheTransceiverConfig field before #15727 (StrictBaseModel)
    if created == "PYTHON" and eff != "NIXL":
        starts = False
    if env.get(CANCEL_ENV) == "1":
        supported = (
            (created or "CPP") == "CPP"
            and backend == "NIXL"
            and env.get("TRTLLM_NIXL_KVCACHE_BACKEND", "UCX") == "UCX"
            and timeout is not None
            and all(env.get(v) != "1" for v in GATE_ENV)
        )
        starts = starts and supported
    if date >= KIMI_K3_GATE and architecture in KIMI_K3:
        # get_kv_cache_manager_cls runs before the transceiver is created: it sees the load-time runtime.
        seen = resolved if assume.kimi_route_check_at_load else created
        if not (eff == "NIXL" and seen == "PYTHON"):
            starts = False
    if created == "PYTHON" and timeout is None:
        starts = False
    if v2 is True and (created or "CPP") == "CPP" and assume.v2_with_cpp_fails:
        starts = False
    return Outcome(eff, created or "CPP", "V2" if v2 is True else "V1", starts)
