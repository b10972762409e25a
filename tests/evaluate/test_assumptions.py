"""The oracle's assumptions are switches, and each reaches only what the docs call uncertain.

``tests/support/upstream.py`` restates TensorRT-LLM independently of the policies, but where upstream's record is
uncertain it reads the facts as the shipped policies do (``upstream.ASSUMED``). Here each such
reading is flipped on its own, the oracle is run over the whole input domain under both, and every
context whose outcome changes must lie in the scope ``docs/policies.md`` gives that fact: nothing the
docs present as certain may rest on an assumption, and no assumption may be dead.
"""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

import pytest

from tests.support import upstream
from tests.support.oracle_inputs import MODELS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "policies.md"
VERSIONS = list(upstream.VERSION_STATE)
HYBRIDS = ("NemotronHForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
           "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
NEMOTRON_MULTIMODAL = ("NemotronH_Nano_VL_V2", "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Omni_Reasoning_V3")
GLM5_NEXT = ("Glm5NextForCausalLM", "Glm5NextForConditionalGeneration")
DEEPSEEK_V3_CLASS = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")
INHERITED = ("MistralLarge3ForCausalLM", "Qwen3_5ForCausalLM", "KimiK3ForConditionalGeneration",
             "Qwen3_5MoeForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration")

#: switch -> (the bold label of its line in docs/policies.md's list of uncertain facts, the scope
#: that line gives it: which contexts may change when the fact is read the other way). A context is
#: (version, the architecture upstream runs after its load-time rewrites, the checkpoint's
#: model_type, pipelined transfer, upstream's outcome under the shipped reading).
SCOPES = {
    "hybrids_with_18134": ("Hybrid models' hooks", lambda v, arch, mt, pipelined, out: arch in HYBRIDS and v < "2026.08.24"),
    "glm_test_reads_either": ("#16524's GLM test", lambda v, arch, mt, pipelined, out: arch in DEEPSEEK_V3_CLASS and v in ("2026.07.23", "2026.07.28")),
    "nemotron_puzzle_by_rc1": ("Nemotron-H Puzzle", lambda v, arch, mt, pipelined, out: arch == "NemotronHPuzzleForCausalLM" and v < "2026.10.22"),
    "hooks_inherited": ("Inherited hooks", lambda v, arch, mt, pipelined, out: arch in INHERITED),
    "kimi_k3_vl_without_v2": (
        "Kimi K3 multimodal and V2",
        lambda v, arch, mt, pipelined, out: arch == "KimiK3ForConditionalGeneration" and v >= "2026.08.13",
    ),
    "gemma_python_from_17396": (
        "Gemma3 multimodal / Gemma4 text PYTHON",
        lambda v, arch, mt, pipelined, out: arch == "Gemma4ForCausalLM" and "2026.08.11" <= v < "2026.08.18",
    ),
    "pipelined_not_a_field": ("`enable_pipelined_transfer` before #15727", lambda v, arch, mt, pipelined, out: pipelined and v < "2026.09.02"),
    "v2_with_cpp_fails": (
        "Plain KV-cache manager V2 with the C++ transceiver",
        lambda v, arch, mt, pipelined, out: out.kv_cache_manager == "V2" and out.runtime == "CPP",
    ),
    "v2_guard_by_07_28": ("DeepSeek-V4's V2 default", lambda v, arch, mt, pipelined, out: arch == "DeepseekV4ForCausalLM" and v < "2026.07.28"),
    "kimi_route_check_at_load": ("Kimi K3's route check", lambda v, arch, mt, pipelined, out: arch in upstream.KIMI_K3 and pipelined and v >= "2026.09.02"),
    "qwen4_rules_with_18585": (
        "Qwen4-Exp's checkpoint rules",
        lambda v, arch, mt, pipelined, out: mt in ("qwen4_exp", "qwen4_exp_text", "qwen3_8_flash_next", "qwen3_8_flash_next_text") and v >= "2026.09.04",
    ),
    "nemotron_multimodal_python": (
        "Nemotron-H multimodal's PYTHON preference",
        lambda v, arch, mt, pipelined, out: arch in NEMOTRON_MULTIMODAL and v >= "2026.09.15",
    ),
    "glm5_next_python": ("GLM-5.3-Flash's PYTHON preference", lambda v, arch, mt, pipelined, out: arch in GLM5_NEXT and v >= "2026.09.28"),
    "v2_default_in_1_4": ("KV-cache manager V2 by default in 1.4", lambda v, arch, mt, pipelined, out: v >= "2026.10.22"),
}


def _domain():
    """Every version, model (the policies' and the oracle's, plus composite Kimi K3 checkpoints),
    backend (DEFAULT unset or picking UCX), runtime, timeout, manager and pipelined transfer."""
    models = [(a, mt, False) for a, mt in MODELS] + [("KimiK3ForConditionalGeneration", "kimi_k3", True)]
    backends = [("DEFAULT", {}), ("DEFAULT", {"TRTLLM_USE_UCX_KVCACHE": "1"})] + [(b, {}) for b in ("NIXL", "UCX", "MPI", "MOONCAKE")]
    for version, (architecture, model_type, multimodal), (backend, env), runtime, timeout, use_v2, pipelined in itertools.product(
        VERSIONS, models, backends, ("auto", "CPP", "PYTHON", None, upstream.LEFT_OUT), (60000, None), ("auto", False, True, upstream.LEFT_OUT), (False, True)
    ):
        yield version, architecture, model_type, backend, runtime, timeout, use_v2, env, pipelined, multimodal


@functools.cache
def _outcomes(assume: upstream.Assumptions) -> tuple:
    return tuple(upstream.resolve(*context, assume=assume) for context in _domain())


def test_the_shipped_reading_is_the_default():
    assert upstream.ASSUMED == upstream.Assumptions()
    assert all(getattr(upstream.ASSUMED, name) is True for name in upstream.SWITCHES)
    assert set(SCOPES) == set(upstream.SWITCHES)


@pytest.mark.parametrize("switch", upstream.SWITCHES)
def test_each_assumption_changes_only_what_the_docs_list_as_uncertain(switch):
    label, in_scope = SCOPES[switch]
    shipped, other = _outcomes(upstream.ASSUMED), _outcomes(upstream.ASSUMED.flipped(switch))
    changed, outside = 0, []
    for context, want, alternative in zip(_domain(), shipped, other):
        if want == alternative:
            continue
        changed += 1
        version, architecture, model_type, _, _, _, _, _, pipelined, multimodal = context
        date = upstream.VERSION_STATE[version]
        loaded = upstream.load_pretrained_config(date, [architecture] if architecture else [], model_type, multimodal)
        runs = loaded[0] if loaded else None
        if not in_scope(version, runs, model_type, pipelined, want):
            outside.append(f"{context}: {want} -> {alternative}")
    assert changed, f"{switch} ({label}) changes nothing: a dead switch"
    assert not outside, f"{switch} ({label}) changes {len(outside)} contexts outside its scope, e.g.:\n" + "\n".join(outside[:10])


def _uncertain_labels() -> list[str]:
    """The bold labels of the bullets that follow "Uncertain upstream facts" in docs/policies.md."""
    lines = DOCS.read_text(encoding="utf-8").split("Uncertain upstream facts", 1)[1].splitlines()[1:]
    labels = []
    for line in itertools.dropwhile(lambda line: not line.strip(), lines):
        if not line.startswith(("- ", "  ")):
            break
        labels += re.findall(r"^- \*\*(.+?)\*\*", line)
    return labels


def test_every_uncertain_fact_the_docs_list_is_a_switch_and_every_switch_is_listed():
    labels = _uncertain_labels()
    assert labels, "docs/policies.md lost its list of uncertain upstream facts"
    switched = {label for label, _ in SCOPES.values()}
    assert switched <= set(labels), sorted(switched - set(labels))
    # What the docs list but the oracle does not model ("Left out") is the only line without a switch.
    assert set(labels) - switched == set(), sorted(set(labels) - switched)
