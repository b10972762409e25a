"""Which real serving configs a policy change affects, and how.

Reads serving configs in every layout TensorRT-LLM reads (see :mod:`kvpolicy.serving`:
disaggregated, perf-sanity, single server, the TensorRT backend's C++-only path). Each server is
resolved under the old and the new policy; the context and generation sides must agree on the
runtime and the backend, or they cannot talk.

What a config may say besides TensorRT-LLM's own fields:

- ``env``: a mapping of environment variables (top level, and per section where it overrides);
  ``DEFAULT`` backends and env-bound features read it.
- ``kvpolicy_features``: a list of feature names (top level and per section, combined), for
  features no config field shows (e.g. ``serialized_state`` for the C++-only serialized
  transceiver-state protocol, ``sync_timing_output``). ``enable_pipelined_transfer`` in
  ``cache_transceiver_config`` and feature environment variables count too.

The architecture comes from the checkpoint's ``config.json`` under a models root, else from an
architecture map (model path glob -> architecture), else it is unknown and resolved as having no
preference (the report says so).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ContextError
from .policyset import PolicySet
from .resolution import Resolution
from .serving import Server, kind, servers_of

__all__ = [
    "ArchitectureMap",
    "ConfigImpact",
    "ConfigProblem",
    "SectionImpact",
    "find_configs",
    "impact_of",
    "load_architecture_map",
]

_SUFFIXES = (".yaml", ".yml", ".json")
_MODELS_ROOT_VARIABLES = ("${LLM_MODELS_ROOT}/", "$LLM_MODELS_ROOT/", "LLM_MODELS_ROOT/")


@dataclass(frozen=True)
class ConfigProblem:
    """Why (part of) a config could not be read or resolved, with its location."""

    path: str
    line: int | None
    message: str
    column: int | None = None

    @property
    def location(self) -> str:
        """``path:line:col`` (as much as is known)."""
        text = self.path
        if self.line is not None:
            text += f":{self.line}"
            if self.column is not None:
                text += f":{self.column}"
        return text

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


@dataclass(frozen=True)
class Side:
    """One policy's answer for a section: a resolution, or why the section is not a valid context."""

    resolution: Resolution | None
    invalid: str | None = None
    field: str | None = None
    """The context field that made the section invalid."""
    fixed: str | None = None
    """Why no policy decides this server (the TensorRT backend's C++-only path)."""

    @property
    def runtime(self) -> str | None:
        if self.fixed is not None:
            return "CPP"
        return self.resolution.runtime if self.resolution else None

    @property
    def backend(self) -> str | None:
        return self.resolution.backend if self.resolution else None

    @property
    def failing(self) -> bool:
        """Whether the server would not start: errors, or an invalid config."""
        return self.invalid is not None or (self.resolution is not None and not self.resolution.ok)

    @property
    def error_ids(self) -> tuple[str, ...]:
        if self.invalid is not None:
            return ("invalid-config",)
        return tuple(d.id for d in self.resolution.errors) if self.resolution else ()

    @property
    def warning_ids(self) -> frozenset[str]:
        """Ids of the warnings the resolution carries."""
        return frozenset(d.id for d in self.resolution.warnings) if self.resolution else frozenset()

    def short(self) -> str:
        """``PYTHON/NIXL``, ``off``, ``invalid`` (with ``!`` when it cannot start)."""
        if self.invalid is not None:
            return "invalid"
        if self.fixed is not None:
            return "CPP (not resolved)"
        r = self.resolution
        assert r is not None
        if not r.enabled:
            return "off"
        text = f"{r.runtime}/{r.backend}" + ("/V2" if r.kv_cache_manager == "V2" else "")
        return text + ("!" if not r.ok else "")


