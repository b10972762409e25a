"""The finer rules of finding a model: the checkpoint config read, the hub cache, the models-root
prefix, the architecture map and the identity's own shape, each with a checkpoint layout of its own.

Each case pins one behaviour a user sees (the identity found, where it came from, the problem
message, the folders tried and their order) or one guarantee a caller relies on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path

import pytest

from kvpolicy.evaluate.index import is_multimodal
from kvpolicy.serving.identity import (
    ArchitectureMap,
    ModelIdentity,
    ModelReference,
    candidate_folders,
    find_model,
    load_architecture_map,
    model_reference,
)

from tests.support.serving import DISAGG_UCX, checkpoint, resolve_config


def raw_checkpoint(folder: Path, data: object) -> Path:
    """A checkpoint whose config.json is exactly ``data``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data), encoding="utf-8")
    return folder


def hub_entry(hub: Path, folder_name: str, revision: str) -> Path:
    """A hub-cache repository folder whose refs/main holds ``revision``."""
    (hub / folder_name / "refs").mkdir(parents=True, exist_ok=True)
    (hub / folder_name / "refs" / "main").write_text(revision, encoding="utf-8")
    return hub / folder_name


def find(text: str, tmp_path: Path, **options) -> ModelIdentity:
    return find_model(ModelReference(text, ("model",)), config_dir=options.pop("config_dir", tmp_path / "configs"), root=options.pop("root", None), **options)


