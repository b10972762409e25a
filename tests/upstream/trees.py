"""Upstream-shaped TensorRT-LLM source trees, written into a test's tmp_path from small dicts.

Everything here is kvpolicy's own code in the *layout and idioms* ``kvpolicy upstream`` reads
(``@register_auto_model`` classes with ``get_preferred_*`` hooks, ``get_model_defaults``, relative
imports, delegation, ``super()``, ``_arch_index.py``, the config models of ``llm_args.py``, the
resolvers of ``llm_utils.py``, the checkpoint loader, the transceiver's start-up gate). None of it
is NVIDIA's code, and nothing here is ever imported: the extractor parses it with :mod:`ast`.

:func:`tree_matching` writes a tree that states exactly one policy version's facts.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

MODELS = "tensorrt_llm/_torch/models"
UTILS_MODULE = f"{MODELS}/modeling_utils.py"
INDEX = f"{MODELS}/_arch_index.py"
ARGS = "tensorrt_llm/llmapi/llm_args.py"
LLM_UTILS = "tensorrt_llm/llmapi/llm_utils.py"
CONFIG_UTILS = "tensorrt_llm/_torch/pyexecutor/config_utils.py"
MODEL_LOADER = "tensorrt_llm/_torch/pyexecutor/model_loader.py"
TRANSCEIVER = "tensorrt_llm/_torch/disaggregation/kv_cache_transceiver.py"
VERSION = "tensorrt_llm/version.py"

RUNTIME_HOOK = "get_preferred_transceiver_runtime"
KV_HOOK = "get_preferred_kv_cache_manager_version"
DEFAULTS_HOOK = "get_model_defaults"

#: The TRTLLM_USE_* names DEFAULT resolves through (they live in llm_args.py's module constant).
BACKEND_ENV = ("TRTLLM_USE_NIXL_KVCACHE", "TRTLLM_USE_UCX_KVCACHE", "TRTLLM_USE_MOONCAKE_KVCACHE", "TRTLLM_USE_MPI_KVCACHE")
#: The in-flight-cancel gate's names (they live in the transceiver's validator).
GATE_ENV = (
    "TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL",
    "TRTLLM_NIXL_KVCACHE_BACKEND",
    "TRTLLM_DISAGG_LAYERWISE",
    "TRTLLM_DISABLE_KV_CACHE_TRANSFER_OVERLAP",
    "TRTLLM_TRY_ZCOPY_FOR_KVCACHE_TRANSFER",
)

DEFAULT_FIELDS = (
    "backend",
    "transceiver_runtime",
    "kv_transfer_timeout_ms",
    "kv_transfer_sender_future_timeout_ms",
    "kv_transfer_poll_interval_ms",
    "max_tokens_in_buffer",
    "kv_cache_bounce_size_mb",
)
DEFAULT_CHECKPOINTS = {"kimi_k3": "KimiLinearForCausalLM"}


@dataclass(frozen=True)
class Code:
    """A hook body written as code (one or more lines), not as a literal to return."""

    text: str


_UNSET = object()


def _dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def write(root: Path, files: Mapping[str, str]) -> Path:
    """Write ``files`` (path relative to ``root`` -> source, dedented) under ``root``; returns ``root``."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_dedent(text), encoding="utf-8")
    return root


def line(root: Path, rel: str, needle: str, nth: int = 1) -> int:
    """The 1-based line of the ``nth`` line of ``root/rel`` that contains ``needle``."""
    seen = 0
    for number, text in enumerate((root / rel).read_text(encoding="utf-8").splitlines(), 1):
        if needle in text:
            seen += 1
            if seen == nth:
                return number
    raise AssertionError(f"{needle!r} not found {nth} time(s) in {rel}")


# -- pieces --


def modeling_utils() -> str:
    """The registry decorator and the base class whose hooks state no preference."""
    return _dedent(
        '''
        """The model registry and the causal-LM base (kvpolicy test fixture)."""
        from typing import Generic, TypeVar

        from torch import nn

        TConfig = TypeVar("TConfig")
        MODEL_CLASS_MAPPING = {}


        def register_auto_model(name):
            def decorator(cls):
                MODEL_CLASS_MAPPING[name] = cls
                return cls

            return decorator


        class DecoderModelForCausalLM(nn.Module, Generic[TConfig]):
            @classmethod
            def get_preferred_transceiver_runtime(cls, pretrained_config=None):
                return None

            @classmethod
            def get_preferred_kv_cache_manager_version(cls, pretrained_config=None):
                return None

            @classmethod
            def get_model_defaults(cls, llm_args):
                return {}
        '''
    )