@dataclass(frozen=True)
class SectionImpact:
    """One server section of one config under both policies."""

    name: str
    line: int | None
    old: Side
    new: Side
    parallel: tuple[tuple[str, Any], ...] = ()
    """The section's parallel sizes as written (tensor, pipeline, ...), for the report."""
    used: tuple[str, ...] = ()
    """Every config field read for this server (``path = value``)."""
    role: str = "server"
    """``context``, ``generation`` or ``server``."""

    @property
    def status(self) -> str:
        """unchanged, new warning, runtime changes, backend changes, changes, starts failing,
        stops failing, still failing, fails differently."""
        old, new = self.old, self.new
        if new.failing and not old.failing:
            return "starts failing"
        if old.failing and not new.failing:
            return "stops failing"
        if old.failing and new.failing:
            return "still failing" if old.error_ids == new.error_ids else "fails differently"
        if old.runtime != new.runtime:
            return "runtime changes"
        if old.backend != new.backend:
            return "backend changes"
        if old.resolution is None or new.resolution is None:
            return "unchanged"
        if dict(old.resolution.values) != dict(new.resolution.values):
            return "changes"
        if new.warning_ids - old.warning_ids:
            return "new warning"
        return "unchanged"


@dataclass(frozen=True)
class ConfigImpact:
    """One config file: its sections, the architecture used, problems met."""

    path: str
    model: str | None = None
    architecture: str | None = None
    model_type: str | None = None
    architecture_source: str = "unknown"
    """``config.json`` (with its path), ``arch-map`` (with the pattern), or ``unknown``."""
    sections: tuple[SectionImpact, ...] = ()
    problems: tuple[ConfigProblem, ...] = ()
    mismatch_old: str | None = None
    mismatch_new: str | None = None
    skipped: bool = False
    """True when the file holds no ``cache_transceiver_config`` (it is counted, not reported)."""

    @property
    def status(self) -> str:
        """The worst status of its sections, counting side mismatches and problems."""
        if self.problems:
            return "malformed"
        old_fail = self.mismatch_old is not None or any(s.old.failing for s in self.sections)
        new_fail = self.mismatch_new is not None or any(s.new.failing for s in self.sections)
        if new_fail and not old_fail:
            return "starts failing"
        if old_fail and not new_fail:
            return "stops failing"
        if old_fail and new_fail:
            same = self.mismatch_old == self.mismatch_new and all(s.old.error_ids == s.new.error_ids for s in self.sections)
            return "still failing" if same else "fails differently"
        statuses = {s.status for s in self.sections}
        for status in ("still failing", "fails differently", "runtime changes", "backend changes", "changes", "new warning"):
            if status in statuses:
                return status
        return "unchanged"


# -- architecture ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchitectureMap:
    """Model path globs -> (architecture, model_type), first match wins (file order)."""

    entries: tuple[tuple[str, str, str | None], ...] = ()
    path: str = ""

    def lookup(self, model: str) -> tuple[str, str | None, str] | None:
        """(architecture, model_type, pattern) of the first pattern matching ``model``."""
        for pattern, architecture, model_type in self.entries:
            if fnmatch.fnmatchcase(model, pattern) or fnmatch.fnmatchcase(model.rstrip("/").rsplit("/", 1)[-1], pattern):
                return architecture, model_type, pattern
        return None


def load_architecture_map(path: str | Path) -> ArchitectureMap:
    """Read an architecture map (YAML or JSON): ``{glob: Architecture}`` or
    ``{glob: {architecture: ..., model_type: ...}}``. Raises ValueError with the location."""
    text_path = str(path)
    data = _parse(Path(path))
    if isinstance(data, ConfigProblem):
        raise ValueError(str(data))
    document, _ = data
    if not isinstance(document, Mapping):
        raise ValueError(f"{text_path}: expected a mapping of model path globs to architectures")
    entries = []
    for pattern, target in document.items():
        if isinstance(target, str):
            entries.append((str(pattern), target, None))
        elif isinstance(target, Mapping) and isinstance(target.get("architecture"), str):
            model_type = target.get("model_type")
            entries.append((str(pattern), target["architecture"], model_type if isinstance(model_type, str) else None))
        else:
            raise ValueError(
                f"{text_path}: {pattern!r}: expected an architecture name or {{architecture: ..., model_type: ...}}, got {target!r}"
            )
    return ArchitectureMap(tuple(entries), text_path)


