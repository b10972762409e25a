"""The facts a policy version models, read from TensorRT-LLM's own source with :mod:`ast`.

What is read (each fact with its file and line):

- **registered architectures** and the class behind each: ``@register_auto_model("Arch")`` on a class,
  and the static index ``_arch_index.py`` (``MODEL_ARCH_TO_MODULE``: an architecture the index names
  is looked up among that module's decorated classes);
- **each class's hooks**: ``get_preferred_transceiver_runtime`` and ``get_preferred_kv_cache_manager_version``
  (a string literal or ``None`` returned, a module constant, an ``Enum.MEMBER``), ``get_model_defaults``'
  ``use_kv_cache_manager_v2``. Inheritance follows Python's method order over the classes of the tree,
  across modules through their imports; ``super().hook()`` continues along it; ``Other.hook()``
  delegates to another class. Where static analysis stops (a hook that branches, a computed return, a
  base class in a module not read) the value is *unknown*, with why and the function's fingerprint, so
  a policy version can record that a person read it;
- **config fields**: ``CacheTransceiverConfig`` and ``KvCacheConfig``'s annotated fields, their
  ``Literal[...]`` values and defaults;
- **environment variables**: every ``TRTLLM_*`` string the decision area's files name;
- **checkpoint rewrites**: the architectures ``config_utils.py`` writes into a checkpoint's
  ``architectures``;
- **logic fingerprints** (:mod:`.fingerprint`) of the functions that are the rules themselves
  (:data:`LOGIC`, and every validator of the transceiver's start-up path).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass, field

from .fingerprint import fingerprint
from .source import UpstreamTree

__all__ = ["ArchFact", "Facts", "FieldFact", "HOOKS", "Hook", "LOGIC", "LogicFact", "extract"]

#: The hooks a model class carries, by the decision they feed.
HOOKS = {
    "transceiver_runtime": "get_preferred_transceiver_runtime",
    "kv_cache_manager": "get_preferred_kv_cache_manager_version",
}
_DEFAULTS = "get_model_defaults"
_V2_FIELD = "use_kv_cache_manager_v2"

#: The functions whose code is the rule (qualified name -> the file it is expected in). A function that
#: moved to another file is found there (and its new place reported); one no file defines is drift.
LOGIC = {
    "_resolve_transceiver_runtime_auto": "tensorrt_llm/llmapi/llm_utils.py",
    "_transceiver_python_fallback_reason": "tensorrt_llm/llmapi/llm_utils.py",
    "_resolve_kv_cache_manager_v2_auto": "tensorrt_llm/llmapi/llm_utils.py",
    "apply_model_defaults_to_llm_args": "tensorrt_llm/llmapi/llm_utils.py",
    "load_pretrained_config": "tensorrt_llm/_torch/pyexecutor/config_utils.py",
    "resolve_cache_transceiver_config": "tensorrt_llm/_torch/pyexecutor/config_utils.py",
    "load_config_and_apply_defaults": "tensorrt_llm/_torch/pyexecutor/model_loader.py",
    "create_kv_cache_transceiver": "tensorrt_llm/_torch/disaggregation/kv_cache_transceiver.py",
    "AutoModelForCausalLM._resolve_class": "tensorrt_llm/_torch/models/modeling_auto.py",
}

#: Start-up validators in the transceiver's files are logic too, whatever their names are: every
#: module-level function there with a word of its name saying it checks something.
_VALIDATOR = re.compile(r"(^|_)(validate|validator|check|require|requires|reject|gate|ensure|guard)(_|$)")
_VALIDATOR_FILES = ("tensorrt_llm/_torch/disaggregation/",)

#: Files whose ``TRTLLM_*`` strings are the decision area's environment (llm_args.py only within the
#: config classes and the module constants named after them).
_ENV_FILES = (
    "tensorrt_llm/llmapi/llm_utils.py",
    "tensorrt_llm/_torch/pyexecutor/config_utils.py",
    "tensorrt_llm/_torch/pyexecutor/model_loader.py",
    "tensorrt_llm/_torch/disaggregation/",
)
_ENV = re.compile(r"^TRTLLM_[A-Z0-9_]{1,80}$")
_CONFIG_CLASSES = ("CacheTransceiverConfig", "KvCacheConfig")
_ARGS_FILE = "tensorrt_llm/llmapi/llm_args.py"
_CHECKPOINT_FILE = "tensorrt_llm/_torch/pyexecutor/config_utils.py"
_INDEX_FILE = "tensorrt_llm/_torch/models/_arch_index.py"

#: Bases from outside TensorRT-LLM never carry its hooks.
_OUTSIDE = ("torch", "transformers", "typing", "abc", "enum", "dataclasses", "pydantic", "collections", "functools")

#: How far delegation and inheritance are followed before a chain counts as a cycle.
_MAX_DEPTH = 64


@dataclass(frozen=True)
class Where:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Hook:
    """What one hook gives for one class: a value, no preference (``None``), or unknown."""

    value: str | None
    known: bool = True
    why: str = ""
    where: Where | None = None
    """The line that decides it (the ``return``), or where static analysis stopped."""
    chain: tuple[Where, ...] = ()
    """Every line on the way (class, base, delegation, return): where provenance is looked up."""
    logic: str | None = None
    """For an unknown value: the function a person must read (a key of :attr:`Facts.logic`)."""


@dataclass(frozen=True)
class ArchFact:
    architecture: str
    cls: str | None  # "module.Class", None when the index names a module without the class
    where: Where
    hooks: dict[str, Hook]
    unread: bool = False
    """The module providing it was not in the tree (one ``unread`` problem names them all)."""


@dataclass(frozen=True)
class FieldFact:
    owner: str
    name: str
    literals: tuple[str, ...] | None
    default: str
    where: Where


@dataclass(frozen=True)
class LogicFact:
    name: str
    fingerprint: str
    where: Where


@dataclass
class Facts:
    """Everything read from one tree."""

    release: str | None
    architectures: dict[str, ArchFact] = field(default_factory=dict)
    fields: dict[str, dict[str, FieldFact]] = field(default_factory=dict)
    env: dict[str, Where] = field(default_factory=dict)
    checkpoint_targets: dict[str, Where] = field(default_factory=dict)
    logic: dict[str, LogicFact] = field(default_factory=dict)
    problems: list[tuple[Where, str]] = field(default_factory=list)
    files_read: int = 0


# -- the class graph --


@dataclass
class _Class:
    module: str
    name: str
    file: str
    node: ast.ClassDef

    @property
    def key(self) -> str:
        return f"{self.module}.{self.name}"

    def member(self, name: str) -> ast.stmt | None:
        for stmt in self.node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                return stmt
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                return stmt
        return None


@dataclass(frozen=True)
class _Outside:
    """A base not read: from outside TensorRT-LLM (no hooks), or a TensorRT-LLM module not in the tree."""

    name: str
    trtllm: bool


class _Graph:
    def __init__(self, tree: UpstreamTree) -> None:
        self.modules = {f.module: f for f in tree.files.values() if f.tree is not None}
        self.classes: dict[str, dict[str, _Class]] = {}
        self.imports: dict[str, dict[str, tuple[str, str | None]]] = {}
        self.constants: dict[str, dict[str, str]] = {}
        for module, source in self.modules.items():
            assert source.tree is not None  # (only parsed files are modules)
            self._index(module, source.rel, source.tree)
        self._mro: dict[str, list[_Class | _Outside] | None] = {}

    def _index(self, module: str, rel: str, tree: ast.Module) -> None:
        classes: dict[str, _Class] = {}
        imports: dict[str, tuple[str, str | None]] = {}
        constants: dict[str, str] = {}
        package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef):
                classes[stmt.name] = _Class(module, stmt.name, rel, stmt)
            elif isinstance(stmt, ast.ImportFrom):
                base = _absolute(package, stmt.module, stmt.level)
                for alias in stmt.names:
                    imports[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    imports[alias.asname or alias.name.partition(".")[0]] = (alias.name if alias.asname else alias.name.partition(".")[0], None)
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        constants[target.id] = stmt.value.value
        self.classes[module] = classes
        self.imports[module] = imports
        self.constants[module] = constants

    def resolve(self, module: str, expr: ast.expr, depth: int = 0) -> _Class | _Outside:
        """The class an expression names in ``module`` (a name, ``alias.Name``, ``Base[...]``)."""
        while isinstance(expr, ast.Subscript):
            expr = expr.value
        if isinstance(expr, ast.Name):
            return self.lookup(module, expr.id, depth)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            target = self.imports.get(module, {}).get(expr.value.id)
            if target is not None:
                mod = target[0] if target[1] is None else f"{target[0]}.{target[1]}"
                return self.lookup(mod, expr.attr, depth + 1)
        return _Outside(_dotted(expr) or type(expr).__name__, trtllm=False)

    def lookup(self, module: str, name: str, depth: int = 0) -> _Class | _Outside:
        if depth > _MAX_DEPTH:
            return _Outside(name, trtllm=True)
        found = self.classes.get(module, {}).get(name)
        if found is not None:
            return found
        target = self.imports.get(module, {}).get(name)
        if target is not None:
            origin, original = target
            if original is None:
                return _Outside(name, trtllm=origin.startswith("tensorrt_llm"))
            if f"{origin}.{original}" in self.modules:  # `from . import modeling_x` names a module, not a class
                return _Outside(name, trtllm=False)
            if origin in self.modules:
                return self.lookup(origin, original, depth + 1)
            return _Outside(f"{origin}.{original}", trtllm=origin.startswith("tensorrt_llm"))
        if module not in self.modules:
            return _Outside(f"{module}.{name}", trtllm=module.startswith("tensorrt_llm"))
        builtin = name in {"object", "Exception", "dict", "list", "type", "str", "int"}
        return _Outside(name, trtllm=not builtin and not name[:1].islower() and not _is_outside_name(name))

    def mro(self, cls: _Class, depth: int = 0) -> list[_Class | _Outside] | None:
        """C3 linearisation over the tree's classes; None for an inconsistent or cyclic hierarchy."""
        if cls.key in self._mro:
            return self._mro[cls.key]
        self._mro[cls.key] = None  # a cycle reads as inconsistent
        if depth > _MAX_DEPTH:
            return None
        bases = [self.resolve(cls.module, b) for b in cls.node.bases if not _is_meta(b)]
        lines: list[list[_Class | _Outside]] = []
        for base in bases:
            if isinstance(base, _Outside):
                lines.append([base])
                continue
            sub = self.mro(base, depth + 1)
            if sub is None:
                return None
            lines.append(list(sub))
        lines.append(list(bases))
        result: list[_Class | _Outside] = [cls]
        while any(lines):
            for line in lines:
                if not line:
                    continue
                head = line[0]
                if not any(head in other[1:] for other in lines):
                    break
            else:
                return None
            result.append(head)
            lines = [line[1:] if line and line[0] == head else line for line in lines]
        self._mro[cls.key] = result
        return result


