"""Which model a server of a serving config runs, found the way TensorRT-LLM finds it.

The policy keys on the checkpoint's ``architectures[0]`` (and ``model_type``), so a verdict is only
as good as this lookup. For each server:

1. **the model reference**: the section's own ``model`` (a per-section override), else the
   top-level ``model``; in the perf-sanity layout, ``metadata.model_dir_name`` (the folder under
   the models root), else ``metadata.model_name``;
2. **the checkpoint folder**, tried in this order: an absolute path as written; under the models
   root (``--models-root``, else ``$LLM_MODELS_ROOT``; a ``${LLM_MODELS_ROOT}/`` prefix is read as
   that root); relative to the config file's folder; relative to the working directory; a
   Hugging Face hub id (``org/name``) in the local hub cache (``$HF_HUB_CACHE``, else
   ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), as ``from_pretrained`` would find it;
3. its ``config.json``: ``architectures[0]`` and ``model_type``. The policy version then applies
   upstream's own mapping rules (e.g. Kimi K3 text checkpoints by ``model_type``) when it resolves;
4. else an architecture map (model path glob -> architecture);
5. else the architecture is **unknown**, and the caller must say what holds for every model
   (:mod:`kvpolicy.evaluate.verdict`), never "can start".

Every identity says where it came from (:attr:`ModelIdentity.source`) and which paths were tried.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ArchitectureMap",
    "ModelIdentity",
    "ModelReference",
    "find_model",
    "load_architecture_map",
    "model_reference",
    "models_root_problem",
    "models_root",
    "read_checkpoint",
]

#: ``model:`` prefixes that name the models root (upstream's configs and tests write them).
_ROOT_PREFIXES = ("${LLM_MODELS_ROOT}/", "$LLM_MODELS_ROOT/", "LLM_MODELS_ROOT/")
#: The checkpoint config read (real ones are a few KB).
_MAX_MODEL_CONFIG_BYTES = 4 << 20
#: A hub cache's ``refs/main`` (a commit hash: 40 characters).
_MAX_HUB_REF_BYTES = 4096


@dataclass(frozen=True)
class ModelReference:
    """What a server names as its model, and where in the config it says so."""

    text: str
    keys: tuple[Any, ...]
    alternatives: tuple[str, ...] = ()
    """Other names for the same model, tried after ``text`` (perf-sanity configs name it twice)."""

    @property
    def texts(self) -> tuple[str, ...]:
        """``text`` then the alternatives."""
        return (self.text, *self.alternatives)


@dataclass(frozen=True)
class ModelIdentity:
    """The model a server runs, as far as it could be found."""

    architecture: str | None = None
    model_type: str | None = None
    source: str = "unknown"
    """``config.json``, ``arch-map``, ``--arch``, ``--model`` or ``unknown``."""
    where: str | None = None
    """The config.json path, the arch-map pattern (with the map's path), or None."""
    reference: ModelReference | None = None
    tried: tuple[str, ...] = ()
    """Folders looked in for a config.json, in order (for "unknown": why)."""
    problem: str | None = None
    """A config.json that was found but cannot be used (the message has its location)."""
    multimodal: bool = False
    """The checkpoint is a composite one (non-empty text and vision configs, not language-model-only),
    which some of upstream's load-time rules read."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: what was found, where and how, and what was tried."""
        return {
            "architecture": self.architecture,
            "model_type": self.model_type,
            "source": self.source,
            "where": self.where,
            "reference": self.reference.text if self.reference else None,
            "tried": list(self.tried),
            **({"problem": self.problem} if self.problem else {}),
        }

    @property
    def known(self) -> bool:
        """Whether the architecture is known."""
        return self.architecture is not None

    def pretrained_config(self) -> dict[str, Any] | None:
        """The ``pretrained_config`` field ``resolve`` takes, or None when unknown."""
        if self.architecture is None:
            return None
        config: dict[str, Any] = {"architectures": [self.architecture], "model_type": self.model_type}
        if self.multimodal:  # what upstream's composite-checkpoint test reads (see kvpolicy.evaluate.index.is_multimodal)
            config.update(text_config={"present": True}, vision_config={"present": True})
        return config

    def describe(self) -> str:
        """One line: the architecture and where it came from."""
        if self.architecture is None:
            if self.reference is None and self.source == "unknown":
                return "unknown (the config names no model: no `model`, no `metadata.model_name`)"
            ref = f" for model {self.reference.text!r}" if self.reference else ""
            if self.problem:
                return f"unknown ({self.problem})"
            looked = f"; looked in {', '.join(self.tried)}" if self.tried else ""
            return f"unknown (no config.json found{ref}{looked})"
        name = self.architecture + (f" (model_type {self.model_type})" if self.model_type else "")
        return f"{name}, from {self.source}" + (f" {self.where}" if self.where else "")


# -- architecture maps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchitectureMap:
    """Model path globs -> (architecture, model_type), first match wins (file order)."""

    entries: tuple[tuple[str, str, str | None], ...] = ()
    path: str = ""

    def lookup(self, model: str) -> tuple[str, str | None, str] | None:
        """(architecture, model_type, pattern) of the first pattern matching ``model`` (the whole
        value, or its last path component)."""
        last = model.rstrip("/").rsplit("/", 1)[-1]
        for pattern, architecture, model_type in self.entries:
            if fnmatch.fnmatchcase(model, pattern) or fnmatch.fnmatchcase(last, pattern):
                return architecture, model_type, pattern
        return None

    def near_misses(self, named: frozenset[str]) -> list[str]:
        """Messages for values that look like typos of architectures ``named`` names."""
        from ..evaluate.names import near_miss

        found = []
        for pattern, architecture, _ in self.entries:
            close = near_miss(architecture, named)
            if close is not None:
                found.append(f"{self.path}: {pattern!r}: {architecture!r} is not an architecture the policy names; did you mean {close!r}?")
        return found


def load_architecture_map(path: str | Path) -> ArchitectureMap:
    """Read an architecture map (YAML or JSON): ``{glob: Architecture}`` or
    ``{glob: {architecture: ..., model_type: ...}}``. Raises ValueError with the location."""
    from .configfile import ConfigFileError, read_config

    text_path = str(path)
    if not Path(path).is_file():
        raise ValueError(f"{text_path}: no such file (an architecture map is a YAML or JSON file)")
    try:
        document, _ = read_config(Path(path))
    except ConfigFileError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(document, Mapping):
        raise ValueError(f"{text_path}: expected a mapping of model path globs to architectures")
    entries: list[tuple[str, str, str | None]] = []
    for pattern, target in document.items():
        if isinstance(target, str) and target:
            entries.append((str(pattern), target, None))
        elif isinstance(target, Mapping) and isinstance(target.get("architecture"), str):
            model_type = target.get("model_type")
            entries.append((str(pattern), target["architecture"], model_type if isinstance(model_type, str) else None))
        else:
            raise ValueError(f"{text_path}: {pattern!r}: expected an architecture name or {{architecture: ..., model_type: ...}}, got {target!r}")
    return ArchitectureMap(tuple(entries), text_path)


# -- finding the checkpoint -------------------------------------------------------------------------


def models_root(explicit: str | Path | None = None) -> Path | None:
    """The models root: ``explicit`` (``--models-root``), else ``$LLM_MODELS_ROOT``, else None."""
    if explicit is not None:
        return Path(explicit)
    value = os.environ.get("LLM_MODELS_ROOT")
    return Path(value) if value else None


def models_root_problem(option: str | None) -> str | None:
    """Why the models root a command would use cannot be: ``--models-root`` that is not a folder,
    or ``$LLM_MODELS_ROOT`` naming something that is not a folder (a root that does not exist
    there is only a place not to look: a shared CI setting may name a mount this machine lacks).
    None when it can be used."""
    hint = "name the folder that holds the checkpoint folders"
    if option is not None:
        if os.path.isdir(option):
            return None
        state = "not a folder" if os.path.exists(option) else "no such folder"
        return f"--models-root {option or repr(option)}: {state}; {hint}"
    value = os.environ.get("LLM_MODELS_ROOT")
    if value and os.path.exists(value) and not os.path.isdir(value):
        return f"$LLM_MODELS_ROOT={value}: not a folder; {hint}, or unset it"
    return None


def model_reference(document: Mapping[str, Any], section_keys: tuple[Any, ...]) -> ModelReference | None:
    """The model a server names: the section's own ``model``, the top-level ``model``, or the
    perf-sanity ``metadata.model_dir_name`` / ``metadata.model_name``."""
    section: Any = document
    for key in section_keys:
        section = section.get(key) if isinstance(section, Mapping) else None
    if section_keys and isinstance(section, Mapping) and isinstance(section.get("model"), str) and section["model"]:
        return ModelReference(section["model"], (*section_keys, "model"))
    if isinstance(document.get("model"), str) and document["model"]:
        return ModelReference(document["model"], ("model",))
    metadata = document.get("metadata")
    if isinstance(metadata, Mapping):
        # Upstream's perf-sanity harness joins $LLM_MODELS_ROOT with its own path table's entry for
        # model_name (falling back to model_name itself); model_dir_name is the folder its cluster
        # scripts use. Without that table, both are tried: the folder first, then the name.
        names = [(key, metadata[key]) for key in ("model_dir_name", "model_name") if isinstance(metadata.get(key), str) and metadata[key]]
        if names:
            (key, text), rest = names[0], names[1:]
            return ModelReference(text, ("metadata", key), tuple(t for _, t in rest if t != text))
    return None


def _hub_cache() -> Path:
    """The hub cache folder as huggingface_hub finds it (``huggingface_hub.constants``): HF_HUB_CACHE,
    else the legacy HUGGINGFACE_HUB_CACHE, else ``$HF_HOME/hub``, HF_HOME defaulting to
    ``$XDG_CACHE_HOME/huggingface`` and that to ``~/.cache/huggingface``; ``~`` and ``$VARS``
    expanded. A variable set to "" counts as set, as it does there."""
    env = os.environ

    def expanded(path: str) -> str:
        return os.path.expandvars(os.path.expanduser(path))

    home = expanded(env.get("HF_HOME", os.path.join(env.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")), "huggingface")))
    return Path(expanded(env.get("HF_HUB_CACHE", env.get("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub")))))


def _hub_snapshot(repo_id: str) -> Path | None:
    """The snapshot folder ``refs/main`` names for a hub id in the local cache, if any."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        return None
    from ..errors import PolicyError
    from ..read.policyfile import read_capped

    folder = _hub_cache() / f"models--{parts[0]}--{parts[1]}"
    ref = folder / "refs" / "main"
    try:  # read as every file is: a regular file (a FIFO must not block), size-capped
        revision = read_capped(ref, str(ref), _MAX_HUB_REF_BYTES, "hub refs").decode("utf-8", errors="replace").strip()
    except (PolicyError, ValueError):  # ValueError: a NUL in the name, which no file can have
        return None
    if not revision or "/" in revision or revision in (".", ".."):
        return None
    return folder / "snapshots" / revision


def candidate_folders(reference: str, *, config_dir: Path | None, root: Path | None, cwd: Path | None = None) -> list[Path]:
    """Where a model reference may be, in the order TensorRT-LLM's configs and tests mean it."""
    text = reference
    rooted = False
    for prefix in _ROOT_PREFIXES:
        if text.startswith(prefix):
            text, rooted = text[len(prefix) :], True
            break
    path = Path(text).expanduser()
    if path.is_absolute():
        return [path]
    found: list[Path] = []
    if root is not None:
        found.append(root / path)
    if not rooted:
        if config_dir is not None:
            found.append(config_dir / path)
        found.append((cwd or Path.cwd()) / path)
        snapshot = _hub_snapshot(text)
        if snapshot is not None:
            found.append(snapshot)
    unique: list[Path] = []
    for folder in found:
        if folder not in unique:
            unique.append(folder)
    return unique


def read_checkpoint(config: Path) -> tuple[str | None, str | None, bool] | str:
    """(architectures[0], model_type, composite) of a checkpoint's config.json, or why it cannot be
    used (with its location). Read as every config is: regular file, size-capped, bounded."""
    from .configfile import ConfigFileError, read_config

    try:
        data, _ = read_config(config, limit=_MAX_MODEL_CONFIG_BYTES)
    except ConfigFileError as exc:
        return f"cannot read the checkpoint config: {exc}"
    if not isinstance(data, Mapping):
        return f"{config}: expected a JSON object with `architectures`"
    architectures = data.get("architectures")
    model_type = data.get("model_type")
    model_type = model_type if isinstance(model_type, str) and model_type else None
    from ..evaluate.index import is_multimodal

    composite = is_multimodal(data.get)
    if architectures is None and model_type is not None:
        return None, model_type, composite
    if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str) or not architectures[0]:
        return f"{config}: `architectures` must be a non-empty list of names, got {architectures!r}"
    return architectures[0], model_type, composite


def find_model(
    reference: ModelReference | None,
    *,
    config_dir: Path | None,
    root: Path | None,
    architecture_map: ArchitectureMap | None = None,
    cwd: Path | None = None,
) -> ModelIdentity:
    """The identity of the model ``reference`` names (see the module's docstring for the order)."""
    if reference is None:
        return ModelIdentity()
    folders: list[Path] = []
    for text in reference.texts:
        folders += [f for f in candidate_folders(text, config_dir=config_dir, root=root, cwd=cwd) if f not in folders]
    tried: list[str] = []
    for folder in folders:
        config = folder if folder.name == "config.json" else folder / "config.json"
        tried.append(str(folder))
        if not config.is_file():
            continue
        read = read_checkpoint(config)
        if isinstance(read, str):
            return ModelIdentity(reference=reference, tried=tuple(tried), problem=read)
        architecture, model_type, composite = read
        if architecture is None:
            return ModelIdentity(
                None,
                model_type,
                "config.json",
                str(config),
                reference,
                tuple(tried),
                f"{config} names no `architectures`, only model_type {model_type!r}",
                composite,
            )
        return ModelIdentity(architecture, model_type, "config.json", str(config), reference, tuple(tried), None, composite)
    if architecture_map is not None:
        for text in reference.texts:
            mapped = architecture_map.lookup(text)
            if mapped is not None:
                architecture, model_type, pattern = mapped
                return ModelIdentity(architecture, model_type, "arch-map", f"{architecture_map.path} ({pattern})", reference, tuple(tried))
    return ModelIdentity(reference=reference, tried=tuple(tried))
