"""``kvpolicy resolve`` and ``kvpolicy explain``: one context, its values, why, and what is wrong."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

from ..errors import ContextError
from ..resolution import Resolution
from .common import add_policy_arguments, context_error, fail, load_from_args

__all__ = ["context_from_args", "register"]


def register(sub: Any) -> None:
    """Add ``resolve`` and ``explain``."""
    for name, summary in (
        ("resolve", "resolve one serving context: values, deciding rules, errors"),
        ("explain", "resolve one serving context and print every step of the decision"),
    ):
        parser = sub.add_parser(name, help=summary, description=summary)
        add_context_arguments(parser)
        add_policy_arguments(parser)
        parser.add_argument("--format", choices=("text", "json"), default="text")
        parser.set_defaults(run=run, explain=name == "explain")


def add_context_arguments(parser: argparse.ArgumentParser) -> None:
    """The context options shared by resolve and explain."""
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--model", metavar="CONFIG_JSON", help="a Hugging Face config.json (or its folder)")
    model.add_argument("--arch", metavar="NAME", help="the checkpoint's architectures[0], e.g. LlamaForCausalLM")
    parser.add_argument(
        "--backend",
        default="DEFAULT",
        metavar="B",
        help="DEFAULT (the default), NIXL, UCX, MPI, MOONCAKE, or null (disaggregation off)",
    )
    parser.add_argument("--runtime", default="auto", metavar="R", help="auto (the default), PYTHON, CPP or null")
    parser.add_argument("--kv-cache-manager", default="auto", metavar="M", help="auto (the default), V1 or V2")
    parser.add_argument(
        "--timeout-ms", default="60000", metavar="N|null", help="kv_transfer_timeout_ms (default 60000)"
    )
    parser.add_argument("--feature", action="append", default=[], metavar="F", help="a feature flag (repeatable)")
    parser.add_argument(
        "--pipelined", action="store_true", help="enable_pipelined_transfer = true"
    )
    parser.add_argument("--env", action="append", default=[], metavar="K=V", help="an environment variable (repeatable)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a serving config (YAML or JSON, any layout TensorRT-LLM reads): resolve each of its servers "
        "(--arch/--model name the architecture when the config's model path cannot be read)",
    )


def _nullable(text: str) -> str | None:
    return None if text.lower() in {"null", "none"} else text


def context_from_args(args: Any) -> dict[str, Any]:
    """The ``resolve`` fields the arguments describe; raises ValueError for unusable input."""
    fields: dict[str, Any] = {
        "backend": _nullable(args.backend),
        "transceiver_runtime": _nullable(args.runtime),
        "kv_cache_manager": args.kv_cache_manager,
        "features": set(args.feature),
    }
    if args.pipelined:
        fields["enable_pipelined_transfer"] = True
    timeout = _nullable(args.timeout_ms)
    if timeout is None:
        fields["kv_transfer_timeout_ms"] = None
    else:
        try:
            fields["kv_transfer_timeout_ms"] = int(timeout)
        except ValueError:
            raise ValueError(f"--timeout-ms: expected a number of milliseconds or null, got {timeout!r}") from None
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env: expected KEY=VALUE, got {item!r}")
        env[key] = value
    fields["env"] = env
    if args.arch:
        fields["architecture"] = args.arch
    elif args.model:
        fields["pretrained_config"] = read_model_config(Path(args.model))
    return fields


def read_model_config(path: Path) -> dict[str, Any]:
    """Read a Hugging Face ``config.json`` (or the one in a checkpoint folder)."""
    if path.is_dir():
        path = path / "config.json"
    from ..configfile import ConfigFileError, parse_json
    from ..errors import PolicyError
    from ..policyfile import _read_capped

    try:  # as every config is read: regular files only, size-capped, bounded depth, no duplicate keys
        data = parse_json(_read_capped(path, str(path), 4 << 20, "model configs").decode("utf-8", "replace"), str(path))
    except PolicyError as exc:
        raise ValueError(f"--model: {exc.problems[0]}") from None
    except ConfigFileError as exc:
        raise ValueError(f"--model: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--model: {path}: expected a JSON object with `architectures`")
    return {"architectures": data.get("architectures"), "model_type": data.get("model_type")}


def run(args: Any) -> int:
    """Resolve (and explain) one context, or every server of a serving config."""
    policy_set = load_from_args(args)
    if isinstance(policy_set, int):
        return policy_set
    if args.config:
        return _run_config(args, policy_set)
    try:
        resolution = policy_set.resolve(**context_from_args(args))
    except ContextError as exc:
        return context_error(exc)
    except ValueError as exc:
        return fail(str(exc))
    notes = policy_set.notes(resolution.context)
    if args.format == "json":
        data = resolution.to_dict()
        if args.explain:
            data["trace"] = [step._asdict() for step in resolution.trace]
        if notes:
            data["notes"] = notes
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        text = render(resolution, explain=args.explain)
        if notes:
            text += "\n" + "\n".join(f"note: {note}" for note in notes)
        print(text)
    return 0 if resolution.ok else 1


def _run_config(args: Any, policy_set: Any) -> int:
    """``resolve --config``: every server the config starts, each resolved as TensorRT-LLM reads it."""
    from ..configfile import ConfigFileError, read_config
    from ..impact import _from_checkpoint
    from ..serving import servers_of

    path = Path(args.config)
    try:
        document, _ = read_config(path)
    except ConfigFileError as exc:
        return fail(str(exc))
    servers = servers_of(document) if isinstance(document, dict) else None
    if not servers:
        return fail(f"{path}: no cache_transceiver_config in any layout TensorRT-LLM reads: nothing to resolve")
    architecture: dict[str, Any] = {}
    if args.arch:
        architecture = {"architecture": args.arch}
    elif args.model:
        try:
            architecture = {"pretrained_config": read_model_config(Path(args.model))}
        except ValueError as exc:
            return fail(str(exc))
    elif isinstance(document.get("model"), str):
        found = _from_checkpoint(document["model"], None, path.parent)
        if found is not None and not hasattr(found, "message"):
            name, model_type, _ = found
            architecture = {"pretrained_config": {"architectures": [name], "model_type": model_type}}
    failing = False
    out: list[Any] = []
    for server in servers:
        where = ".".join(map(str, server.keys))
        if server.problems:
            return fail("; ".join(f"{path}: {p.message}" for p in server.problems))
        if server.fixed is not None:
            out.append((server, None, server.fixed))
            continue
        if server.fields is None:
            out.append((server, None, f"no cache_transceiver_config at {where}: disaggregation off"))
            continue
        try:
            resolution = policy_set.resolve(**{**server.fields, **architecture})
        except ContextError as exc:
            return context_error(exc)
        failing = failing or not resolution.ok
        out.append((server, resolution, None))
    if args.format == "json":
        print(json.dumps(
            [{"server": s.name, "used": list(s.used), **({"resolution": r.to_dict()} if r else {"not_resolved": why})}
             for s, r, why in out],
            indent=2, sort_keys=True,
        ))
    else:
        blocks = []
        for server, resolution, why in out:
            head = f"== {server.name} ({path}) =="
            read = f"read: {'; '.join(server.used)}" if server.used else "read: nothing"
            body = why if resolution is None else render(resolution, explain=args.explain)
            blocks.append("\n".join((head, read, body)))
        print("\n\n".join(blocks))
    return 1 if failing else 0


def describe_context(resolution: Resolution) -> str:
    """The context on one line."""
    ctx = resolution.context
    parts = [ctx.get("architecture") or "no architecture (no preference)"]
    if ctx.get("model_type"):
        parts.append(f"model_type {ctx['model_type']}")
    parts.append(f"backend {ctx.get('backend') or 'null'}")
    parts.append(f"runtime {ctx.get('transceiver_runtime')}")
    if ctx.get("kv_cache_manager") not in (None, "auto"):
        parts.append(f"kv_cache_manager {ctx['kv_cache_manager']}")
    timeout = ctx.get("kv_transfer_timeout_ms")
    parts.append("timeout null" if timeout is None else f"timeout {timeout} ms")
    if ctx.get("features"):
        parts.append("features " + ",".join(sorted(ctx["features"])))
    return ", ".join(parts)


def render(resolution: Resolution, *, explain: bool = False) -> str:
    """The text a person reads: the values, the deciding rules, the diagnostics."""
    lines = [
        f"policy {resolution.policy_version} (sha256 {resolution.policy_digest[:12]})",
        f"context: {describe_context(resolution)}",
    ]
    if not resolution.enabled:
        lines.append("disaggregation is off (backend null): nothing to resolve")
        return "\n".join(lines)
    lines.append("")
    width = max(len(name) for name in resolution.values)
    for name, value in resolution.values.items():
        lines.append(f"  {name:<{width}}  {value:<7} {resolution.decided_by[name]}")
    if resolution.diagnostics:
        lines.append("")
        for diagnostic in resolution.diagnostics:
            lines.append(f"{diagnostic.severity}[{diagnostic.id}]: {diagnostic.message}")
            lines.append(f"  --> {diagnostic.location}")
    if explain:
        lines += ["", "trace:", str(resolution.trace)]
    lines.append("")
    errors = len(resolution.errors)
    lines.append("ok: this configuration can start" if not errors else f"{errors} error(s): this configuration cannot start")
    return "\n".join(lines)