def _from_checkpoint(model: str, models_root: Path | None, config_dir: Path) -> tuple[str | None, str | None, str] | ConfigProblem | None:
    stripped = model
    for prefix in _MODELS_ROOT_VARIABLES:
        if stripped.startswith(prefix):
            stripped = stripped[len(prefix) :]
    candidates = []
    if models_root is not None and not Path(stripped).is_absolute():
        candidates.append(models_root / stripped)
    candidates.append(Path(stripped))
    if not Path(stripped).is_absolute():
        candidates.append(config_dir / stripped)
    for folder in candidates:
        config = folder / "config.json"
        if config.is_file():
            from .configfile import ConfigFileError, read_config

            try:
                data, _ = read_config(config)
            except ConfigFileError as exc:
                return ConfigProblem(exc.path, exc.line, f"cannot read the checkpoint config: {exc.message}", exc.column)
            architectures = data.get("architectures") if isinstance(data, dict) else None
            if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str):
                return ConfigProblem(str(config), None, "the checkpoint config has no `architectures` list")
            model_type = data.get("model_type")
            return architectures[0], model_type if isinstance(model_type, str) else None, str(config)
    return None


# -- reading configs -------------------------------------------------------------------------------


def find_configs(paths: Iterable[str | Path]) -> tuple[list[Path], list[ConfigProblem]]:
    """Config files under ``paths`` (folders searched recursively, sorted), and paths that do not exist."""
    found: list[Path] = []
    missing: list[ConfigProblem] = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            # Not only regular files: a FIFO or device named *.yaml is reported by the reader, not skipped.
            found += sorted(p for p in path.rglob("*") if p.suffix.lower() in _SUFFIXES and not p.is_dir())
        elif path.is_file():
            found.append(path)
        else:
            missing.append(ConfigProblem(str(path), None, "no such file or folder"))
    return found, missing


def _parse(path: Path) -> tuple[Any, Any] | ConfigProblem:
    """(document, YAML node tree or None) of a YAML or JSON file, or the problem with its location.

    Read by :func:`kvpolicy.configfile.read_config`: regular files only, size-capped, bounded
    depth and alias expansion, duplicate keys refused."""
    from .configfile import ConfigFileError, read_config

    try:
        return read_config(path)
    except ConfigFileError as exc:
        return ConfigProblem(exc.path, exc.line, exc.message, exc.column)


def _line_of(node: Any, *keys: Any) -> int | None:
    """The 1-based line of the value at ``keys`` in a YAML node tree (the key's line)."""
    import yaml

    line = None
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return line
        for key_node, value_node in node.value:
            if key_node.value == key:
                line = key_node.start_mark.line + 1
                node = value_node
                break
        else:
            return line
    return line


def impact_of(
    paths: Iterable[str | Path],
    old: PolicySet,
    new: PolicySet,
    *,
    models_root: str | Path | None = None,
    architecture_map: ArchitectureMap | None = None,
) -> list[ConfigImpact]:
    """The impact of moving from ``old`` to ``new`` on every config under ``paths``."""
    files, missing = find_configs(paths)
    results = [ConfigImpact(p.path, problems=(p,)) for p in missing]
    root = Path(models_root) if models_root is not None else None
    for path in files:
        results.append(_config_impact(path, old, new, root, architecture_map or ArchitectureMap()))
    return results


