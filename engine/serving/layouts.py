"""Read TensorRT-LLM serving configs the way TensorRT-LLM reads them: which servers a file starts,
and what each server asks of the transceiver.

A serving config comes in one of four layouts, all read here:

- **disaggregated** (``trtllm-serve disaggregated -c``): ``context_servers`` and
  ``generation_servers`` sections; every other top-level key is an LLM argument that each section
  inherits unless it sets the key itself (a top-level ``cache_transceiver_config`` therefore
  applies to every server that has none of its own);
- **perf-sanity** (upstream's benchmark configs): ``worker_config.ctx`` / ``worker_config.gen``
  hold each side's LLM arguments, ``environment.worker_env_var`` the workers' environment;
- **single server** (``--extra_llm_api_options``): the LLM arguments at the top level;
- a top-level ``backend: trt`` (or ``_autodeploy``) starts the TensorRT / AutoDeploy path, where
  ``transceiver_runtime: auto`` is never resolved: the C++ transceiver is the only one there.

Per server, the fields ``resolve`` takes come from ``cache_transceiver_config`` (a section without
``backend`` leaves disaggregation off, as upstream's ``CacheTransceiverConfig`` does),
``kv_cache_config.use_kv_cache_manager_v2`` (the KV-cache manager), ``env_overrides`` (the
server's environment: ``DEFAULT`` backends and env-bound features read it) and kvpolicy's own
``env`` / ``kvpolicy_features`` keys. Every field used is listed in :attr:`Server.used`, so a
report can say what it read. Problems are values with a location, never exceptions.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..read.fields import CACHE_TRANSCEIVER_FIELDS  # (re-exported: every field of upstream's CacheTransceiverConfig)
from .llmargs import check_sections, misspelling_of

__all__ = ["CACHE_TRANSCEIVER_FIELDS", "NON_RESOLVING_BACKENDS", "Server", "ServerProblem", "section_keys", "servers_of", "sides_disagree"]

#: Top-level ``backend`` values whose servers never resolve ``transceiver_runtime: auto``.
NON_RESOLVING_BACKENDS = frozenset({"trt", "tensorrt", "_autodeploy"})

_DISAGGREGATED = ("context_servers", "generation_servers")
_PERF_SANITY = (("ctx", "context"), ("gen", "generation"))
#: Keys of a disaggregated config that belong to the disaggregated server, not to the workers.
_SERVER_ONLY = frozenset(
    {
        "hostname",
        "port",
        "context_servers",
        "generation_servers",
        "conditional_disagg_config",
        "otlp_config",
        "disagg_cluster",
        "node_id",
        "perf_metrics_max_requests",
        "max_retries",
        "schedule_style",
        "model",
        "backend",
    }
)


@dataclass(frozen=True)
class ServerProblem:
    """Why a server's settings could not be read, with the path of the offending key."""

    keys: tuple[Any, ...]
    message: str


@dataclass(frozen=True)
class Server:
    """One server a config starts, and what it asks of the transceiver."""

    name: str
    """``context_servers``, ``generation_servers``, ``worker_config.ctx``, ``worker_config.gen`` or ``server``."""
    role: str
    """``context``, ``generation`` or ``server``."""
    keys: tuple[Any, ...]
    """Where its ``cache_transceiver_config`` is (or would be) in the document."""
    fields: dict[str, Any] | None
    """The fields ``resolve`` takes, or None when this server never resolves (see :attr:`fixed`)."""
    used: tuple[str, ...] = ()
    """``path = value`` of every config field that went into :attr:`fields`."""
    fixed: str | None = None
    """Why nothing is resolved for this server, e.g. the TensorRT backend's C++-only path."""
    parallel: tuple[tuple[str, Any], ...] = ()
    problems: tuple[ServerProblem, ...] = field(default=())
    field_keys: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """Where in the document each field of :attr:`fields` was written, when the config wrote it
    (``kv_cache_manager``: ``kv_cache_config.use_kv_cache_manager_v2``; ``features``:
    ``kvpolicy_features``), for messages that point at the line to change."""


