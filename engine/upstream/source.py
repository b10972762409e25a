"""A TensorRT-LLM source tree, read without importing it.

``kvpolicy upstream`` reads the handful of upstream files whose facts a policy version models (the
model registry and classes, the LLM-argument config models, the auto resolvers, the checkpoint loader,
the transceiver's start-up checks). Importing ``tensorrt_llm`` needs its native parts and often a GPU,
so nothing here imports it: files are read as text and parsed with :mod:`ast`.

Three kinds of tree: a directory holding ``tensorrt_llm/`` (a source tree or an unpacked wheel), a git
checkout of it (``.git`` beside ``tensorrt_llm/``: rows drafted from it get their provenance from git),
and the installed package (found through its distribution metadata, never imported).

Every file is hostile input: only regular ``.py`` files inside the tree are read (no symlink is
followed), each at most :data:`MAX_FILE_BYTES`, at most :data:`MAX_FILES` of them, and a file that
does not parse (or nests deeper than the parser allows) is a problem of its own, never a traceback.
"""

from __future__ import annotations

import ast
import gc
import hashlib
import os
import re
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MAX_FILES", "MAX_FILE_BYTES", "SCOPE", "SourceFile", "TreeError", "UpstreamTree", "installed_tree", "open_tree"]

#: Upstream's largest file in scope (``llm_args.py``) is a few hundred KB.
MAX_FILE_BYTES = 4 << 20

#: Upstream's model folder holds a few hundred files.
MAX_FILES = 4000


#: What is read, relative to the tree's root: folders (every ``.py`` below them) and single files.
SCOPE = (
    "tensorrt_llm/_torch/models",
    "tensorrt_llm/_torch/disaggregation",
    "tensorrt_llm/llmapi/llm_args.py",
    "tensorrt_llm/llmapi/llm_utils.py",
    "tensorrt_llm/_torch/pyexecutor/config_utils.py",
    "tensorrt_llm/_torch/pyexecutor/model_loader.py",
    "tensorrt_llm/version.py",
)

_VERSION = re.compile(r"""^__version__\s*=\s*["']([^"'\n]{1,40})["']""", re.M)


class TreeError(ValueError):
    """The path is not a TensorRT-LLM tree kvpolicy can read; the message says what to pass instead."""


@dataclass
class SourceFile:
    """One upstream file: its path relative to the tree, and its parse (or why there is none)."""

    rel: str
    module: str
    tree: ast.Module | None
    problem: str | None = None
    problem_line: int = 1


@dataclass
class UpstreamTree:
    """The files of one TensorRT-LLM tree that ``kvpolicy upstream`` reads."""

    root: Path
    kind: str  # "checkout", "installed" or "directory"
    files: dict[str, SourceFile] = field(default_factory=dict)
    release: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """Paths not read, with why (a symlink, a file too large)."""
    bytes_read: int = 0

    @property
    def is_git(self) -> bool:
        return self.kind == "checkout"

    def by_module(self) -> dict[str, SourceFile]:
        return {f.module: f for f in self.files.values()}


def _module_name(rel: str) -> str:
    name = rel[: -len(".py")].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def open_tree(path: str | os.PathLike[str]) -> UpstreamTree:
    """Read the tree at ``path``: the folder holding ``tensorrt_llm/``, or that package folder itself."""
    root = Path(path)
    if not root.exists():
        raise TreeError(f"{path}: no such folder; pass the root of a TensorRT-LLM checkout (the folder holding tensorrt_llm/), or --installed")
    if not root.is_dir():
        raise TreeError(f"{path}: not a folder; pass the root of a TensorRT-LLM checkout (the folder holding tensorrt_llm/), or --installed")
    if root.name == "tensorrt_llm" and (root / "__init__.py").is_file() and not (root / "tensorrt_llm").is_dir():
        root = root.parent
    package = root / "tensorrt_llm"
    if not package.is_dir() or package.is_symlink():
        raise TreeError(
            f"{path}: not a TensorRT-LLM tree (no tensorrt_llm/ package folder in it); pass the root of a "
            "checkout of NVIDIA/TensorRT-LLM or of an unpacked wheel, or use --installed"
        )
    kind = "checkout" if (root / ".git").exists() else "directory"
    return _read(root, kind)


