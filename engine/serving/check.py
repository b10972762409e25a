"""One serving config under one policy: each server with the model it runs and its resolution, and
one verdict for the whole config over every model it may be about (``kvpolicy resolve --config``).

The model of each server is found as TensorRT-LLM finds it (:mod:`kvpolicy.serving.identity`); the sides of
a disaggregated config must agree on the runtime and backend (:func:`kvpolicy.serving.layouts.sides_disagree`);
with an unknown architecture the verdict is taken over every class of models the policy tells apart
(:mod:`kvpolicy.evaluate.verdict`). Unusable input raises :class:`ServingConfigError` listing every problem
with its ``file:line:col``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ContextError
from .identity import ArchitectureMap, ModelIdentity, find_model, model_reference
from ..evaluate.resolution import Resolution
from .layouts import Server, section_keys, servers_of, sides_disagree
from ..evaluate.verdict import Verdict, verdict_of_sides
from ..wording import plural

__all__ = ["ConfigAnswer", "ServerAnswer", "ServingConfigError", "answer_config", "read_line"]


class ServingConfigError(ValueError):
    """A serving config that cannot be answered: every problem, each with its location."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ServerAnswer:
    """One server: the model it runs, and its resolution or why nothing is resolved."""

    server: Server
    identity: ModelIdentity | None = None
    resolution: Resolution | None = None
    not_resolved: str | None = None


@dataclass(frozen=True)
class ConfigAnswer:
    """Every server of a config, and the verdict on them together (None when none resolves)."""

    path: Path
    servers: tuple[ServerAnswer, ...]
    verdict: Verdict | None
    node: Any = field(default=None, repr=False, compare=False)
    """The config's node tree (:func:`kvpolicy.serving.configfile.read_config`): where each key stands."""

    def field_location(self, server: Server, decision: str | None) -> tuple[str, str]:
        """``(file:line:col, dotted key)`` of what a diagnostic about ``decision`` asks to change in
        ``server``'s settings: the field when the config writes it, else its
        ``cache_transceiver_config``."""
        from .configfile import position_of

        keys = server.field_keys.get(decision, server.keys) if decision else server.keys
        found = position_of(self.node, *keys) if self.node is not None else None
        where = f"{self.path}:{found[0]}:{found[1]}" if found else str(self.path)
        return where, ".".join(str(k) for k in keys)

    @property
    def ok(self) -> bool:
        """Whether the config starts for every model it may be about (or transfers nothing)."""
        return self.verdict is None or self.verdict.status in ("starts", "off")

    def to_dict(self, *, explain: bool = False) -> dict[str, Any]:
        """A JSON-ready form (``kvpolicy resolve --config --format json``): each server with what it
        read, its model and its resolution (or why none), the verdict, and whether it starts; with
        ``explain``, every resolution's trace."""
        return {
            "config": str(self.path),
            "servers": [
                {
                    "server": a.server.name,
                    "used": list(a.server.used),
                    **({"model": a.identity.to_dict()} if a.identity is not None else {}),
                    **({"resolution": a.resolution.to_dict()} if a.resolution is not None else {"not_resolved": a.not_resolved}),
                }
                for a in self.servers
            ],
            "verdict": self.verdict.to_dict(resolutions=True, explain=explain) if self.verdict is not None else None,
            "ok": self.ok,
        }


def answer_config(
    path: Path,
    policy_set: Any,
    *,
    explicit: ModelIdentity | None = None,
    root: Path | None = None,
    architecture_map: ArchitectureMap | None = None,
) -> ConfigAnswer:
    """Read ``path`` and answer it under ``policy_set``; ``explicit`` names the model of every
    server (``--arch`` / ``--model``) instead of finding it."""
    from .configfile import ConfigFileError, position_of, read_config

    try:
        document, node = read_config(path)
    except ConfigFileError as exc:
        raise ServingConfigError([str(exc)]) from None

    def at(*keys: Any) -> str:
        found = position_of(node, *keys) if node is not None else None
        return f"{path}:{found[0]}:{found[1]}" if found else str(path)

    if not isinstance(document, dict):
        raise ServingConfigError([f"{path}:1:1: expected a serving config (a mapping of LLM arguments), got {type(document).__name__}"])
    servers = servers_of(document)
    if not servers:
        raise ServingConfigError([f"{path}: no cache_transceiver_config in any layout TensorRT-LLM reads: nothing to resolve"])
    problems = [f"{at(*p.keys)}: {p.message}" for server in servers for p in server.problems]
    answers: list[ServerAnswer] = []
    for server in servers:
        if server.problems:
            continue
        if server.fixed is not None:
            answers.append(ServerAnswer(server, not_resolved=server.fixed))
            continue
        if server.fields is None:
            where = ".".join(map(str, server.keys))
            answers.append(ServerAnswer(server, not_resolved=f"no cache_transceiver_config at {where}: disaggregation off"))
            continue
        reference = model_reference(document, section_keys(server))
        identity = explicit or find_model(reference, config_dir=path.parent, root=root, architecture_map=architecture_map)
        if identity.problem and identity.architecture is None and identity.model_type is None:
            problems.append(f"{identity.problem} (the model of {server.name}, named at {at(*(reference.keys if reference else ('model',)))})")
            continue
        fields = dict(server.fields)
        if identity.architecture is not None:
            fields["pretrained_config"] = identity.pretrained_config()
        try:
            resolution = policy_set.resolve(**fields)
        except ContextError as exc:
            keys = server.field_keys.get(exc.field, server.keys)
            problems.append(f"{at(*keys)}: invalid {exc.field}: {exc.reason}")
            continue
        answers.append(ServerAnswer(server, identity, resolution))
    if problems:
        raise ServingConfigError(list(dict.fromkeys(problems)))
    resolved = [(a.server.role, a.resolution) for a in answers if a.resolution is not None]
    verdict = None
    if resolved:
        roles = [role for role, _ in resolved]
        verdict = verdict_of_sides(policy_set, [r for _, r in resolved], lambda answered: sides_disagree(list(zip(roles, answered))))
    return ConfigAnswer(path, tuple(answers), verdict, node)


def read_line(used: Any, env_names: frozenset[str]) -> str:
    """``read: ...`` of a server: the fields it read, and of the environment only what the policy
    reads (a variable no rule or feature looks at cannot change the answer); the rest are counted."""
    shown, skipped = [], 0
    for entry in used:
        path = entry.split(" = ", 1)[0]
        name = path.rsplit(".", 1)[-1]
        if any(part in path for part in ("env_overrides.", "environment.", "env_var.", ".env.")) and name not in env_names:
            skipped += 1
            continue
        shown.append(entry)
    text = f"read: {'; '.join(shown)}" if shown else "read: nothing"
    if skipped:
        text += f" ({plural(skipped, 'environment variable')} set that the policy never reads not shown)"
    return text