def _config_impact(path: Path, old: PolicySet, new: PolicySet, root: Path | None, arch_map: ArchitectureMap) -> ConfigImpact:
    name = str(path)
    parsed = _parse(path)
    if isinstance(parsed, ConfigProblem):
        return ConfigImpact(name, problems=(parsed,))
    document, node = parsed
    if not isinstance(document, Mapping):
        if document is None or not _mentions_transceiver(document):
            return ConfigImpact(name, skipped=True)
        return ConfigImpact(name, problems=(ConfigProblem(name, 1, f"expected a mapping at the top, got {kind(document)}"),))

    problems: list[ConfigProblem] = []
    servers = servers_of(document)
    if servers is None:
        return ConfigImpact(name, skipped=True)
    disaggregated = any(s.role != "server" for s in servers)

    model = document.get("model")
    model_text = model if isinstance(model, str) else None
    architecture, model_type, source = None, None, "unknown"
    if model is not None and not isinstance(model, str):
        problems.append(ConfigProblem(name, _line_of(node, "model"), f"model: expected a checkpoint path, got {model!r}"))
    elif model_text:
        found = _from_checkpoint(model_text, root, path.parent)
        if isinstance(found, ConfigProblem):
            problems.append(found)
        elif found is not None:
            architecture, model_type, where = found
            source = f"config.json ({where})"
        else:
            mapped = arch_map.lookup(model_text)
            if mapped is not None:
                architecture, model_type, pattern = mapped
                source = f"arch-map ({pattern})"

    impacts: list[SectionImpact] = []
    for server in servers:
        line = _line_of(node, *server.keys)
        for problem in server.problems:
            problems.append(ConfigProblem(name, _line_of(node, *problem.keys), problem.message))
        if server.problems:
            continue
        if server.fixed is not None:
            side = Side(None, fixed=server.fixed)
            impacts.append(SectionImpact(server.name, line, side, side, server.parallel, server.used, server.role))
            continue
        if server.fields is None:
            continue
        fields = dict(server.fields)
        if architecture is not None:
            if model_type is not None:
                fields["pretrained_config"] = {"architectures": [architecture], "model_type": model_type}
            else:
                fields["architecture"] = architecture
        before, after = _resolve(old, fields), _resolve(new, fields)
        if before.invalid is not None and after.invalid is not None:
            # Neither policy accepts it: the config itself is wrong (unknown backend, wrong type).
            at = _line_of(node, *server.keys, after.field) if after.field in server.fields else None
            problems.append(ConfigProblem(name, at or line, f"{'/'.join(map(str, server.keys))}: {after.invalid}"))
            continue
        impacts.append(SectionImpact(server.name, line, before, after, server.parallel, server.used, server.role))
    if problems:
        return ConfigImpact(name, model_text, architecture, model_type, source, tuple(impacts), tuple(problems))
    return ConfigImpact(
        name,
        model_text,
        architecture,
        model_type,
        source,
        tuple(impacts),
        (),
        _mismatch(impacts, "old") if disaggregated else None,
        _mismatch(impacts, "new") if disaggregated else None,
    )


def _mentions_transceiver(document: Any) -> bool:
    return "cache_transceiver_config" in json.dumps(document, default=str)


def _resolve(policy_set: PolicySet, fields: dict[str, Any]) -> Side:
    config = dict(fields)
    try:
        return Side(policy_set.resolve(config))
    except ContextError as exc:
        return Side(None, f"{exc.field}: {exc.reason}", exc.field)


def _mismatch(sections: list[SectionImpact], which: str) -> str | None:
    sides = {s.role: getattr(s, which) for s in sections}
    context, generation = sides.get("context"), sides.get("generation")
    if context is None or generation is None or context.resolution is None or generation.resolution is None:
        return None
    differences = [
        f"{label} {getattr(context, label)} vs {getattr(generation, label)}"
        for label in ("runtime", "backend")
        if getattr(context, label) != getattr(generation, label)
    ]
    if not differences:
        return None
    return (
        f"the context and generation servers resolve to different {' and '.join(d.split()[0] + 's' for d in differences)} "
        f"({'; '.join(differences)}); both sides must use the same runtime and backend to exchange KV cache"
    )