def _py(value: object) -> str:
    """A literal as upstream writes it (double-quoted strings)."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _hook_source(name: str, spec: object, arg: str = "pretrained_config=None") -> str:
    if isinstance(spec, Code):
        body = textwrap.indent(_dedent(spec.text).rstrip("\n") + "\n", " " * 8)
    else:
        body = f"        return {_py(spec)}\n"
    return f"    @classmethod\n    def {name}(cls, {arg}):\n{body}"


def model_class(
    name: str,
    archs: Iterable[str] = (),
    *,
    bases: Iterable[str] = ("DecoderModelForCausalLM",),
    runtime: object = _UNSET,
    kv: object = _UNSET,
    defaults: object = _UNSET,
    register: str = "register_auto_model",
) -> str:
    """One model class: a ``@register_auto_model`` line per architecture, then the hooks given.

    A hook's value is returned as a literal (``"PYTHON"``, ``None``); a :class:`Code` is its body.
    ``defaults`` is ``get_model_defaults``' body: True/False give the usual nested dict."""
    out = [f'@{register}("{arch}")\n' for arch in archs]
    out.append(f"class {name}({', '.join(bases)}):\n")
    hooks = []
    if runtime is not _UNSET:
        hooks.append(_hook_source(RUNTIME_HOOK, runtime))
    if kv is not _UNSET:
        hooks.append(_hook_source(KV_HOOK, kv))
    if defaults is not _UNSET:
        spec = defaults if isinstance(defaults, Code) else Code(f'return {{"kv_cache_config": {{"use_kv_cache_manager_v2": {_py(defaults)}}}}}')
        hooks.append(_hook_source(DEFAULTS_HOOK, spec, "llm_args"))
    out.append("\n".join(hooks) if hooks else "    pass\n")
    return "".join(out)


def module(imports: str, *classes: str) -> str:
    """A module: its import lines, then the classes, two blank lines apart."""
    return _dedent(imports).rstrip("\n") + "\n\n\n" + "\n\n".join(c.rstrip("\n") + "\n" for c in classes)


def arch_index(entries: Mapping[str, str]) -> str:
    """``_arch_index.py``: architecture -> module (short name, as upstream's static index writes it)."""
    body = "".join(f'    "{arch}": "{mod}",\n' for arch, mod in entries.items())
    return f'"""Architecture -> module, read without importing the models."""\n\nMODEL_ARCH_TO_MODULE = {{\n{body}}}\n'


def llm_args(
    fields: Iterable[str] = DEFAULT_FIELDS,
    *,
    backend_literals: Iterable[str] = ("DEFAULT", "UCX", "NIXL", "MOONCAKE", "MPI"),
    runtime_literals: Iterable[str] = ("CPP", "PYTHON", "auto"),
    runtime_default: object = "auto",
    kv_default: object = "auto",
    env: Iterable[str] = BACKEND_ENV,
) -> str:
    """``llm_args.py``: CacheTransceiverConfig (the given fields) and KvCacheConfig."""
    env = list(env)
    lines = []
    for field_name in fields:
        if field_name == "backend":
            literals = ", ".join(f'"{v}"' for v in backend_literals)
            lines.append(f'    backend: Optional[Literal[{literals}]] = Field(\n        default=None, description="The transfer backend.")\n')
        elif field_name == "transceiver_runtime":
            literals = ", ".join(f'"{v}"' for v in runtime_literals)
            lines.append(f"    transceiver_runtime: Optional[Literal[{literals}]] = Field(default={_py(runtime_default)})\n")
        elif field_name.startswith(("enable_", "agent_bounce_buffer")):
            lines.append(f"    {field_name}: bool = Field(default=False)\n")
        elif field_name == "agent_bounce_params":
            lines.append(f"    {field_name}: Optional[Dict[str, int]] = Field(default=None)\n")
        else:
            lines.append(f"    {field_name}: Optional[int] = Field(default=None)\n")
    names = ", ".join(f'"{n}"' for n in env)
    return (
        '"""LLM arguments (kvpolicy test fixture)."""\n'
        "from typing import ClassVar, Dict, Literal, Optional\n\n"
        "from pydantic import BaseModel, Field\n\n\n"
        "class StrictBaseModel(BaseModel):\n"
        '    model_config = {"extra": "forbid"}\n\n\n'
        f"_CACHE_TRANSCEIVER_BACKEND_ENV_VARS = ({names}{',' if len(env) == 1 else ''})\n\n\n"
        "class CacheTransceiverConfig(StrictBaseModel):\n"
        '    """How KV-cache blocks move between servers."""\n\n'
        '    _env_order: ClassVar[tuple] = ("NIXL", "UCX")\n' + "".join(lines) + "\n\nclass KvCacheConfig(StrictBaseModel):\n"
        f'    use_kv_cache_manager_v2: bool | Literal["auto"] = Field(default={_py(kv_default)})\n'
        "    tokens_per_block: int = 32\n"
    )