def installed_tree() -> UpstreamTree:
    """The installed ``tensorrt_llm``'s files, found through its distribution metadata (never imported)."""
    from importlib import metadata

    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        package = Path(str(dist.locate_file("tensorrt_llm")))
        if not package.is_dir():
            raise TreeError(f"tensorrt_llm {dist.version} is installed but its package folder {package} is missing; reinstall it")
        tree = _read(package.parent, "installed")
        tree.release = tree.release or dist.version
        return tree
    raise TreeError("tensorrt_llm is not installed in this environment; pass a TensorRT-LLM checkout instead of --installed")


def record_hash() -> str | None:
    """The installed ``tensorrt_llm``'s RECORD digest (what a cache of its facts keys on), or None."""
    from importlib import metadata

    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        text = dist.read_text("RECORD") or ""
        return hashlib.sha256(f"{dist.version}\0{text}".encode()).hexdigest()
    return None


def _candidates(root: Path) -> list[Path]:
    found: list[Path] = []
    for entry in SCOPE:
        target = root / entry
        if entry.endswith(".py"):
            found.append(target)
            continue
        if not target.is_dir() or target.is_symlink():
            continue
        for folder, dirs, names in os.walk(target, followlinks=False):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            for name in sorted(names):
                if name.endswith(".py"):
                    found.append(Path(folder) / name)
                    if len(found) > MAX_FILES:
                        raise TreeError(
                            f"{root}: more than {MAX_FILES} Python files under {', '.join(SCOPE[:2])}; "
                            "this is not a TensorRT-LLM tree kvpolicy can read (pass the repository root)"
                        )
    return found


def _read(root: Path, kind: str) -> UpstreamTree:
    # The parses are kept: with the cyclic collector on, each collection walks every syntax tree
    # read so far (a few million objects), which made reading a few hundred files 4x slower.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _read_files(root, kind)
    finally:
        if enabled:
            gc.enable()


def _read_files(root: Path, kind: str) -> UpstreamTree:
    tree = UpstreamTree(root=root, kind=kind)
    for path in _candidates(root):
        rel = path.relative_to(root).as_posix()
        try:
            info = os.lstat(path)
        except OSError:
            continue  # a single file of SCOPE that this tree does not have
        if stat.S_ISLNK(info.st_mode):
            tree.skipped.append((rel, "a symbolic link (never followed)"))
            continue
        if not stat.S_ISREG(info.st_mode):
            tree.skipped.append((rel, "not a regular file"))
            continue
        if info.st_size > MAX_FILE_BYTES:
            tree.skipped.append((rel, f"{info.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit"))
            continue
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
        tree.bytes_read += len(raw)
        tree.files[rel] = _parse(rel, raw)
        if rel == "tensorrt_llm/version.py":
            match = _VERSION.search(raw.decode("utf-8", "replace"))
            tree.release = match.group(1) if match else None
    if not any(rel.startswith("tensorrt_llm/_torch/models/") for rel in tree.files):
        raise TreeError(
            f"{root}: tensorrt_llm/_torch/models/ holds no Python files; this tree has no PyTorch model classes "
            "to read (pass a TensorRT-LLM checkout from 2026-07 or later)"
        )
    return tree


def _parse(rel: str, raw: bytes) -> SourceFile:
    module = _module_name(rel)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return SourceFile(rel, module, None, f"not UTF-8 text (byte {exc.start})")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in upstream's strings are not ours to report
            parsed = ast.parse(text, filename=rel)
    except SyntaxError as exc:
        return SourceFile(rel, module, None, f"does not parse: {exc.msg}", exc.lineno or 1)
    except (RecursionError, MemoryError, ValueError):
        return SourceFile(rel, module, None, "nests deeper than Python's parser allows")
    return SourceFile(rel, module, parsed)
