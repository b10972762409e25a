"""``kvpolicy impact --configs PATH... --from OLD --to NEW``: what a policy change does to real configs
(the reports themselves are :mod:`kvpolicy.analyse.impactreport`'s)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ..analyse.edit import edit_between
from ..analyse.impact import impact_of
from ..analyse.impactreport import FAIL_ON, FORMATS, gate_line, render_github, render_sarif, render_text, to_json
from ..read.releases import UnmodelledRelease
from .common import POLICIES_DEFAULT, add_model_arguments, choose_policies, fail, model_options, split_outputs
from .policies import load_policy_argument
from .releases import add_accept_argument, add_trtllm_argument, release_lines, unmodelled

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``impact``."""
    summary = "resolve serving configs under two policy versions and report what changes"
    parser = sub.add_parser("impact", help=summary, description=summary + ".")
    parser.add_argument("--configs", nargs="+", required=True, metavar="PATH", help="config files or folders (searched recursively)")
    parser.add_argument(
        "--from", dest="old", required=True, metavar="OLD", help="policy file, folder, version id of --policy, or TensorRT-LLM release (v1.3.0rc24)"
    )
    to = parser.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", dest="new", metavar="NEW", help="the same forms as --from")
    add_trtllm_argument(to, "--to its policy version")
    add_accept_argument(parser)
    parser.add_argument("--policy", metavar="DIR", help=f"the policy folder version ids are looked up in ({POLICIES_DEFAULT})")
    add_model_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="text")
    parser.add_argument(
        "--output",
        "-o",
        metavar="[FORMAT=]FILE",
        action="append",
        default=[],
        help="FILE: write the --format report to FILE instead of stdout; FORMAT=FILE (repeatable): also write "
        "the report in FORMAT to FILE, from the same run (e.g. --format github -o sarif=impact.sarif)",
    )
    parser.add_argument(
        "--fail-on",
        type=_fail_on,
        default="failing",
        metavar="WHEN",
        help="comma-separated: failing (default: a config starts failing or fails differently, or its "
        "model is unknown and some model it may be would start failing), malformed (a config kvpolicy cannot read, "
        "under both versions), still-failing (also configs that fail under both, malformed ones included), "
        "new-warning (also a new warning), unknown (any config whose model was not identified), change (any "
        "change), never",
    )
    parser.set_defaults(run=run)


def _fail_on(value: str) -> str:
    import argparse

    parts = [p.strip() for p in value.split(",") if p.strip()]
    unknown = [p for p in parts if p not in FAIL_ON]
    if not parts or unknown:
        raise argparse.ArgumentTypeError(f"{value!r}: expected one or more of {', '.join(FAIL_ON)} (comma-separated)")
    return ",".join(parts)


def run(args: Any) -> int:
    """Read the configs, resolve them under both versions, report."""
    source = choose_policies(args.policy)
    if isinstance(source, int):
        return source
    new_option, new_text = ("--to", args.new) if args.trtllm is None else ("--trtllm", args.trtllm)
    try:
        old = load_policy_argument(args.old, source.path, accept_unmodelled=args.accept_unmodelled)
        if isinstance(old, str):
            return fail(f"--from: {old}")
        new = load_policy_argument(new_text, source.path, accept_unmodelled=args.accept_unmodelled)
    except UnmodelledRelease as exc:
        return unmodelled(exc, "--from" if exc.given == args.old else new_option)
    if isinstance(new, str):
        return fail(f"{new_option}: {new}")
    arch_map = model_options(args, old.architectures | new.architectures)
    if isinstance(arch_map, int):
        return arch_map
    try:
        import yaml  # noqa: F401  # only whether PyYAML is installed, before any config is read
    except ImportError:
        return fail("reading configs needs PyYAML: pip install pyyaml")
    missing = [p for p in args.configs if not Path(p).exists()]
    if len(missing) == len(args.configs):
        return fail(f"--configs: no such file or folder: {', '.join(missing)}")
    results = impact_of(args.configs, old, new, models_root=args.models_root, architecture_map=arch_map)
    if arch_map is not None:  # the map may live beside the configs; it is not one of them
        results = [r for r in results if not _same_file(r.path, arch_map.path)]
    edit = edit_between(old, new)
    line = gate_line(results, args.fail_on)
    outputs = split_outputs(args.output, FORMATS)
    if isinstance(outputs, str):
        return fail(outputs)
    main_file, extra = outputs

    def report(fmt: str) -> str:
        if fmt == "json":
            body = {"policies": source.to_dict(), "edit": edit.to_dict(), **to_json(results, old.version, new.version)}
            return json.dumps(body, indent=2) + "\n"
        if fmt == "sarif":
            return render_sarif(results, old.version, new.version)
        if fmt == "github":
            text = render_github(results, old.version, new.version, summary_file=os.environ.get("GITHUB_STEP_SUMMARY"))
            return text + "\n" if text else ""
        releases = release_lines(("--from", args.old), (new_option, new_text))
        return "\n".join([source.describe(), *releases, render_text(results, old.version, new.version, edit, old.env_names() | new.env_names()), line]) + "\n"

    for fmt, path in [(args.format, main_file), *extra]:
        if path is None:
            continue
        try:
            Path(path).write_text(report(fmt), encoding="utf-8")
        except OSError as exc:
            return fail(f"cannot write {path}: {exc.strerror or exc}")
    if main_file is None:
        sys.stdout.write(report(args.format))
    if (args.format != "text" or main_file is not None) and line.startswith("gate: fails"):
        print(f"kvpolicy: {line}", file=sys.stderr)
    return 1 if line.startswith("gate: fails") else 0


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False