def llm_utils(extra: str = "") -> str:
    """``llm_utils.py``: the auto resolvers the policy models (their bodies are kvpolicy's own)."""
    return _dedent(
        '''
        """Load-time resolution (kvpolicy test fixture)."""


        def _transceiver_python_fallback_reason(backend, timeout_ms):
            if backend != "NIXL":
                return "backend"
            if timeout_ms is None:
                return "timeout"
            return None


        def _resolve_transceiver_runtime_auto(model_cls, config, backend, timeout_ms):
            preferred = model_cls.get_preferred_transceiver_runtime(config)
            if preferred is not None:
                return preferred
            if _transceiver_python_fallback_reason(backend, timeout_ms) is None:
                return "PYTHON"
            return None


        def _resolve_kv_cache_manager_v2_auto(model_cls, config, runtime, backend):
            if model_cls.get_preferred_kv_cache_manager_version(config) == "V2":
                return runtime == "PYTHON" and backend == "NIXL"
            return False


        def apply_model_defaults_to_llm_args(model_cls, llm_args):
            for section, values in model_cls.get_model_defaults(llm_args).items():
                for key, value in values.items():
                    setattr(getattr(llm_args, section), key, value)
        '''
    ) + _dedent(extra)


def config_utils(checkpoints: Mapping[str, str] = DEFAULT_CHECKPOINTS) -> str:
    """``config_utils.py``: load_pretrained_config rewriting ``architectures`` per model_type."""
    branches = "".join(
        f'    {"if" if i == 0 else "elif"} model_type == "{mt}":\n        config.architectures = ["{arch}"]\n'
        for i, (mt, arch) in enumerate(checkpoints.items())
    )
    return (
        '"""Checkpoint loading (kvpolicy test fixture)."""\n\n\n'
        "def load_pretrained_config(path, config):\n"
        '    model_type = getattr(config, "model_type", None)\n' + (branches or "    pass\n") + "    return config\n\n\n"
        "def resolve_cache_transceiver_config(cache_config, pipelined):\n"
        "    if pipelined and cache_config.transceiver_runtime is None:\n"
        '        cache_config.transceiver_runtime = "PYTHON"\n'
        "    return cache_config\n"
    )


def transceiver(env: Iterable[str] = GATE_ENV) -> str:
    """The transceiver's factory and its start-up validator reading the gate's environment names."""
    reads = "".join(f'    values.append(os.environ.get("{name}", ""))\n' for name in env)
    return (
        '"""The KV-cache transceiver factory (kvpolicy test fixture)."""\n'
        "import os\n\n\n"
        "def _validate_inflight_cancel(config):\n"
        "    values = []\n" + reads + "    return values\n\n\n"
        "def create_kv_cache_transceiver(mapping, config):\n"
        "    _validate_inflight_cancel(config)\n"
        '    if config.transceiver_runtime == "PYTHON" and config.backend != "NIXL":\n'
        '        raise ValueError("PYTHON needs NIXL")\n'
        "    return (mapping, config)\n"
    )