def servers_of(document: Mapping[str, Any]) -> list[Server] | None:
    """The servers of a parsed config, or None when it configures no KV-cache transfer at all."""
    top_backend = document.get("backend")
    fixed = None
    if isinstance(top_backend, str) and top_backend.lower() in NON_RESOLVING_BACKENDS:
        fixed = f"backend {top_backend}: the TensorRT-LLM {top_backend} path has only the C++ transceiver; transceiver_runtime auto is never resolved there"
    if any(side in document for side in _DISAGGREGATED):
        inherited = {k: v for k, v in document.items() if k not in _SERVER_ONLY}
        found = []
        for side in _DISAGGREGATED:
            if side not in document:
                continue
            section = document[side]
            if not isinstance(section, Mapping):
                found.append(
                    Server(side, side.split("_")[0], (side,), None, problems=(ServerProblem((side,), f"{side}: expected a mapping, got {kind(section)}"),))
                )
                continue
            clashes = [k for k in section if k in inherited and section[k] != inherited[k]]
            if clashes:
                # upstream's extract_disagg_cfg raises for a key set differently at both levels
                found.append(
                    Server(
                        side,
                        side.split("_")[0],
                        (side, clashes[0]),
                        None,
                        problems=tuple(
                            ServerProblem(
                                (side, k), f"{k} is set both at the top level and in {side}, with different values; TensorRT-LLM refuses this: keep one"
                            )
                            for k in clashes
                        ),
                    )
                )
                continue
            merged = {**inherited, **section}
            origin = {k: ((side,) if k in section else ()) for k in merged}
            found.append(_server(side, side.split("_")[0], merged, origin, {}, fixed, (side,)))
        return found if _transfers(found) else None
    worker = document.get("worker_config")
    if isinstance(worker, Mapping) and any(short in worker for short, _ in _PERF_SANITY):
        found = []
        for short, role in _PERF_SANITY:
            env, env_used, problems = _worker_env(document.get("environment"), f"{short}_worker_env_var")
            if short not in worker:
                continue
            section = worker[short]
            keys = ("worker_config", short)
            if not isinstance(section, Mapping):
                found.append(
                    Server(".".join(keys), role, keys, None, problems=(ServerProblem(keys, f"{'.'.join(keys)}: expected a mapping, got {kind(section)}"),))
                )
                continue
            server = _server(".".join(keys), role, dict(section), {k: keys for k in section}, env, fixed, keys)
            found.append(_with(server, env_used, problems))
        return found if _transfers(found) else None
    if "cache_transceiver_config" in document or any(misspelling_of(k) == "cache_transceiver_config" for k in document):
        return [_server("server", "server", dict(document), {k: () for k in document}, {}, fixed)]
    return None


def sides_disagree(sides: Any) -> str | None:
    """Why a config's context and generation servers cannot exchange KV cache (they resolve to
    different runtimes or backends), or None. ``sides``: (role, resolution) pairs."""
    by_role = {role: r for role, r in sides if r is not None}
    context, generation = by_role.get("context"), by_role.get("generation")
    if context is None or generation is None:
        return None
    differences = [
        (label, getattr(context, label), getattr(generation, label))
        for label in ("runtime", "backend")
        if getattr(context, label) != getattr(generation, label)
    ]
    if not differences:
        return None
    return (
        f"the context and generation servers resolve to different {' and '.join(label + 's' for label, _, _ in differences)} "
        f"({'; '.join(f'{label} {a} vs {b}' for label, a, b in differences)}); both sides must use the same runtime and "
        "backend to exchange KV cache"
    )


def section_keys(server: Server) -> tuple[Any, ...]:
    """Where a server's own settings are: ``(context_servers,)``, ``(worker_config, ctx)`` or ``()``."""
    return () if server.role == "server" else tuple(server.name.split("."))


def _transfers(servers: list[Server]) -> bool:
    """Whether any server configures a transceiver (or could not be read)."""
    return any(s.problems or s.fields is not None or s.fixed for s in servers)


def _with(server: Server, used: tuple[str, ...], problems: tuple[ServerProblem, ...]) -> Server:
    return Server(
        server.name,
        server.role,
        server.keys,
        server.fields,
        (*used, *server.used),
        server.fixed,
        server.parallel,
        (*problems, *server.problems),
        server.field_keys,
    )