@pytest.fixture(autouse=True)
def no_models_root(monkeypatch, tmp_path):
    monkeypatch.delenv("LLM_MODELS_ROOT", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.chdir(tmp_path)


# -- the checkpoint's config.json ----------------------------------------------------------------------


def test_the_first_architecture_names_the_model(tmp_path):
    raw_checkpoint(tmp_path / "m", {"architectures": ["LlamaForCausalLM", "MistralForCausalLM"], "model_type": "llama"})
    identity = find("m", tmp_path)
    assert (identity.architecture, identity.model_type, identity.source) == ("LlamaForCausalLM", "llama", "config.json")
    assert identity.where == str(tmp_path / "m" / "config.json")


def test_later_architectures_are_not_checked(tmp_path):
    # Upstream reads architectures[0] only: what follows it does not matter.
    raw_checkpoint(tmp_path / "m", {"architectures": ["LlamaForCausalLM", 7]})
    assert find("m", tmp_path).architecture == "LlamaForCausalLM"
    raw_checkpoint(tmp_path / "n", {"architectures": ["LlamaForCausalLM", ""]})
    assert find("n", tmp_path).architecture == "LlamaForCausalLM"


@pytest.mark.parametrize(
    "architectures",
    [[], [7], [""], [None, "LlamaForCausalLM"], [7, "LlamaForCausalLM"], ["", "LlamaForCausalLM"], "LlamaForCausalLM"],
    ids=["empty", "number", "empty-name", "null-first", "number-first", "empty-name-first", "string"],
)
def test_an_unusable_first_architecture_is_a_problem_with_its_location(tmp_path, architectures):
    raw_checkpoint(tmp_path / "m", {"architectures": architectures, "model_type": "llama"})
    identity = find("m", tmp_path)
    config = tmp_path / "m" / "config.json"
    assert identity.architecture is None and identity.source == "unknown"
    assert identity.problem == f"{config}: `architectures` must be a non-empty list of names, got {architectures!r}"
    assert identity.tried == (str(tmp_path / "configs" / "m"), str(tmp_path / "m"))


def test_a_checkpoint_with_only_a_model_type_says_so(tmp_path):
    raw_checkpoint(tmp_path / "m", {"model_type": "llama"})
    identity = find("m", tmp_path)
    config = tmp_path / "m" / "config.json"
    assert (identity.architecture, identity.model_type, identity.source, identity.where) == (None, "llama", "config.json", str(config))
    assert identity.problem == f"{config} names no `architectures`, only model_type 'llama'"


@pytest.mark.parametrize("model_type", [None, "", 7], ids=["null", "empty", "number"])
def test_a_checkpoint_with_neither_architectures_nor_a_model_type_is_a_problem(tmp_path, model_type):
    raw_checkpoint(tmp_path / "m", {"model_type": model_type})
    identity = find("m", tmp_path)
    config = tmp_path / "m" / "config.json"
    assert (identity.architecture, identity.model_type, identity.source) == (None, None, "unknown")
    assert identity.problem == f"{config}: `architectures` must be a non-empty list of names, got None"


@pytest.mark.parametrize("model_type", ["", 7, ["llama"]], ids=["empty", "number", "list"])
def test_a_model_type_that_is_not_a_name_is_ignored(tmp_path, model_type):
    raw_checkpoint(tmp_path / "m", {"architectures": ["LlamaForCausalLM"], "model_type": model_type})
    identity = find("m", tmp_path)
    assert (identity.architecture, identity.model_type) == ("LlamaForCausalLM", None)
    assert identity.pretrained_config() == {"architectures": ["LlamaForCausalLM"], "model_type": None}
    assert identity.describe() == f"LlamaForCausalLM, from config.json {tmp_path / 'm' / 'config.json'}"


def test_a_checkpoint_config_over_the_size_cap_is_a_problem_not_read(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    with open(folder / "config.json", "wb") as handle:  # sparse: the size is all that is checked
        handle.truncate((4 << 20) + 1)
    identity = find("m", tmp_path)
    assert identity.architecture is None
    assert identity.problem == (
        f"cannot read the checkpoint config: {folder / 'config.json'}: the file is 4,194,305 bytes; config files are limited to 4,194,304 bytes"
    )


def test_a_composite_checkpoint_gives_a_composite_pretrained_config(tmp_path):
    checkpoint(tmp_path / "k3", "KimiK3ForConditionalGeneration", "kimi_k3", text_config={"hidden_size": 8}, vision_config={"hidden_size": 8})
    identity = find("k3", tmp_path)
    assert identity.multimodal
    config = identity.pretrained_config()
    # Non-empty text and vision configs that say they are there, as upstream's composite test reads.
    assert config == {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "text_config": {"present": True},
        "vision_config": {"present": True},
    }
    assert is_multimodal(config.get)


# -- the identity and the map are values ---------------------------------------------------------------


def test_an_identity_is_an_immutable_hashable_value(tmp_path):
    checkpoint(tmp_path / "m", "LlamaForCausalLM", "llama")
    identity = find("m", tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        identity.architecture = "MistralForCausalLM"  # type: ignore[misc]
    assert identity in {identity} and identity == find("m", tmp_path)


def test_an_architecture_map_is_an_immutable_hashable_value(tmp_path):
    arch_map = tmp_path / "map.yaml"
    arch_map.write_text('"*GLM-5*": GlmMoeDsaForCausalLM\n')
    loaded = load_architecture_map(arch_map)
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.entries = ()  # type: ignore[misc]
    assert loaded in {loaded} and loaded == load_architecture_map(arch_map)


def test_the_folders_and_roots_are_keyword_only(tmp_path):
    # Two paths side by side: passed by position, a swapped pair would silently swap the search order.
    with pytest.raises(TypeError):
        candidate_folders("m", tmp_path / "configs", tmp_path / "models")  # type: ignore[misc]
    with pytest.raises(TypeError):
        find_model(ModelReference("m", ("model",)), tmp_path / "configs", tmp_path / "models")  # type: ignore[misc]
    # The reference may be named.
    assert candidate_folders(reference="m", config_dir=None, root=tmp_path / "models", cwd=tmp_path) == [tmp_path / "models" / "m", tmp_path / "m"]
    assert find_model(reference=None, config_dir=None, root=None) == ModelIdentity()


# -- describing an unknown model -----------------------------------------------------------------------


def test_an_unknown_model_says_where_it_was_looked_for(tmp_path):
    identity = find("m", tmp_path, root=tmp_path / "models")
    looked = [tmp_path / "models" / "m", tmp_path / "configs" / "m", tmp_path / "m"]
    assert identity.tried == tuple(map(str, looked))
    assert identity.describe() == f"unknown (no config.json found for model 'm'; looked in {', '.join(map(str, looked))})"


def test_a_rooted_model_without_a_models_root_looks_nowhere(capsys, tmp_path):
    checkpoint(tmp_path / "llama", "LlamaForCausalLM")  # in the working directory: not the models root
    checkpoint(tmp_path / "configs" / "llama", "LlamaForCausalLM")  # beside the config: not the root either
    identity = find("${LLM_MODELS_ROOT}/llama", tmp_path)
    assert identity.tried == ()
    assert identity.describe() == "unknown (no config.json found for model '${LLM_MODELS_ROOT}/llama')"
    config = tmp_path / "configs" / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="${LLM_MODELS_ROOT}/llama"))
    code, out, _ = resolve_config(capsys, config, "--format", "json")
    servers = json.loads(out)["servers"]
    assert [s["model"]["tried"] for s in servers] == [[], []]
    assert all(s["model"]["architecture"] is None for s in servers)


# -- the models-root prefix ----------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["${LLM_MODELS_ROOT}/", "$LLM_MODELS_ROOT/", "LLM_MODELS_ROOT/"])
def test_a_rooted_model_is_looked_for_under_the_root_only(tmp_path, prefix):
    checkpoint(tmp_path / "llama", "MistralForCausalLM")
    checkpoint(tmp_path / "configs" / "llama", "MistralForCausalLM")
    root = tmp_path / "models"
    assert candidate_folders(prefix + "llama", config_dir=tmp_path / "configs", root=root, cwd=tmp_path) == [root / "llama"]
    identity = find(prefix + "llama", tmp_path, root=root)
    assert identity.architecture is None and identity.tried == (str(root / "llama"),)
    checkpoint(root / "llama", "LlamaForCausalLM")
    assert find(prefix + "llama", tmp_path, root=root).architecture == "LlamaForCausalLM"


def test_only_one_models_root_prefix_is_taken_off(tmp_path):
    # A folder named LLM_MODELS_ROOT under the root is a folder, not a second prefix.
    root = tmp_path / "models"
    checkpoint(root / "LLM_MODELS_ROOT" / "llama", "LlamaForCausalLM")
    checkpoint(root / "llama", "MistralForCausalLM")
    for text in ("${LLM_MODELS_ROOT}/LLM_MODELS_ROOT/llama", "$LLM_MODELS_ROOT/LLM_MODELS_ROOT/llama"):
        assert candidate_folders(text, config_dir=None, root=root, cwd=tmp_path) == [root / "LLM_MODELS_ROOT" / "llama"]
        assert find(text, tmp_path, root=root).architecture == "LlamaForCausalLM"
    assert candidate_folders("${LLM_MODELS_ROOT}/$LLM_MODELS_ROOT/llama", config_dir=None, root=root, cwd=tmp_path) == [root / "$LLM_MODELS_ROOT" / "llama"]


# -- the local hub cache -------------------------------------------------------------------------------


def test_hf_home_names_the_hub_cache_when_hf_hub_cache_is_unset(tmp_path, monkeypatch):
    home = tmp_path / "hf-home"
    checkpoint(hub_entry(home / "hub", "models--org--model", "abc123") / "snapshots" / "abc123", "LlamaForCausalLM")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(home))
    identity = find("org/model", tmp_path)
    snapshot = home / "hub" / "models--org--model" / "snapshots" / "abc123"
    assert identity.architecture == "LlamaForCausalLM" and identity.where == str(snapshot / "config.json")
    assert identity.tried == (str(tmp_path / "configs" / "org" / "model"), str(tmp_path / "org" / "model"), str(snapshot))