def base_files(
    *,
    fields: Iterable[str] = DEFAULT_FIELDS,
    runtime_default: object = "auto",
    kv_default: object = "auto",
    env: Iterable[str] = BACKEND_ENV + GATE_ENV,
    checkpoints: Mapping[str, str] = DEFAULT_CHECKPOINTS,
    backend_literals: Iterable[str] = ("DEFAULT", "UCX", "NIXL", "MOONCAKE", "MPI"),
    runtime_literals: Iterable[str] = ("CPP", "PYTHON", "auto"),
) -> dict[str, str]:
    """Every file of a tree except the modeling files: the registry, the config models, the resolvers,
    the checkpoint loader and the transceiver, with the env names split as upstream splits them."""
    env = list(env)
    backend_env = [n for n in env if n.startswith("TRTLLM_USE_")]
    gate_env = [n for n in env if n not in backend_env]
    return {
        "tensorrt_llm/__init__.py": '"""TensorRT-LLM (kvpolicy test fixture)."""\n',
        f"{MODELS}/__init__.py": "",
        UTILS_MODULE: modeling_utils(),
        ARGS: llm_args(
            fields,
            backend_literals=backend_literals,
            runtime_literals=runtime_literals,
            runtime_default=runtime_default,
            kv_default=kv_default,
            env=backend_env,
        ),
        LLM_UTILS: llm_utils(),
        CONFIG_UTILS: config_utils(checkpoints),
        TRANSCEIVER: transceiver(gate_env),
    }


def simple_tree(root: Path, models: Mapping[str, str] | None = None, **base: object) -> Path:
    """:func:`base_files` plus ``models`` (file name under the models folder -> source)."""
    files = base_files(**base)  # type: ignore[arg-type]
    for name, text in (models or {}).items():
        files[f"{MODELS}/{name}"] = text
    return write(root, files)


# -- a tree stating one policy version --


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out).replace("__", "_")


def version_facts(policy: object) -> dict[str, tuple[str | None, str | None]]:
    """architecture -> (runtime row, kv row) of a version's plain (model_type-free) rows."""
    out: dict[str, list[str | None]] = {}
    for index, decision in enumerate(("transceiver_runtime", "kv_cache_manager")):
        spec = policy.decisions.get(decision)
        for row in spec.preference.rows if spec is not None and spec.preference else ():
            if row.model_type is not None:
                raise ValueError(f"{row.architecture}: a model_type row cannot be stated by a non-branching hook")
            out.setdefault(row.architecture, [None, None])[index] = row.value
    return {arch: (values[0], values[1]) for arch, values in sorted(out.items())}


_IDIOMS = ("grouped", "defaults", "subclass", "delegation", "super")