def _dotted(expr: ast.expr) -> str:
    """``a.b.c`` for a name or attribute chain (walked without recursion), else ``""``."""
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return ""
    parts.append(expr.id)
    return ".".join(reversed(parts))


def _is_meta(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Name) and expr.id in {"Generic", "Protocol", "ABC", "object"}


def _is_outside_name(name: str) -> bool:
    return name in {"Module", "PreTrainedModel", "PretrainedConfig", "BaseModel", "Enum", "StrEnum"}


def _absolute(package: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".")
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{module}" if module else base


# -- hooks --


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        return body[1:]
    return body


class _Hooks:
    def __init__(self, graph: _Graph, logic: dict[str, LogicFact]) -> None:
        self.graph = graph
        self.logic = logic

    def value(self, cls: _Class, hook: str, depth: int = 0) -> Hook:
        mro = self.graph.mro(cls)
        where = Where(cls.file, cls.node.lineno)
        if mro is None:
            return Hook(None, False, f"{cls.name}'s base classes do not linearise (a cycle or an inconsistent order)", where)
        return self._along(mro, hook, (where,), depth)

    def _along(self, mro: list[_Class | _Outside], hook: str, chain: tuple[Where, ...], depth: int) -> Hook:
        if depth > _MAX_DEPTH:
            return Hook(None, False, "delegation deeper than kvpolicy follows (a cycle?)", chain[-1], chain)
        for index, entry in enumerate(mro):
            if isinstance(entry, _Outside):
                if entry.trtllm:
                    return Hook(None, False, f"base {entry.name} is in a module kvpolicy did not read", chain[-1], chain)
                continue
            member = entry.member(hook)
            if member is not None:
                here = chain + (Where(entry.file, entry.node.lineno),) if Where(entry.file, entry.node.lineno) not in chain else chain
                return self._member(entry, member, hook, mro[index + 1 :], here, depth)
        return Hook(None, True, "no hook in the class or its bases", chain[-1], chain)

    def _member(self, owner: _Class, member: ast.stmt, hook: str, rest: list, chain: tuple[Where, ...], depth: int) -> Hook:
        module = owner.module
        where = Where(owner.file, member.lineno)
        if isinstance(member, ast.Assign):  # hook = Other.hook
            return self._delegate(owner, member.value, hook, chain + (where,), depth, member)
        body = _strip_docstring(list(getattr(member, "body", [])))
        if len(body) == 1 and isinstance(body[0], ast.Return):
            ret = body[0]
            chain = chain + (Where(owner.file, ret.lineno),)
            if hook == _DEFAULTS:
                return self._defaults(owner, ret.value, rest, chain, depth, member)
            literal = self._literal(module, ret.value)
            if literal is None or isinstance(literal, str):
                return Hook(literal, True, f"{owner.name}.{hook} returns {literal!r}", chain[-1], chain)
            if isinstance(ret.value, ast.Call):
                func = ret.value.func
                if isinstance(func, ast.Attribute) and _is_super(func.value) and func.attr == hook:
                    return self._along(rest, hook, chain, depth + 1)
                return self._delegate(owner, ret.value, hook, chain, depth, member)
        kind = "branches" if any(isinstance(n, (ast.If, ast.IfExp, ast.Match, ast.BoolOp)) for n in ast.walk(member)) else "computes its value"
        return self._unknown(owner, member, f"{owner.name}.{hook} {kind} (static analysis cannot tell; read it)", chain)

    def _unknown(self, owner: _Class, member: ast.stmt, why: str, chain: tuple[Where, ...]) -> Hook:
        # Keyed by module too: two classes of one name in two modules are two functions to read.
        name = f"{owner.key}.{getattr(member, 'name', '?')}"
        where = Where(owner.file, member.lineno)
        self.logic.setdefault(name, LogicFact(name, fingerprint(member), where))
        return Hook(None, False, why, where, chain + (where,), logic=name)

    def _delegate(self, owner: _Class, expr: ast.expr | None, hook: str, chain: tuple[Where, ...], depth: int, member: ast.stmt) -> Hook:
        func = expr.func if isinstance(expr, ast.Call) else expr
        if isinstance(func, ast.Attribute) and func.attr in (hook, *HOOKS.values(), _DEFAULTS):
            target = self.graph.resolve(owner.module, func.value)
            if isinstance(target, _Class):
                return self.value_of(target, func.attr, chain, depth + 1)
            if target.trtllm:
                where = Where(owner.file, member.lineno)
                return Hook(None, False, f"{owner.name}.{hook} delegates to {target.name}, in a module kvpolicy did not read", where, chain + (where,))
        return self._unknown(owner, member, f"{owner.name}.{hook} computes its value (static analysis cannot tell; read it)", chain)

    def value_of(self, cls: _Class, hook: str, chain: tuple[Where, ...], depth: int) -> Hook:
        mro = self.graph.mro(cls)
        if mro is None:
            return Hook(None, False, f"{cls.name}'s base classes do not linearise", Where(cls.file, cls.node.lineno), chain)
        return self._along(mro, hook, chain + (Where(cls.file, cls.node.lineno),), depth)

    def _literal(self, module: str, expr: ast.expr | None) -> object:
        if expr is None:
            return None
        if isinstance(expr, ast.Constant) and (expr.value is None or isinstance(expr.value, str)):
            return expr.value
        if isinstance(expr, ast.Name) and expr.id in self.graph.constants.get(module, {}):
            return self.graph.constants[module][expr.id]
        if isinstance(expr, ast.Attribute) and expr.attr in ("PYTHON", "CPP", "V1", "V2") and isinstance(expr.value, ast.Name):
            return expr.attr  # an Enum member (TransceiverRuntime.PYTHON)
        return _NOT

    def _defaults(self, owner: _Class, expr: ast.expr | None, rest: list, chain: tuple[Where, ...], depth: int, member: ast.stmt) -> Hook:
        """``get_model_defaults``: what it sets ``use_kv_cache_manager_v2`` to, as V2 / V1 / no setting."""
        if isinstance(expr, ast.Dict):
            found = _find_v2(expr)
            if found is not None:
                value, line = found
                chain = chain + (Where(owner.file, line),)
                if not (value is None or isinstance(value, str)):
                    return self._unknown(owner, member, f"{owner.name}.{_DEFAULTS} computes {_V2_FIELD} (read it)", chain)
                return Hook(value, True, f"{owner.name}.{_DEFAULTS} sets {_V2_FIELD} = {_V2_SHOWN[value]}", chain[-1], chain)
            spreads = [v for k, v in zip(expr.keys, expr.values) if k is None]
            for spread in spreads:  # {**super().get_model_defaults(), ...}
                func = spread.func if isinstance(spread, ast.Call) else None
                if isinstance(func, ast.Attribute) and _is_super(func.value):
                    return self._along(rest, _DEFAULTS, chain, depth + 1)
                if spread is not None:
                    inner = self._delegate(owner, spread, _DEFAULTS, chain, depth, member)
                    if inner.value is not None or not inner.known:
                        return inner
            return Hook(None, True, f"{owner.name}.{_DEFAULTS} does not set {_V2_FIELD}", chain[-1], chain)
        if isinstance(expr, ast.Call):
            func = expr.func
            if isinstance(func, ast.Attribute) and _is_super(func.value) and func.attr == _DEFAULTS:
                return self._along(rest, _DEFAULTS, chain, depth + 1)
            return self._delegate(owner, expr, _DEFAULTS, chain, depth, member)
        if isinstance(expr, ast.Constant) and expr.value is None:
            return Hook(None, True, f"{owner.name}.{_DEFAULTS} returns None", chain[-1], chain)
        return self._unknown(owner, member, f"{owner.name}.{_DEFAULTS} computes its value (read it)", chain)