def _server(
    name: str,
    role: str,
    settings: Mapping[str, Any],
    origin: dict[str, tuple[Any, ...]],
    env: dict[str, str],
    fixed: str | None,
    section: tuple[Any, ...] = (),
) -> Server:
    """A server from its effective LLM arguments; ``origin`` maps each key to its section path, and
    ``section`` is where the server's own keys go (where a missing transceiver config is missing)."""
    # What upstream's strict models refuse (a misspelt section name or field): the server does not start.
    problems: list[ServerProblem] = [ServerProblem(keys, message) for keys, message in check_sections(settings, origin)]
    used: list[str] = []
    parallel = tuple((k, v) for k, v in settings.items() if isinstance(k, str) and k.endswith("_parallel_size"))
    at = origin.get("cache_transceiver_config", section)
    keys = (*at, "cache_transceiver_config")
    config = settings.get("cache_transceiver_config")
    if "cache_transceiver_config" not in settings:
        meant = any(misspelling_of(k) == "cache_transceiver_config" for k in settings)
        return Server(name, role, keys, None, (), None, parallel, tuple(problems) if meant else ())
    if fixed is not None:
        return Server(name, role, keys, None, (f"{_dotted(('backend',))} (top level)",), fixed, parallel, tuple(problems))
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        problems.append(ServerProblem(keys, f"{_dotted(keys)}: expected a mapping, got {kind(config)}"))
        return Server(name, role, keys, None, problems=tuple(problems), parallel=parallel)
    fields: dict[str, Any] = {}
    field_keys: dict[str, tuple[Any, ...]] = {}
    for key, value in config.items():
        fields[str(key)] = value
        field_keys[str(key)] = (*keys, key)
        used.append(f"{_dotted((*keys, key))} = {_show(value)}")
    if "backend" not in config or config.get("backend") is None:
        # Upstream: a CacheTransceiverConfig without a backend starts no transceiver.
        fields["backend"] = None
    kv_config = settings.get("kv_cache_config")
    if kv_config is not None:
        kv_keys = (*origin.get("kv_cache_config", ()), "kv_cache_config")
        if not isinstance(kv_config, Mapping):
            problems.append(ServerProblem(kv_keys, f"{_dotted(kv_keys)}: expected a mapping, got {kind(kv_config)}"))
        elif "use_kv_cache_manager_v2" in kv_config:
            switch = kv_config["use_kv_cache_manager_v2"]
            where = _dotted((*kv_keys, "use_kv_cache_manager_v2"))
            if switch is None or switch == "auto":
                manager = "auto"
            elif isinstance(switch, bool):
                manager = "V2" if switch else "V1"
            else:
                problems.append(ServerProblem((*kv_keys, "use_kv_cache_manager_v2"), f"{where}: expected true, false, null or auto, got {kind(switch)}"))
                manager = None
            if manager is not None:
                fields["kv_cache_manager"] = manager
                field_keys["kv_cache_manager"] = (*kv_keys, "use_kv_cache_manager_v2")
                used.append(f"{where} = {_show(switch)}")
    server_env = dict(env)
    for key in ("env", "env_overrides"):
        if key not in settings:
            continue
        value = settings[key]
        env_keys = (*origin.get(key, ()), key)
        if not isinstance(value, Mapping):
            problems.append(ServerProblem(env_keys, f"{_dotted(env_keys)}: expected a mapping of variables, got {kind(value)}"))
            continue
        for variable, item in value.items():
            if item is None:  # null: the variable is not set (a set-empty variable is another value)
                server_env.pop(str(variable), None)
            else:
                server_env[str(variable)] = str(item).lower() if isinstance(item, bool) else str(item)
            used.append(f"{_dotted((*env_keys, variable))} = {_show(item)}")
        field_keys["env"] = env_keys
    features = settings.get("kvpolicy_features", [])
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        feature_keys = (*origin.get("kvpolicy_features", ()), "kvpolicy_features")
        problems.append(ServerProblem(feature_keys, f"{_dotted(feature_keys)}: expected a list of feature names, got {features!r}"))
        features = []
    elif features:
        field_keys["features"] = (*origin.get("kvpolicy_features", ()), "kvpolicy_features")
        used.append(f"{_dotted(field_keys['features'])} = {_show(features)}")
    fields["env"] = server_env
    fields["features"] = frozenset(features)
    if problems:
        return Server(name, role, keys, None, tuple(used), None, parallel, tuple(problems))
    return Server(name, role, keys, fields, tuple(used), None, parallel, field_keys=field_keys)


def _worker_env(value: Any, role_key: str) -> tuple[dict[str, str], tuple[str, ...], tuple[ServerProblem, ...]]:
    """``environment.worker_env_var`` then the role's own ``ctx_worker_env_var`` / ``gen_worker_env_var``
    (appended, so they win), as the perf-sanity launcher exports them."""
    if not isinstance(value, Mapping):
        return {}, (), ()
    env: dict[str, str] = {}
    used: list[str] = []
    for key in ("worker_env_var", role_key):
        if key in value:
            part, part_used, problems = _env_words(value[key], ("environment", key))
            if problems:
                return {}, (), problems
            env.update(part)
            used += part_used
    return env, tuple(used), ()


def _env_words(raw: Any, keys: tuple[str, str]) -> tuple[dict[str, str], tuple[str, ...], tuple[ServerProblem, ...]]:
    """``"A=1 B=2"`` words (or a mapping) as environment variables."""
    env: dict[str, str] = {}
    if isinstance(raw, Mapping):
        env = {str(k): str(v) for k, v in raw.items() if v is not None}  # null: not set
    elif isinstance(raw, str):
        try:
            words = shlex.split(raw)
        except ValueError as exc:
            return {}, (), (ServerProblem(keys, f"{_dotted(keys)}: cannot split {raw!r}: {exc}"),)
        for word in words:
            variable, sep, item = word.partition("=")
            if not sep or not variable:
                return {}, (), (ServerProblem(keys, f"{_dotted(keys)}: expected NAME=VALUE, got {word!r}"),)
            env[variable] = item
    elif raw is not None:
        return {}, (), (ServerProblem(keys, f"{_dotted(keys)}: expected NAME=VALUE words, got {kind(raw)}"),)
    return env, tuple(f"{_dotted(keys)}.{k} = {v}" for k, v in env.items()), ()


def _dotted(keys: tuple[Any, ...]) -> str:
    return ".".join(str(k) for k in keys)


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def kind(value: Any) -> str:
    """How a config value reads in a message: a list, a string, a number, ..."""
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return type(value).__name__
