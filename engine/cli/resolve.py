"""``kvpolicy resolve`` and ``kvpolicy explain``: one context, its values, why, and what is wrong."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ContextError
from ..evaluate.resolution import Resolution
from ..wording import plural
from .common import EXIT_UNMODELLED, add_model_arguments, add_policy_arguments, choose_policies, context_error, fail, model_options
from .releases import add_accept_argument, add_trtllm_argument, load_for_release

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

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
        add_trtllm_argument(parser, "use the policy version that reproduces it (not with --version; default: the installed tensorrt_llm's)")
        add_accept_argument(parser)
        parser.add_argument(
            "--verify-installed",
            action="store_true",
            help="compare the installed tensorrt_llm's source with the chosen version first (kvpolicy upstream check "
            "--installed, cached by the package's RECORD); drift exits 4 unless --accept-unmodelled",
        )
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
    parser.add_argument("--runtime", metavar="R", help="auto, PYTHON, CPP or null (left out: what the config's field defaults to, auto until TensorRT-LLM 1.4)")
    parser.add_argument("--kv-cache-manager", metavar="M", help="auto, V1 or V2 (left out: the field's default in the version, auto until 1.4)")
    parser.add_argument("--timeout-ms", default="60000", metavar="N|null", help="kv_transfer_timeout_ms (default 60000)")
    parser.add_argument("--feature", action="append", default=[], metavar="F", help="a feature flag (repeatable)")
    parser.add_argument("--pipelined", action="store_true", help="enable_pipelined_transfer = true")
    parser.add_argument("--env", action="append", default=[], metavar="K=V", help="an environment variable (repeatable)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a serving config (YAML or JSON, any layout TensorRT-LLM reads): resolve each of its servers, "
        "the model found as TensorRT-LLM finds it (--arch/--model name it instead)",
    )
    add_model_arguments(parser, scope="with --config: ")


def _nullable(text: str) -> str | None:
    return None if text.lower() in {"null", "none"} else text


def context_from_args(args: Any) -> dict[str, Any]:
    """The ``resolve`` fields the arguments describe; raises ValueError for unusable input."""
    fields: dict[str, Any] = {"backend": _nullable(args.backend), "features": set(args.feature)}
    # Left out, a field requests what the policy version says the config's field defaults to.
    if args.runtime is not None:
        fields["transceiver_runtime"] = _nullable(args.runtime)
    if args.kv_cache_manager is not None:
        fields["kv_cache_manager"] = args.kv_cache_manager
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


def model_identity(path: Path) -> Any:
    """The :class:`kvpolicy.serving.identity.ModelIdentity` a ``--model`` config.json (or checkpoint folder)
    names, read as every checkpoint is (:func:`kvpolicy.serving.identity.read_checkpoint`); ValueError if unusable."""
    from ..serving.identity import ModelIdentity, read_checkpoint

    config = path / "config.json" if path.is_dir() else path
    read = read_checkpoint(config)
    if isinstance(read, str):
        raise ValueError(f"--model: {read}")
    architecture, model_type, composite = read
    return ModelIdentity(architecture, model_type, "--model", str(config), multimodal=composite)


def read_model_config(path: Path) -> dict[str, Any]:
    """The ``pretrained_config`` of a Hugging Face ``config.json`` (or the one in a checkpoint folder)."""
    identity = model_identity(path)
    return identity.pretrained_config() or {"architectures": None, "model_type": identity.model_type}


def _near_miss(name: str, policy_set: Any, what: str) -> str | None:
    """An error message when ``name`` looks like a typo of an architecture the policy names."""
    if name in policy_set.architectures:
        return None
    from ..evaluate.names import near_miss

    close = near_miss(name, policy_set.architectures)
    if close is None:
        return None
    return (
        f"{what} {name!r}: policy {policy_set.version} names no such architecture; did you mean {close!r}? "
        "(a misspelt name resolves as a model with no preference)"
    )


def run(args: Any) -> int:
    """Resolve (and explain) one context, or every server of a serving config."""
    source = choose_policies(args.policy)
    if isinstance(source, int):
        return source
    chosen = load_for_release(args, source)  # --version, --trtllm, the installed TensorRT-LLM's, or the newest
    if isinstance(chosen, int):
        return chosen
    policy_set, release_line, release_data = chosen
    installed_line = None
    if args.verify_installed:
        from ..upstream.installed import check_installed

        checked = check_installed(policy_set)
        if checked is None:
            return fail("--verify-installed: tensorrt_llm is not installed in this environment (`kvpolicy upstream check TREE` reads a checkout)")
        installed_line = checked.line()
        if not checked.matches and not args.accept_unmodelled:
            print(
                f"kvpolicy: error: {installed_line}; the version does not model what is installed: "
                "pass --accept-unmodelled to answer with it anyway, --version V for another, or draft one (kvpolicy upstream draft)",
                file=sys.stderr,
            )
            return EXIT_UNMODELLED
        release_line = "\n".join(filter(None, (release_line, installed_line)))
    if args.arch:
        miss = _near_miss(args.arch, policy_set, "--arch")
        if miss:
            return fail(miss)
    if args.config:
        if args.format == "text":
            print(source.describe())
            if release_line:
                print(release_line)
        return _run_config(args, policy_set)
    if args.models_root or args.arch_map:
        return fail("--models-root and --arch-map name the model of a serving config: use them with --config")
    try:
        resolution = policy_set.resolve(**context_from_args(args))
    except ContextError as exc:
        return context_error(exc)
    except ValueError as exc:
        return fail(str(exc))
    verdict = resolution.verdict()
    notes = policy_set.notes(resolution.context) + _left_out_notes(policy_set, args)
    if args.format == "json":
        data = resolution.to_dict()
        data["ok"] = verdict.status in ("starts", "off")
        data["verdict"] = verdict.to_dict(resolutions=True, explain=args.explain)
        if args.explain:
            data["trace"] = [step._asdict() for step in resolution.trace]
        if notes:
            data["notes"] = notes
        data["policies"] = source.to_dict()
        if release_data:
            data["trtllm"] = release_data
        if installed_line:
            data["installed_check"] = installed_line
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        if verdict.known:
            text = render(resolution, explain=args.explain)
        else:
            text = render_unknown(resolution, verdict, explain=args.explain)
        if notes:
            text += "\n" + "\n".join(f"note: {note}" for note in notes)
        print(source.describe())
        if release_line:
            print(release_line)
        print(text)
    return verdict.exit_code


def _left_out_notes(policy_set: Any, args: Any) -> list[str]:
    """A note for each field left out whose default in this version is not ``auto``."""
    import re

    notes = []
    defaults = policy_set.left_out()
    for name, given, flag in (("transceiver_runtime", args.runtime, "--runtime"), ("kv_cache_manager", args.kv_cache_manager, "--kv-cache-manager")):
        if given is None and name in defaults:
            value, source = defaults[name]
            cited = re.search(r"#\d+", source)
            notes.append(
                f"{name} left out: {value}, the config field's default in policy {policy_set.version}"
                + (f" ({cited.group(0)})" if cited else "")
                + f"; {flag} auto asks the policy to decide"
            )
    return notes


def _run_config(args: Any, policy_set: Any) -> int:
    """``resolve --config``: every server the config starts, each with the model TensorRT-LLM would
    load, and one verdict for the whole config over every model it may be about
    (:mod:`kvpolicy.serving.check`)."""
    from ..serving.identity import ModelIdentity, models_root
    from ..serving.check import ServingConfigError, answer_config, read_line

    path = Path(args.config)
    explicit: ModelIdentity | None = None
    if args.arch:
        explicit = ModelIdentity(args.arch, None, "--arch")
    elif args.model:
        try:
            explicit = model_identity(Path(args.model))
        except ValueError as exc:
            return fail(str(exc))
    arch_map = model_options(args, policy_set.architectures)
    if isinstance(arch_map, int):
        return arch_map
    try:
        answer = answer_config(path, policy_set, explicit=explicit, root=models_root(args.models_root), architecture_map=arch_map)
    except ServingConfigError as exc:
        return fail("\n  ".join(exc.problems) if len(exc.problems) > 1 else exc.problems[0])
    rows = [(a.server, a.identity, a.resolution, a.not_resolved) for a in answer.servers]
    verdict = answer.verdict
    if args.format == "json":
        print(json.dumps(answer.to_dict(explain=args.explain), indent=2, sort_keys=True))
    else:
        blocks = []
        side = 0  # the resolved servers are the verdict's sides, in order
        for server, identity, resolution, why in rows:

            def where(diagnostic: Any, server: Any = server) -> str:
                at, keys = answer.field_location(server, diagnostic.decision)
                return f"config: {at}: {keys}"

            lines = [f"== {server.name} ({answer.field_location(server, None)[0]}) =="]
            if identity is not None:
                lines.append(f"model: {identity.describe()}")
            lines.append(read_line(server.used, policy_set.env_names()))
            if resolution is None:
                lines.append(why or "")
            elif verdict is not None and not verdict.known and not resolution.architecture_known:
                lines.append(_render_side_outcomes(verdict, side, where, first=side == 0))
            else:
                lines.append(render(resolution, explain=args.explain, summary=False, where=where))
            side += resolution is not None
            blocks.append("\n".join(lines))
        if verdict is not None:
            tail = []
            for outcome in verdict.outcomes:
                if outcome.problem:
                    tail.append(f"error[sides-disagree]: {outcome.problem}" + ("" if verdict.known else f" (for {', '.join(outcome.labels)})"))
                    tail += ["  config: {}: {}".format(*answer.field_location(server, None)) for server, _, resolution, _ in rows if resolution is not None]
            depends = not verdict.known and verdict.status == "depends on the model"
            tail.append(_summary_by_group(verdict) if depends else _summary_line(verdict))
            if not verdict.known:
                tail.append(_UNKNOWN_HINT)
            blocks.append("\n".join(tail))
        elif any(server.fixed for server, *_ in rows):
            # backend: trt (and the like): disaggregated, on the only transceiver that path has.
            blocks.append("disaggregated on the C++ transceiver (the only one this backend has): nothing for the policy to decide")
        else:
            blocks.append("disaggregation is off on every server: nothing to start")
        print("\n\n".join(blocks))
    return verdict.exit_code if verdict is not None else 0


_UNKNOWN_HINT = (
    "hint: the model's architecture is unknown; put its checkpoint (with config.json) under --models-root or "
    "$LLM_MODELS_ROOT, or name it with --arch-map FILE or --arch NAME"
)
_NAME_IT_HINT = "hint: the model's architecture is unknown; name it with --arch NAME or --model CONFIG_JSON"


def _summary_line(verdict: Any) -> str:
    from ..evaluate.verdict import CANNOT_START, DEPENDS, STARTS

    if verdict.known:
        if verdict.status == STARTS:
            return "ok: this configuration can start"
        if verdict.status == CANNOT_START:
            errors = sum(len(r.errors) for r in verdict.outcomes[0].resolutions) + (1 if verdict.outcomes[0].problem else 0)
            return f"{plural(errors, 'error')}: this configuration cannot start"
        return verdict.summary()
    if verdict.status == DEPENDS:
        return f"{verdict.summary()} (exit 3)"
    return verdict.summary()


def _summary_by_group(verdict: Any) -> str:
    """The verdict of a config whose model is unknown, by the numbered groups printed above (their
    models are listed there once)."""
    parts: dict[str, list[str]] = {"cannot start": [], "starts": []}
    for number, outcome in enumerate(verdict.outcomes, 1):
        parts["starts" if outcome.ok else "cannot start"].append(f"[{number}] ({plural(len(outcome.labels), 'model')})")
    said = "; ".join(f"{state} for {', '.join(groups)}" for state, groups in parts.items() if groups)
    return f"depends on the model: {said} (exit 3)"


def _render_side_outcomes(verdict: Any, side: int, where: Any = None, *, first: bool = True) -> str:
    """One side of a config with an unknown architecture: each outcome's values and errors. The
    groups are the same on every side: the first side lists each group's models, later ones refer to
    them by number (a list of 30 names is printed once, not once per side and again in the verdict)."""
    lines = []
    for number, outcome in enumerate(verdict.outcomes, 1):
        resolution = outcome.resolutions[side]
        state = "starts" if outcome.ok else "cannot start"
        models = ", ".join(outcome.labels) if first else f"the models of [{number}] above"
        lines.append(f"[{number}] {state} for {models}:")
        lines.append(_values_block(resolution, indent="    ", where=where, group=outcome.labels))
    return "\n".join(lines)


def render_unknown(resolution: Resolution, verdict: Any, *, explain: bool = False) -> str:
    """A context with an unknown architecture: the resolution of each class of models that
    resolves alike, then what is true for every one of them."""
    lines = _head(resolution)
    if not resolution.enabled:
        return "\n".join(lines)
    lines += ["", f"the architecture is unknown: resolved for every model policy {resolution.policy_version} tells apart", ""]
    for number, outcome in enumerate(verdict.outcomes, 1):
        state = "starts" if outcome.ok else "cannot start"
        lines.append(f"[{number}] {state} for {', '.join(outcome.labels)}:")
        lines.append(_values_block(outcome.resolution, indent="    ", group=outcome.labels))
        if explain:
            lines += ["    trace:", "\n".join("    " + line for line in str(outcome.resolution.trace).splitlines())]
        lines.append("")
    lines.append(_summary_line(verdict))
    if verdict.status != "starts":
        lines.append(_NAME_IT_HINT)
    return "\n".join(lines)


def _values_block(resolution: Resolution, *, indent: str = "  ", where: Any = None, group: Any = None) -> str:
    """The values, deciding rules and non-info diagnostics; ``where(diagnostic)``, when given, is a
    line saying where in a serving config the diagnostic points (``config: FILE:LINE:COL: KEY``).
    ``group``: the models this resolution stands for (an unknown architecture's group); a rule of one
    model's row is then named for the family with its example (``runtime-preference[per model, e.g.
    DeepseekV32ForCausalLM]``): the resolution shown is one member's, and each other member is
    decided by its own rule (its values are the same)."""
    if not resolution.enabled:
        return f"{indent}disaggregation is off (backend null)"
    lines = []
    width = max(len(name) for name in resolution.values)
    for name, value in resolution.values.items():
        rule = resolution.decided_by[name]
        if group is not None and len(group) > 1 and rule.endswith("]") and "[" in rule:
            rule = f"{rule[: rule.index('[')]}[per model, e.g. {rule[rule.index('[') + 1 : -1]}]"
        lines.append(f"{indent}{name:<{width}}  {value:<7} {rule}")
    for diagnostic in resolution.diagnostics:
        if diagnostic.severity != "info":
            lines.append(f"{indent}{diagnostic.severity}[{diagnostic.id}]: {diagnostic.message}")
            if where is not None:
                lines.append(f"{indent}  {where(diagnostic)}")
    return "\n".join(lines)


def describe_context(resolution: Resolution) -> str:
    """The context on one line."""
    ctx = resolution.context
    parts = [ctx.get("architecture") or "architecture unknown"]
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


def _head(resolution: Resolution) -> list[str]:
    """The policy and the context; the end of it when disaggregation is off."""
    lines = [
        f"policy {resolution.policy_version} (sha256 {resolution.policy_digest[:12]})",
        f"context: {describe_context(resolution)}",
    ]
    if not resolution.enabled:
        lines.append("disaggregation is off (backend null): nothing to resolve")
    return lines


def render(resolution: Resolution, *, explain: bool = False, summary: bool = True, where: Any = None) -> str:
    """The text a person reads: the values, the deciding rules, the diagnostics (with
    ``where(diagnostic)``, when given, under each error and warning: where a serving config sets
    what it is about)."""
    lines = _head(resolution)
    if not resolution.enabled:
        return "\n".join(lines)
    lines.append("")
    width = max(len(name) for name in resolution.values)
    for name, value in resolution.values.items():
        lines.append(f"  {name:<{width}}  {value:<7} {resolution.decided_by[name]}")
    if resolution.diagnostics:
        lines.append("")
        for diagnostic in resolution.diagnostics:
            lines.append(f"{diagnostic.severity}[{diagnostic.id}]: {diagnostic.message}")
            if where is not None and diagnostic.severity != "info":
                lines.append(f"  {where(diagnostic)}")
            lines.append(f"  --> {diagnostic.location}")
    if explain:
        lines += ["", "trace:", str(resolution.trace)]
    if summary:
        lines.append("")
        errors = len(resolution.errors)
        lines.append("ok: this configuration can start" if not errors else f"{plural(errors, 'error')}: this configuration cannot start")
    return "\n".join(lines)
