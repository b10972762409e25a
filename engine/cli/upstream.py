"""``kvpolicy upstream check`` and ``kvpolicy upstream draft``: a policy version against TensorRT-LLM's source.

``check TREE`` (or ``--installed``) reports what differs between the tree and a policy version: exit
0 no drift, 1 drift, 2 bad input. ``draft TREE`` writes the next version from the newest one plus
what the tree states outright, with ``TODO(kvpolicy new)`` marks where a person must read code.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from pathlib import Path

from .common import add_policy_arguments, choose_policies, fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["register", "run_check", "run_draft"]

_VERSION = re.compile(r"^\d{4}\.\d{2}\.\d{2}(\.\d{1,3})?$")


def register(sub: Any) -> None:
    """Add ``upstream`` with its ``check`` and ``draft`` subcommands."""
    summary = "compare policy versions with TensorRT-LLM's own source (drift), and draft the next version"
    parser = sub.add_parser("upstream", help=summary, description=summary + ". The tree is read with Python's ast, never imported.")
    inner = parser.add_subparsers(dest="upstream_command", metavar="{check,draft}", required=True)

    check = inner.add_parser(
        "check",
        help="what differs between a TensorRT-LLM tree and a policy version",
        description="Rows missing, extra or different; config fields added or removed; environment names; "
        "checkpoint rewrites; rule-bearing functions whose fingerprint moved. Exit codes: 0 no drift, 1 drift, 2 bad input.",
    )
    check.add_argument("tree", nargs="?", metavar="TREE", help="a TensorRT-LLM checkout or source tree (the folder holding tensorrt_llm/)")
    check.add_argument("--installed", action="store_true", help="read the installed tensorrt_llm package's files instead of TREE")
    add_policy_arguments(check)
    check.add_argument("--format", choices=("text", "json", "github", "sarif"), default="text")
    check.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE (the summary line still goes to stderr)")
    check.set_defaults(run=run_check)

    draft = inner.add_parser(
        "draft",
        help="write the next policy version from the newest one plus what a TensorRT-LLM tree states",
        description="Rows are drafted with their source from git (the commit, its date, the PR of its subject) when TREE "
        "is a checkout; logic that changed is marked TODO(kvpolicy new) for a person (kvpolicy check refuses it until read).",
    )
    draft.add_argument("tree", metavar="TREE", help="a TensorRT-LLM checkout or source tree")
    draft.add_argument("--dir", metavar="DIR", help="the policy folder to add the version to (default: the chosen policies' folder)")
    draft.add_argument("--from", dest="base", metavar="V", help="the version to start from (default: the newest)")
    draft.add_argument(
        "--as", dest="new_version", metavar="VERSION", help="the new version's id, YYYY.MM.DD[.N] (default: the tree's HEAD commit date, else today)"
    )
    draft.set_defaults(run=run_draft)


def _tree(args: Any):
    from ..upstream.source import TreeError, installed_tree, open_tree

    try:
        if getattr(args, "installed", False):
            if args.tree:
                return fail("give TREE or --installed, not both")
            return installed_tree()
        if not args.tree:
            return fail("name a TensorRT-LLM tree (TREE), or pass --installed")
        return open_tree(args.tree)
    except TreeError as exc:
        return fail(str(exc))


def _choose(tree: Any, path: Any, version: str | None):
    """The policy set to compare with, and why that version (the tree's release, else the newest)."""
    from ..errors import PolicyError
    from ..evaluate.policyset import load
    from ..read.releases import ReleaseError, policy_version_for

    try:
        if version is not None:
            return load(path, version=version), "--version"
        if tree.release:
            try:
                row = policy_version_for(tree.release)
            except ReleaseError as exc:
                return load(path), f"the newest: TensorRT-LLM {tree.release} maps to no version ({str(exc).split(';')[0]})"
            try:
                return load(path, version=row.policy_version), f"TensorRT-LLM {tree.release} maps to it"
            except PolicyError:
                return load(path), f"the newest: TensorRT-LLM {tree.release} maps to {row.policy_version}, which this folder lacks"
        return load(path), "the newest: the tree names no release"
    except PolicyError as exc:
        return fail(str(exc))


def run_check(args: Any) -> int:
    from ..upstream.drift import compare
    from ..upstream.extract import extract
    from ..upstream.report import CheckResult, render

    tree = _tree(args)
    if isinstance(tree, int):
        return tree
    source = choose_policies(args.policy)
    if isinstance(source, int):
        return source
    chosen = _choose(tree, source.path, args.policy_version)
    if isinstance(chosen, int):
        return chosen
    policies, why = chosen
    facts = extract(tree)
    drift = compare(facts, policies.policy)
    shown = str(tree.root) if not args.installed else f"installed tensorrt_llm ({tree.root})"
    result = CheckResult(shown, tree.kind, tree.release, policies.version, policies.path, why, drift, facts)
    report = render(result, args.format)
    summary = f"kvpolicy upstream: {len(drift)} drift against {policies.version}" if drift else f"kvpolicy upstream: no drift against {policies.version}"
    if args.output:
        try:
            Path(args.output).write_text(report, encoding="utf-8")
        except OSError as exc:
            return fail(f"-o {args.output}: {exc.strerror or exc}")
        print(summary, file=sys.stderr)
    else:
        sys.stdout.write(report)
        if args.format != "text":
            print(summary, file=sys.stderr)
    return result.exit_code


def _head(root: Path) -> tuple[str, str | None]:
    """The checkout's HEAD as ``"abbrev date"`` and its commit date as a version id (YYYY.MM.DD);
    ``("", None)`` when git cannot say."""
    try:
        out = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %cs"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "", None
    text = out.stdout.strip()
    match = re.match(r"^\S+ (\d{4})-(\d{2})-(\d{2})$", text)
    return (text, ".".join(match.groups())) if out.returncode == 0 and match else ("", None)


def run_draft(args: Any) -> int:
    from ..errors import PolicyError
    from ..evaluate.policyset import load
    from ..read.loader import CASES_SUFFIX, load_policy_file, version_key
    from ..read.policyfile import read_policy_bytes
    from ..upstream.draft import apply
    from ..upstream.drift import compare
    from ..upstream.extract import extract
    from .author import next_version_text

    tree = _tree(args)
    if isinstance(tree, int):
        return tree
    if args.dir is not None:
        folder = Path(args.dir)
        if not folder.is_dir():
            return fail(f"--dir {args.dir}: not a folder; name the policy folder that holds the versions")
    else:
        source = choose_policies()
        if isinstance(source, int):
            return source
        if source.path is None:
            return fail("no policy folder to add a version to (./policies does not exist); pass --dir DIR")
        folder = Path(source.path)
    try:
        base = load(folder, version=args.base)
        newest = load(folder)
    except PolicyError as exc:
        return fail(str(exc))
    head, head_date = _head(tree.root) if tree.is_git else ("", None)
    version = args.new_version or head_date or datetime.date.today().strftime("%Y.%m.%d")
    if not _VERSION.match(version):
        return fail(f"--as {version!r} is not a version: write a date, YYYY.MM.DD (optionally .N)")
    if version_key(version) <= version_key(newest.version):
        return fail(f"{version} is not after the newest version {newest.version}; pick a later one with --as VERSION")
    target = folder / f"{version}.toml"
    if target.exists():
        return fail(f"{target} already exists")
    facts = extract(tree)
    drift = compare(facts, base.policy)
    read = (
        f"TensorRT-LLM {'checkout' if tree.is_git else tree.kind} {tree.root.name}"
        + (f" at {head}" if head else "")
        + (f" ({tree.release})" if tree.release else "")
    )
    text = read_policy_bytes(Path(base.path), base.path, root=folder).decode("utf-8")
    fresh = next_version_text(text, version)
    if fresh is None:
        return fail(f"{base.path}: no top-level version, summary and source lines to rewrite")
    new_text, left, edits = apply(fresh, facts, drift, root=tree.root, git=tree.is_git, read=read)
    from ..lint.fmt import format_text

    target.write_text(format_text(new_text), encoding="utf-8")
    try:
        load_policy_file(target, root=folder)
    except PolicyError as exc:
        print(f"kvpolicy: warning: the draft does not load yet: {exc}", file=sys.stderr)
    cases = Path(base.path).with_name(Path(base.path).name[: -len(".toml")] + CASES_SUFFIX)
    written = [str(target)]
    if cases.is_file():
        from ..upstream.cases import draft_cases

        cases_text = draft_cases(read_policy_bytes(cases, str(cases), root=folder).decode("utf-8"), Path(base.path).name, target.name, drift)
        cases_target = target.with_name(f"{version}{CASES_SUFFIX}")
        cases_target.write_text(cases_text, encoding="utf-8")
        written.append(str(cases_target))
    print(f"wrote {', '.join(written)} from {Path(base.path).name} and {read}")
    for edit in edits:
        print(f"  {edit}")
    todo = new_text.count("TODO(kvpolicy new)")
    if left:
        print(f"left for a person ({len(left)}):")
        for item in left:
            print(f"  {item.code} {item.kind}: {item.message}")
    print(f"next: replace the {todo} TODO(kvpolicy new) marks (kvpolicy lint lists them), then kvpolicy check {folder}")
    return 0
