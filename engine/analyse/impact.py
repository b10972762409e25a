"""Which real serving configs a policy change affects, and how.

Reads serving configs in every layout TensorRT-LLM reads (see :mod:`kvpolicy.serving.layouts`:
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

Each server's model is found as TensorRT-LLM finds it (:mod:`kvpolicy.serving.identity`: its
``config.json`` under the models root, the config's folder or the working directory, else an
architecture map). When it cannot be found, the config is resolved for every class of models the two
versions tell apart: a status that holds for all of them is reported as such; one that differs is
``architecture unknown``, with the status of each class (never a green "unchanged").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ContextError
from ..serving.identity import ArchitectureMap, ModelIdentity, find_model, load_architecture_map, model_reference
from ..serving.identity import models_root as root_of  # impact_of's parameter is named models_root
from ..evaluate.policyset import PolicySet
from ..evaluate.resolution import Resolution
from ..serving.layouts import kind, section_keys, servers_of, sides_disagree
from ..evaluate.verdict import model_label, resolve_model

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
#: The status of a section or config whose outcome depends on a model kvpolicy could not identify.
ARCHITECTURE_UNKNOWN = "architecture unknown"


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
    identity: ModelIdentity | None = None
    """The model this server runs, and where it was found (or why it is unknown)."""
    possibilities: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """With an unknown architecture: (status, models) for each status some class of models gets.
    ``old`` and ``new`` then show the "any other architecture" class."""

    @property
    def status(self) -> str:
        """unchanged, new warning, runtime changes, backend changes, changes, starts failing,
        stops failing, still failing, fails differently; ``architecture unknown`` when the
        architecture is unknown and the status differs between the models it may be."""
        if len(self.possibilities) > 1:
            return ARCHITECTURE_UNKNOWN
        return self.known_status

    @property
    def known_status(self) -> str:
        """The status of the resolutions ``old`` and ``new`` hold."""
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
    possibilities: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """With an unknown architecture: (status, models) for each status some class of models gets."""

    @property
    def architecture_known(self) -> bool:
        """Whether every resolved server's model was identified."""
        return all(s.identity is None or s.identity.known for s in self.sections)

    @property
    def may_fail(self) -> bool:
        """With an unknown architecture: whether some model would start failing (or fail differently)."""
        return any(status in ("starts failing", "fails differently") for status, _ in self.possibilities)

    @property
    def status(self) -> str:
        """The worst status of its sections, counting side mismatches and problems;
        ``architecture unknown`` when it differs between the models the config may run."""
        if self.problems:
            return "malformed"
        if len(self.possibilities) > 1:
            return ARCHITECTURE_UNKNOWN
        return self.known_status

    @property
    def known_status(self) -> str:
        """The status of the sections and mismatches as they stand."""
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
        statuses = {s.known_status for s in self.sections}
        for status in ("still failing", "fails differently", "runtime changes", "backend changes", "changes", "new warning"):
            if status in statuses:
                return status
        return "unchanged"


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

    Read by :func:`kvpolicy.serving.configfile.read_config`: regular files only, size-capped, bounded
    depth and alias expansion, duplicate keys refused."""
    from ..serving.configfile import ConfigFileError, read_config

    try:
        return read_config(path)
    except ConfigFileError as exc:
        return ConfigProblem(exc.path, exc.line, exc.message, exc.column)


def _line_of(node: Any, *keys: Any) -> int | None:
    """The 1-based line of the value at ``keys`` in a YAML node tree (the key's line)."""
    from ..serving.configfile import position_of

    found = position_of(node, *keys) if node is not None else None
    return found[0] if found else None


def impact_of(
    paths: Iterable[str | Path],
    old: PolicySet,
    new: PolicySet,
    *,
    models_root: str | Path | None = None,
    architecture_map: ArchitectureMap | None = None,
) -> list[ConfigImpact]:
    """The impact of moving from ``old`` to ``new`` on every config under ``paths``. The models root
    defaults to ``$LLM_MODELS_ROOT``."""
    paths = list(paths)
    files, missing = find_configs(paths)
    named = {Path(p) for p in paths if Path(p).is_file()}
    results = [ConfigImpact(p.path, problems=(p,)) for p in missing]
    root = root_of(models_root)
    for path in files:
        result = _config_impact(path, old, new, root, architecture_map or ArchitectureMap())
        if result.skipped and path in named:
            # A file named on its own is meant as a serving config: saying nothing would read as "fine".
            result = ConfigImpact(
                result.path,
                problems=(
                    ConfigProblem(
                        result.path,
                        None,
                        "no cache_transceiver_config in any layout TensorRT-LLM reads (context_servers/generation_servers, "
                        "worker_config.ctx/gen, or the top level): nothing to check; is a key misspelt?",
                    ),
                ),
            )
        results.append(result)
    return results


def _config_impact(path: Path, old: PolicySet, new: PolicySet, root: Path | None, arch_map: ArchitectureMap) -> ConfigImpact:
    name = str(path)
    parsed = _parse(path)
    if isinstance(parsed, ConfigProblem):
        return ConfigImpact(name, problems=(parsed,))
    document, node = parsed
    if not isinstance(document, Mapping):
        if document is None:
            return ConfigImpact(name, problems=(ConfigProblem(name, 1, "the file is empty: a serving config is a mapping of LLM arguments", 1),))
        if not _mentions_transceiver(document):
            return ConfigImpact(name, skipped=True)
        return ConfigImpact(name, problems=(ConfigProblem(name, 1, f"expected a mapping at the top, got {kind(document)}"),))

    problems: list[ConfigProblem] = []
    servers = servers_of(document)
    if servers is None:
        return ConfigImpact(name, skipped=True)
    disaggregated = any(s.role != "server" for s in servers)
    model = document.get("model")
    if model is not None and not isinstance(model, str):
        problems.append(ConfigProblem(name, _line_of(node, "model"), f"model: expected a checkpoint path, got {model!r}"))

    impacts: list[SectionImpact] = []
    for server in servers:
        line = _line_of(node, *server.keys)
        for problem in server.problems:
            found = ConfigProblem(name, _line_of(node, *problem.keys), problem.message)
            if found not in problems:  # a top-level key both sections inherit is one problem
                problems.append(found)
        if server.problems:
            continue
        if server.fixed is not None:
            side = Side(None, fixed=server.fixed)
            impacts.append(SectionImpact(server.name, line, side, side, server.parallel, server.used, server.role))
            continue
        if server.fields is None:
            continue
        reference = model_reference(document, section_keys(server))
        identity = find_model(reference, config_dir=path.parent, root=root, architecture_map=arch_map)
        if identity.problem and identity.architecture is None and identity.model_type is None:
            problems.append(ConfigProblem(name, _line_of(node, *(reference.keys if reference else ("model",))), identity.problem))
            continue
        fields = dict(server.fields)
        if identity.architecture is not None:
            fields["pretrained_config"] = identity.pretrained_config()
        before, after = _resolve(old, fields), _resolve(new, fields)
        if before.invalid is not None and after.invalid is not None:
            # Neither policy accepts it: the config itself is wrong (unknown backend, wrong type).
            at = _line_of(node, *server.keys, after.field) if after.field in server.fields else None
            problems.append(ConfigProblem(name, at or line, f"{'/'.join(map(str, server.keys))}: {after.invalid}"))
            continue
        impacts.append(SectionImpact(server.name, line, before, after, server.parallel, server.used, server.role, identity))
    first = next((s.identity for s in impacts if s.identity is not None), None)
    model_text = first.reference.text if first is not None and first.reference else (model if isinstance(model, str) else None)
    architecture = first.architecture if first is not None else None
    model_type = first.model_type if first is not None else None
    source = "unknown" if first is None or not first.known else f"{first.source} ({first.where})"
    if problems:
        return ConfigImpact(name, model_text, architecture, model_type, source, tuple(impacts), tuple(problems))
    result = ConfigImpact(
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
    if any(s.identity is not None and not s.identity.known for s in impacts):
        result = _over_models(result, old, new, disaggregated)
    return result


def _over_models(result: ConfigImpact, old: PolicySet, new: PolicySet, disaggregated: bool) -> ConfigImpact:
    """A config whose model is unknown, resolved for every class of models either version tells
    apart: the classes' statuses, and the "any other architecture" class's resolutions as shown."""
    models = list(dict.fromkeys([*old.models(), *new.models()]))
    models.sort(key=lambda m: (m[0] is None, m[0] or "", m[1] or ""))
    config_statuses: dict[str, list[str]] = {}
    section_statuses: list[dict[str, list[str]]] = [{} for _ in result.sections]
    shown = result
    for model in models:
        sections = [
            replace(s, old=_for_model(old, s.old, model), new=_for_model(new, s.new, model)) if s.identity is not None and not s.identity.known else s
            for s in result.sections
        ]
        candidate = replace(
            result,
            sections=tuple(sections),
            mismatch_old=_mismatch(sections, "old") if disaggregated else None,
            mismatch_new=_mismatch(sections, "new") if disaggregated else None,
        )
        label = model_label(model)
        config_statuses.setdefault(candidate.known_status, []).append(label)
        for index, section in enumerate(sections):
            section_statuses[index].setdefault(section.known_status, []).append(label)
        if model == (None, None):
            shown = candidate
    return replace(
        shown,
        sections=tuple(
            replace(s, possibilities=tuple((status, tuple(labels)) for status, labels in statuses.items()))
            for s, statuses in zip(shown.sections, section_statuses)
        ),
        possibilities=tuple((status, tuple(labels)) for status, labels in config_statuses.items()),
    )


def _for_model(policy_set: PolicySet, side: Side, model: tuple[str | None, str | None]) -> Side:
    if side.resolution is None:
        return side
    return Side(resolve_model(policy_set, side.resolution, model), side.invalid, side.field, side.fixed)


def _mentions_transceiver(document: Any) -> bool:
    return "cache_transceiver_config" in json.dumps(document, default=str)


def _resolve(policy_set: PolicySet, fields: dict[str, Any]) -> Side:
    config = dict(fields)
    try:
        return Side(policy_set.resolve(config))
    except ContextError as exc:
        return Side(None, f"{exc.field}: {exc.reason}", exc.field)


def _mismatch(sections: list[SectionImpact] | tuple[SectionImpact, ...], which: str) -> str | None:
    return sides_disagree([(s.role, getattr(s, which).resolution) for s in sections])