def tree_matching(
    policy: object,
    root: Path,
    *,
    edit: Mapping[str, tuple[str | None, str | None] | None] | None = None,
    extra: Mapping[str, str] | None = None,
    **overrides: object,
) -> Path:
    """A tree stating exactly ``policy``'s facts: one registered class (or decorator) per row's
    architecture, the CacheTransceiverConfig fields the version accepts, the field defaults its
    ``omitted`` says, the env names it models and its checkpoint rules' targets.

    The architectures are spread over five idioms so every path of the extractor is used:
    ``grouped`` (one class, several ``@register_auto_model``), ``defaults`` (the KV manager through
    ``get_model_defaults`` and the runtime through an Enum member), ``subclass`` (the hooks on a
    base class in another module, reached by a relative import from a subpackage), ``delegation``
    (``return Target.hook(pretrained_config)`` to an unregistered class of another module) and
    ``super`` (an override that continues with ``super().hook(...)``).

    To state something else, ``edit`` sets an architecture's (runtime, kv) hooks (None: not
    registered at all), ``overrides`` replace :func:`base_files` arguments (``fields``, ``env``,
    ``checkpoints``, ``runtime_default``, ...; see :func:`matching_base`) and ``extra`` adds or
    replaces files (path relative to the tree -> source)."""
    facts = version_facts(policy)
    for arch, hooks in (edit or {}).items():
        if hooks is None:
            facts.pop(arch, None)
        else:
            facts[arch] = hooks
    facts = dict(sorted(facts.items()))
    files = base_files(**{**matching_base(policy), **overrides})  # type: ignore[arg-type]
    grouped: dict[tuple[str | None, str | None], list[str]] = {}
    bases: dict[str, str] = {}  # signature class name -> source, in modeling_kvp_bases.py
    targets: dict[str, str] = {}  # delegation targets, in modeling_kvp_targets.py
    subclasses: list[str] = []  # in models/family/modeling_family.py
    subclass_bases: set[str] = set()
    others: dict[str, str] = {}  # file -> source
    index: dict[str, str] = {}
    for number, (arch, (runtime, kv)) in enumerate(facts.items()):
        idiom = _IDIOMS[number % len(_IDIOMS)]
        if idiom == "defaults" and kv is None:
            idiom = "grouped"
        cls = f"Kvp{arch}"
        if idiom == "grouped":
            grouped.setdefault((runtime, kv), []).append(arch)
        elif idiom == "defaults":
            runtime_spec = _UNSET if runtime is None else Code(f"return TransceiverRuntime.{runtime}")
            text = model_class(cls, [arch], runtime=runtime_spec, defaults=kv == "V2")
            others[f"modeling_{_snake(arch)}.py"] = module(
                "from enum import Enum\n\nfrom .modeling_utils import DecoderModelForCausalLM, register_auto_model\n\n\n"
                'class TransceiverRuntime(str, Enum):\n    CPP = "CPP"\n    PYTHON = "PYTHON"',
                text,
            )
            index[arch] = f"modeling_{_snake(arch)}"
        elif idiom == "subclass":
            base = _signature_class(runtime, kv)
            bases.setdefault(base, model_class(base, runtime=runtime, kv=kv) if (runtime, kv) != (None, None) else model_class(base))
            subclasses.append(model_class(cls, [arch], bases=(base,)))
            subclass_bases.add(base)
        elif idiom == "delegation":
            target = f"{cls}Text"
            targets[target] = model_class(target, runtime=runtime, kv=kv)
            delegate_rt = Code(f"return {target}.{RUNTIME_HOOK}(pretrained_config)")
            delegate_kv = Code(f"return {target}.{KV_HOOK}(pretrained_config)")
            others[f"modeling_{_snake(arch)}.py"] = module(
                f"from .modeling_kvp_targets import {target}\nfrom .modeling_utils import DecoderModelForCausalLM, register_auto_model",
                model_class(cls, [arch], runtime=delegate_rt, kv=delegate_kv),
            )
        else:  # super
            base = _signature_class(runtime, kv)
            bases.setdefault(base, model_class(base, runtime=runtime, kv=kv))
            others[f"modeling_{_snake(arch)}.py"] = module(
                "from . import modeling_kvp_bases\nfrom .modeling_utils import register_auto_model",
                model_class(
                    cls,
                    [arch],
                    bases=(f"modeling_kvp_bases.{base}",),
                    runtime=Code(f"return super().{RUNTIME_HOOK}(pretrained_config)"),
                    kv=Code(f"return super().{KV_HOOK}(pretrained_config)"),
                ),
            )
    grouped_classes = [
        model_class(f"KvpGroup{n}", archs, runtime=_UNSET if rt is None else rt, kv=_UNSET if kv is None else kv)
        for n, ((rt, kv), archs) in enumerate(sorted(grouped.items(), key=lambda item: item[1]))
    ]
    for archs in grouped.values():
        for arch in archs:
            index[arch] = "modeling_kvp_grouped"
    imports = "from .modeling_utils import DecoderModelForCausalLM, register_auto_model"
    files[f"{MODELS}/modeling_kvp_grouped.py"] = module(imports, *grouped_classes) if grouped_classes else "\n"
    files[f"{MODELS}/modeling_kvp_bases.py"] = module("from .modeling_utils import DecoderModelForCausalLM", *bases.values()) if bases else "\n"
    files[f"{MODELS}/modeling_kvp_targets.py"] = module("from .modeling_utils import DecoderModelForCausalLM", *targets.values()) if targets else "\n"
    files[f"{MODELS}/family/__init__.py"] = ""
    files[f"{MODELS}/family/modeling_family.py"] = (
        module(f"from ..modeling_kvp_bases import {', '.join(sorted(subclass_bases))}\nfrom ..modeling_utils import register_auto_model", *subclasses)
        if subclasses
        else "\n"
    )
    for name, text in others.items():
        files[f"{MODELS}/{name}"] = text
    files[INDEX] = arch_index(index)
    files.update(extra or {})
    return write(root, files)


def matching_base(policy: object) -> dict[str, object]:
    """:func:`base_files`' arguments stating ``policy``: the CacheTransceiverConfig fields it accepts,
    the field defaults its ``omitted`` says (none: ``"auto"``), the Literal values of its decisions,
    the environment names it models and its checkpoint rules' targets."""
    from kvpolicy.upstream.drift import version_env, version_fields

    return {
        "fields": sorted(version_fields(policy)),
        "runtime_default": _omitted(policy, "transceiver_runtime", {None: "auto"}),
        "kv_default": _omitted(policy, "kv_cache_manager", {None: "auto", "V2": True, "V1": False}),
        "env": sorted(version_env(policy)),
        "checkpoints": {f"ckpt_{i}": rule.architecture for i, rule in enumerate(policy.checkpoint_rules)},
        "backend_literals": list(policy.decisions["backend"].values) + [policy.decisions["backend"].auto],
        "runtime_literals": list(policy.decisions["transceiver_runtime"].values) + [policy.decisions["transceiver_runtime"].auto],
    }