HUB_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.mark.parametrize(
    "case",
    [
        {"XDG_CACHE_HOME": "{tmp}/xdg"},
        {"HOME": "{tmp}/home", "HF_HOME": "~/hf"},
        {"CACHES": "{tmp}/caches", "HF_HUB_CACHE": "$CACHES/hub"},
        {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy"},
        {"HF_HOME": "{tmp}/home-wins", "XDG_CACHE_HOME": "{tmp}/xdg-loses"},
        {"HF_HUB_CACHE": "{tmp}/new-wins", "HUGGINGFACE_HUB_CACHE": "{tmp}/legacy-loses"},
    ],
    ids=["xdg", "tilde", "dollar", "legacy", "hf-home-over-xdg", "hf-hub-cache-over-legacy"],
)
def test_the_hub_cache_is_where_huggingface_hub_itself_looks(tmp_path, monkeypatch, case):
    # The same environment, given to huggingface_hub (what TensorRT-LLM loads checkpoints with):
    # the model cached where it looks is the model kvpolicy finds.
    pytest.importorskip("huggingface_hub", reason="huggingface_hub comes with the demo extra (transformers)")
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in HUB_VARIABLES}
    env.update({k: v.replace("{tmp}", str(tmp_path)) for k, v in case.items()})
    asked = "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"
    hub = Path(subprocess.run([sys.executable, "-c", asked], env=env, capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    assert str(tmp_path) in str(hub), hub
    checkpoint(hub_entry(hub, "models--org--model", "abc123") / "snapshots" / "abc123", "LlamaForCausalLM")
    for variable in HUB_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        if variable in case:
            monkeypatch.setenv(variable, value)
    identity = find("org/model", tmp_path)
    assert identity.architecture == "LlamaForCausalLM", identity.tried
    assert identity.where == str(hub / "models--org--model" / "snapshots" / "abc123" / "config.json")


@pytest.mark.parametrize("reference", ["../model", "./model", "org/..", "org/."])
def test_a_dot_component_is_not_a_hub_id(tmp_path, monkeypatch, reference):
    # Hugging Face refuses `..` and `.` components in a repo id: such a reference is a path only.
    hub = tmp_path / "hub"
    owner, name = reference.split("/")
    entry = hub_entry(hub, f"models--{owner}--{name}", "abc123")
    checkpoint(entry / "snapshots" / "abc123", "LlamaForCausalLM")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    cwd = tmp_path / "work" / "here"
    cwd.mkdir(parents=True)
    identity = find(reference, tmp_path, cwd=cwd)
    assert identity.architecture is None
    assert identity.tried == (str(tmp_path / "configs" / reference), str(cwd / reference))


def test_a_hub_id_with_an_empty_component_is_not_looked_up(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    checkpoint(hub_entry(hub, "models--org--", "abc123") / "snapshots" / "abc123", "LlamaForCausalLM")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    identity = find("org/", tmp_path)
    assert identity.architecture is None
    assert identity.tried == (str(tmp_path / "configs" / "org"), str(tmp_path / "org"))


@pytest.mark.parametrize("revision", ["../../elsewhere", "abc/../../../elsewhere", "", "\n"], ids=["up", "nested", "empty", "blank"])
def test_a_hub_ref_that_is_not_a_revision_finds_nothing(tmp_path, monkeypatch, revision):
    # refs/main names a snapshot folder: a path in it must not lead out of the snapshots, and an
    # empty one names no snapshot (not the snapshots folder itself).
    hub = tmp_path / "hub"
    entry = hub_entry(hub, "models--org--model", revision)
    checkpoint(hub / "elsewhere", "LlamaForCausalLM")
    checkpoint(entry / "snapshots", "LlamaForCausalLM")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    identity = find("org/model", tmp_path)
    assert identity.architecture is None
    assert identity.tried == (str(tmp_path / "configs" / "org" / "model"), str(tmp_path / "org" / "model"))


def test_an_oversized_hub_ref_is_not_read(tmp_path, monkeypatch):
    # refs/main holds a commit hash; one of kilobytes is not a ref, and is not read whole.
    hub = tmp_path / "hub"
    entry = hub_entry(hub, "models--org--model", "abc123" + " " * 5000)
    checkpoint(entry / "snapshots" / "abc123", "LlamaForCausalLM")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    identity = find("org/model", tmp_path)
    assert identity.architecture is None
    assert identity.tried == (str(tmp_path / "configs" / "org" / "model"), str(tmp_path / "org" / "model"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_hub_ref_that_is_a_fifo_is_not_waited_on(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    (hub / "models--org--model" / "refs").mkdir(parents=True)
    fifo = hub / "models--org--model" / "refs" / "main"
    os.mkfifo(fifo)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    done = threading.Event()

    def unblock() -> None:  # if the lookup waits on the FIFO for a writer, be that writer after 5 s
        if not done.wait(5):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass

    watchdog = threading.Thread(target=unblock, daemon=True)
    watchdog.start()
    started = time.monotonic()
    try:
        identity = find("org/model", tmp_path)
    finally:
        done.set()
        watchdog.join()
    assert time.monotonic() - started < 4
    assert identity.architecture is None
    assert identity.tried == (str(tmp_path / "configs" / "org" / "model"), str(tmp_path / "org" / "model"))


def test_a_model_name_with_a_nul_is_not_found_rather_than_a_crash(capsys, tmp_path):
    identity = find("org/a\0b", tmp_path)
    assert identity.architecture is None and identity.problem is None
    assert identity.tried == (str(tmp_path / "configs" / "org" / "a\0b"), str(tmp_path / "org" / "a\0b"))
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model='"org/a\\0b"'))
    code, out, _ = resolve_config(capsys, config)
    assert code == 3 and "model: unknown (no config.json found for model 'org/a\\x00b'" in out


# -- the perf-sanity metadata --------------------------------------------------------------------------


def test_perf_sanity_metadata_names_the_folder_then_the_other_name_once(tmp_path):
    both = model_reference({"metadata": {"model_dir_name": "GPT-OSS-120B-FP4", "model_name": "gpt_oss_120b_fp4"}}, ())
    assert both == ModelReference("GPT-OSS-120B-FP4", ("metadata", "model_dir_name"), ("gpt_oss_120b_fp4",))
    same = model_reference({"metadata": {"model_dir_name": "gpt_oss", "model_name": "gpt_oss"}}, ())
    assert same == ModelReference("gpt_oss", ("metadata", "model_dir_name"), ())
    root = tmp_path / "models"
    identity = find_model(both, config_dir=tmp_path, root=root)
    assert identity.tried == tuple(
        str(p) for p in (root / "GPT-OSS-120B-FP4", tmp_path / "GPT-OSS-120B-FP4", root / "gpt_oss_120b_fp4", tmp_path / "gpt_oss_120b_fp4")
    )


# -- the architecture map ------------------------------------------------------------------------------


def test_an_arch_map_pattern_matches_the_last_path_component(tmp_path):
    arch_map = ArchitectureMap((("GLM-5-FP8", "GlmMoeDsaForCausalLM", None),), "map.yaml")
    assert arch_map.lookup("zai/GLM-5-FP8") == ("GlmMoeDsaForCausalLM", None, "GLM-5-FP8")
    assert arch_map.lookup("models/zai/GLM-5-FP8/") == ("GlmMoeDsaForCausalLM", None, "GLM-5-FP8")
    identity = find_model(ModelReference("zai/GLM-5-FP8", ("model",)), config_dir=tmp_path, root=None, architecture_map=arch_map)
    assert (identity.architecture, identity.source, identity.where) == ("GlmMoeDsaForCausalLM", "arch-map", "map.yaml (GLM-5-FP8)")


def test_an_arch_map_pattern_does_not_match_a_leading_component(tmp_path):
    arch_map = ArchitectureMap((("zai", "GlmMoeDsaForCausalLM", None),), "map.yaml")
    assert arch_map.lookup("zai/GLM-5-FP8") is None
    identity = find_model(ModelReference("zai/GLM-5-FP8", ("model",)), config_dir=tmp_path, root=None, architecture_map=arch_map)
    assert identity.architecture is None and identity.source == "unknown"


@pytest.mark.parametrize(
    "entry",
    ['"*GLM*": {model_type: glm}', '"*GLM*": {architecture: 7}', '"*GLM*": 7', '"*GLM*": ""', '"*GLM*": [GlmMoeDsaForCausalLM]', '"*GLM*": null'],
    ids=["no-architecture", "number-architecture", "number", "empty", "list", "null"],
)
def test_an_arch_map_entry_without_an_architecture_name_is_refused_with_its_location(capsys, tmp_path, entry):
    arch_map = tmp_path / "map.yaml"
    arch_map.write_text(entry + "\n")
    with pytest.raises(ValueError, match=r"map\.yaml: '\*GLM\*': expected an architecture name or \{architecture: \.\.\., model_type: \.\.\.\}, got "):
        load_architecture_map(arch_map)
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="zai/GLM-5-FP8"))
    code, _, err = resolve_config(capsys, config, "--arch-map", str(arch_map))
    assert code == 2 and f"--arch-map: {arch_map}: '*GLM*': expected an architecture name" in err


def test_an_arch_map_entry_with_a_model_type(tmp_path):
    arch_map = tmp_path / "map.yaml"
    arch_map.write_text('"*K3*": {architecture: KimiK3ForCausalLM, model_type: kimi_k3}\n"*GLM*": {architecture: GlmMoeDsaForCausalLM, model_type: 7}\n')
    loaded = load_architecture_map(arch_map)
    assert loaded.entries == (("*K3*", "KimiK3ForCausalLM", "kimi_k3"), ("*GLM*", "GlmMoeDsaForCausalLM", None))
    assert loaded.path == str(arch_map)


def test_an_unreadable_arch_map_is_refused_with_its_location(capsys, tmp_path):
    arch_map = tmp_path / "map.yaml"
    arch_map.write_text('"*GLM*": [unclosed\n')
    with pytest.raises(ValueError, match=r"map\.yaml:\d+:\d+: invalid YAML"):
        load_architecture_map(arch_map)
    config = tmp_path / "c.yaml"
    config.write_text(DISAGG_UCX.format(model="zai/GLM-5-FP8"))
    code, _, err = resolve_config(capsys, config, "--arch-map", str(arch_map))
    assert code == 2 and f"--arch-map: {arch_map}:" in err and "invalid YAML" in err


# -- identities that do not come from a config.json ----------------------------------------------------


def test_an_identity_not_read_from_a_checkpoint_is_text_only(capsys, tmp_path):
    # The arch map and --arch name no text or vision config: the checkpoint rules read them as
    # text-only, so a kimi_k3 map entry is flattened to KimiLinearForCausalLM, as upstream's text rule does.
    arch_map = ArchitectureMap((("*K3*", "KimiK3ForCausalLM", "kimi_k3"),), "map.yaml")
    identity = find_model(ModelReference("moonshot/Kimi-K3", ("model",)), config_dir=tmp_path, root=None, architecture_map=arch_map)
    assert identity.source == "arch-map" and not identity.multimodal
    assert identity.pretrained_config() == {"architectures": ["KimiK3ForCausalLM"], "model_type": "kimi_k3"}
    assert not ModelIdentity().multimodal and not ModelIdentity("KimiK3ForCausalLM", None, "--arch").multimodal
    map_file = tmp_path / "map.yaml"
    map_file.write_text('"*K3*": {architecture: KimiK3ForCausalLM, model_type: kimi_k3}\n')
    config = tmp_path / "c.yaml"
    config.write_text("model: moonshot/Kimi-K3\ncache_transceiver_config:\n  backend: NIXL\n")
    code, out, _ = resolve_config(capsys, config, "--arch-map", str(map_file))
    assert code == 0 and "context: KimiLinearForCausalLM, model_type kimi_k3," in out


def test_a_checkpoint_config_at_the_size_cap_is_read(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    text = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    (folder / "config.json").write_text(text + " " * ((4 << 20) - len(text)), encoding="utf-8")
    assert (folder / "config.json").stat().st_size == 4 << 20
    assert find("m", tmp_path).architecture == "LlamaForCausalLM"


@pytest.mark.parametrize("revision", [".", ".."], ids=["dot", "dot-dot"])
def test_a_hub_ref_of_dots_names_no_snapshot(tmp_path, monkeypatch, revision):
    hub = tmp_path / "hub"
    entry = hub_entry(hub, "models--org--model", revision)
    checkpoint(entry / "snapshots", "LlamaForCausalLM")
    checkpoint(entry, "LlamaForCausalLM")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    identity = find("org/model", tmp_path)
    assert identity.architecture is None
    assert identity.tried == (str(tmp_path / "configs" / "org" / "model"), str(tmp_path / "org" / "model"))