_NOT = object()
_V2_SHOWN = {"V2": "True", "V1": "False", None: "'auto'"}


def _is_super(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "super"


def _find_v2(node: ast.AST) -> tuple[object, int] | None:
    """``use_kv_cache_manager_v2``'s value anywhere in a defaults literal (dict key or keyword)."""
    for sub in ast.walk(node):
        pairs: list[tuple[ast.expr | None, ast.expr]] = []
        if isinstance(sub, ast.Dict):
            pairs = [(k, v) for k, v in zip(sub.keys, sub.values) if isinstance(k, ast.Constant) and k.value == _V2_FIELD]
        elif isinstance(sub, ast.Call):
            pairs = [(None, kw.value) for kw in sub.keywords if kw.arg == _V2_FIELD]
        for _key, value in pairs:
            if isinstance(value, ast.Constant) and value.value is True:
                return "V2", value.lineno
            if isinstance(value, ast.Constant) and value.value is False:
                return "V1", value.lineno
            if isinstance(value, ast.Constant) and value.value == "auto":
                return None, value.lineno
            return _NOT, value.lineno
    return None


# -- the registry --


def _register_names(cls: ast.ClassDef) -> list[tuple[str, int]]:
    names: list[tuple[str, int]] = []
    for deco in cls.decorator_list:
        if not isinstance(deco, ast.Call):
            continue
        func = deco.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "register_auto_model" and deco.args and isinstance(deco.args[0], ast.Constant) and isinstance(deco.args[0].value, str):
            names.append((deco.args[0].value, deco.lineno))
    return names


def _index_entries(tree: UpstreamTree) -> dict[str, tuple[str, int]]:
    """``MODEL_ARCH_TO_MODULE``'s entries: architecture -> (module, line)."""
    source = tree.files.get(_INDEX_FILE)
    if source is None or source.tree is None:
        return {}
    entries: dict[str, tuple[str, int]] = {}
    for stmt in source.tree.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else getattr(stmt, "target", None)
        value = getattr(stmt, "value", None)
        if not (isinstance(target, ast.Name) and target.id == "MODEL_ARCH_TO_MODULE" and isinstance(value, ast.Dict)):
            continue
        for key, item in zip(value.keys, value.values):
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(item, ast.Constant) and isinstance(item.value, str):
                module = item.value if "." in item.value.strip(".") else f"tensorrt_llm._torch.models.{item.value.strip('.')}"
                entries[key.value] = (module, key.lineno)
    return entries


# -- extraction --


def extract(tree: UpstreamTree) -> Facts:
    """Every fact of :mod:`this module's list <kvpolicy.upstream.extract>` in ``tree``."""
    facts = Facts(release=tree.release, files_read=len(tree.files))
    for source in tree.files.values():
        if source.tree is None:
            facts.problems.append((Where(source.rel, source.problem_line), source.problem or "not read"))
    for rel, why in tree.skipped:
        facts.problems.append((Where(rel, 1), f"not read: {why}"))
    graph = _Graph(tree)
    hooks = _Hooks(graph, facts.logic)
    decorated: dict[str, tuple[_Class, int]] = {}
    for module, classes in graph.classes.items():
        if not module.startswith("tensorrt_llm._torch.models"):
            continue
        for cls in classes.values():
            for arch, line in _register_names(cls.node):
                decorated.setdefault(arch, (cls, line))
    indexed = _index_entries(tree)
    missing: dict[str, list[str]] = {}
    for arch in sorted(set(decorated) | set(indexed)):
        if arch in decorated:
            cls, line = decorated[arch]
            where = Where(cls.file, line)
            values = {decision: hooks.value(cls, name) for decision, name in HOOKS.items()}
            values["kv_cache_manager"] = _merge_kv(values["kv_cache_manager"], hooks.value(cls, _DEFAULTS))
            # The registration is a line that decides the row too (an alias added later names a later PR).
            values = {d: dataclasses.replace(h, chain=(where, *h.chain)) for d, h in values.items()}
            facts.architectures[arch] = ArchFact(arch, cls.key, where, values)
        else:
            module, line = indexed[arch]
            where = Where(_INDEX_FILE, line)
            read = module in graph.modules
            why = f"_arch_index.py names {arch} in {module}, " + ("but no class there registers it" if read else "which is not in the tree")
            unknown = Hook(None, False, why, where, (where,))
            facts.architectures[arch] = ArchFact(arch, None, where, {d: unknown for d in HOOKS}, unread=not read)
            if not read:
                missing.setdefault(module, []).append(arch)
    for module, archs in sorted(missing.items()):
        facts.problems.append(
            (
                Where(_INDEX_FILE, indexed[archs[0]][1]),
                f"{module} (named by _arch_index.py for {', '.join(archs)}) is not in the tree: those architectures' hooks are unknown",
            )
        )
    _fields(tree, facts)
    _env(tree, facts)
    _checkpoints(tree, facts)
    _logic(tree, facts)
    return facts


def _merge_kv(hook: Hook, defaults: Hook) -> Hook:
    """The KV-cache manager an architecture asks for: the V2 hook, else ``get_model_defaults``' setting."""
    if hook.known and hook.value is not None:
        return hook
    if defaults.known and defaults.value is not None:
        return defaults
    if not hook.known:
        return hook
    if not defaults.known:
        return defaults
    return hook


def _fields(tree: UpstreamTree, facts: Facts) -> None:
    for source in tree.files.values():
        if source.tree is None or not source.rel.startswith("tensorrt_llm/llmapi/"):
            continue
        for stmt in source.tree.body:
            if not (isinstance(stmt, ast.ClassDef) and stmt.name in _CONFIG_CLASSES):
                continue
            found = facts.fields.setdefault(stmt.name, {})
            for item in stmt.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                    continue
                name = item.target.id
                if name.startswith("_") or any(isinstance(n, (ast.Name, ast.Attribute)) and _dotted(n).endswith("ClassVar") for n in ast.walk(item.annotation)):
                    continue
                found[name] = FieldFact(stmt.name, name, _literals(item.annotation), _default(item.value), Where(source.rel, item.lineno))


def _literals(annotation: ast.expr) -> tuple[str, ...] | None:
    values: list[str] = []
    seen = False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript) and _dotted(node.value).split(".")[-1] == "Literal":
            seen = True
            elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            values += [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return tuple(values) if seen else None


def _default(value: ast.expr | None) -> str:
    if value is None:
        return "required"
    if isinstance(value, ast.Call) and _dotted(value.func).split(".")[-1] == "Field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return _shown(keyword.value)
            if keyword.arg == "default_factory":
                return f"{_dotted(keyword.value) or 'a factory'}()"
        return _shown(value.args[0]) if value.args else "required"
    return _shown(value)


def _shown(value: ast.expr) -> str:
    if isinstance(value, ast.Constant):
        if value.value is Ellipsis:  # Field(...): pydantic's "required"
            return "required"
        return "null" if value.value is None else "true" if value.value is True else "false" if value.value is False else str(value.value)
    try:
        return ast.unparse(value)
    except RecursionError:
        return "an expression"


def _env(tree: UpstreamTree, facts: Facts) -> None:
    for rel in sorted(tree.files):
        source = tree.files[rel]
        if source.tree is None:
            continue
        if rel == _ARGS_FILE:
            nodes: list[ast.AST] = []
            for stmt in source.tree.body:
                if isinstance(stmt, ast.ClassDef) and stmt.name in _CONFIG_CLASSES:
                    nodes.append(stmt)
                elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and any(
                    "TRANSCEIVER" in _dotted(t).upper() or "KVCACHE" in _dotted(t).upper()
                    for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                ):
                    nodes.append(stmt)
        elif rel.startswith(_ENV_FILES):
            nodes = [source.tree]
        else:
            continue
        for node in nodes:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and _ENV.match(sub.value):
                    facts.env.setdefault(sub.value, Where(rel, sub.lineno))


def _checkpoints(tree: UpstreamTree, facts: Facts) -> None:
    source = tree.files.get(_CHECKPOINT_FILE)
    if source is None or source.tree is None:
        return
    for node in ast.walk(source.tree):
        values: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            if any(_names_architectures(t) for t in node.targets):
                values.append(node.value)
        elif isinstance(node, ast.Call) and _dotted(node.func) == "setattr" and len(node.args) == 3:
            if isinstance(node.args[1], ast.Constant) and node.args[1].value == "architectures":
                values.append(node.args[2])
        elif isinstance(node, ast.Dict):
            values += [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "architectures"]
        for value in values:
            if isinstance(value, (ast.List, ast.Tuple)):
                for element in value.elts:
                    if isinstance(element, ast.Constant) and isinstance(element.value, str):
                        facts.checkpoint_targets.setdefault(element.value, Where(source.rel, element.lineno))


def _names_architectures(target: ast.expr) -> bool:
    if isinstance(target, ast.Attribute):
        return target.attr == "architectures"
    if isinstance(target, ast.Subscript):
        return isinstance(target.slice, ast.Constant) and target.slice.value == "architectures"
    return False


def _logic(tree: UpstreamTree, facts: Facts) -> None:
    defined: dict[str, list[tuple[str, ast.AST]]] = {}
    for rel, source in tree.files.items():
        if source.tree is None:
            continue
        for qualname, node in _functions(source.tree):
            defined.setdefault(qualname, []).append((rel, node))
            if rel.startswith(_VALIDATOR_FILES) and "." not in qualname and _VALIDATOR.search(qualname):
                key = f"{source.module}.{qualname}"  # two files may each have a _validate of one name
                facts.logic.setdefault(key, LogicFact(key, fingerprint(node), Where(rel, node.lineno)))
    for qualname, expected in LOGIC.items():
        places = defined.get(qualname, [])
        if not places:
            continue
        rel, node = next(((r, n) for r, n in places if r == expected), places[0])
        facts.logic[qualname] = LogicFact(qualname, fingerprint(node), Where(rel, getattr(node, "lineno", 1)))


def _functions(module: ast.Module):
    for stmt in module.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield stmt.name, stmt
        elif isinstance(stmt, ast.ClassDef):
            for item in stmt.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{stmt.name}.{item.name}", item