def _signature_class(runtime: str | None, kv: str | None) -> str:
    return f"KvpBase{runtime or 'NoRuntime'}{kv or 'NoKv'}"


def _omitted(policy: object, decision: str, meaning: Mapping[object, object]) -> object:
    spec = policy.decisions[decision]
    value = spec.omitted.value if spec.omitted else None
    return meaning.get(value, value)


# -- git --

GIT_ENV_BASE = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "HOME": os.devnull, "LC_ALL": "C"}


def git(root: Path, *args: str, date: str | None = None) -> str:
    """Run git in ``root`` with a fixed identity and (optionally) a fixed author/committer date."""
    env = {**os.environ, **GIT_ENV_BASE}
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    out = subprocess.run(
        [
            "git",
            "-c",
            "user.name=kvpolicy tests",
            "-c",
            "user.email=tests@kvpolicy.invalid",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout


def commit_all(root: Path, subject: str, date: str) -> None:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", subject, date=date)


# -- policy copies --

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
SHIPPED = "2026.10.22"


def policy_folder(
    folder: Path, version: str = SHIPPED, *, upstream: Mapping[str, object] | None = None, cases: bool = False, edit: Mapping[str, str] | None = None
) -> Path:
    """A policy folder holding a copy of a shipped version (and the schema), with ``edit``'s
    replacements made (old text -> new, each must occur) and an ``[upstream]`` table appended."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "policy.schema.json").write_bytes((POLICIES / "policy.schema.json").read_bytes())
    text = (POLICIES / f"{version}.toml").read_text(encoding="utf-8")
    for old, new in (edit or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    if upstream is not None:
        text = text.rstrip("\n") + "\n\n" + upstream_table(**upstream)  # type: ignore[arg-type]
    (folder / f"{version}.toml").write_text(text, encoding="utf-8")
    if cases:
        name = f"{version}.cases.toml"
        (folder / name).write_bytes((POLICIES / name).read_bytes())
    return folder


def upstream_table(read: str, env: Iterable[str], fingerprints: Mapping[str, str]) -> str:
    """The ``[upstream]`` baseline table, as TOML."""
    import json

    names = "".join(f"  {json.dumps(n)},\n" for n in sorted(env))
    prints = "".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in sorted(fingerprints.items()))
    return f"[upstream]\nread = {json.dumps(read)}\nenv = [\n{names}]\n\n[upstream.fingerprints]\n{prints}"


def baseline_of(facts: object, read: str = "kvpolicy test tree") -> dict[str, object]:
    """The baseline that records exactly what ``facts`` hold (every env name and fingerprint)."""
    return {"read": read, "env": sorted(facts.env), "fingerprints": {n: f.fingerprint for n, f in facts.logic.items()}}


def load_policy(folder: Path, version: str = SHIPPED) -> object:
    import kvpolicy

    return kvpolicy.load(str(folder), version=version).policy


# -- reading a tree --


def facts_of(root: Path) -> object:
    from kvpolicy.upstream.extract import extract
    from kvpolicy.upstream.source import open_tree

    return extract(open_tree(root))


def drift_of(root: Path, policy: object) -> list:
    from kvpolicy.upstream.drift import compare

    return compare(facts_of(root), policy)


def kinds(drift: Iterable[object], *, ignore: Iterable[str] = ("no-baseline",)) -> list[str]:
    """The drift's kinds in order, those in ``ignore`` left out."""
    skip = set(ignore)
    return [d.kind for d in drift if d.kind not in skip]


#: The import line most model files start with.
IMPORTS = "from .modeling_utils import DecoderModelForCausalLM, register_auto_model"


def cli(capsys: object, *argv: object) -> tuple[int, str, str]:
    """Run ``kvpolicy ARGV...`` in this process: (exit code, stdout, stderr)."""
    from kvpolicy.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()  # type: ignore[attr-defined]
    return code, out, err
