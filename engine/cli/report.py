"""``kvpolicy report``: one self-contained HTML page with the decision matrix, the history, the
diff between two versions and, with ``--configs``, the impact on serving configs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import PolicyError
from ..evaluate.policyset import PolicySet, load
from .common import POLICIES_DEFAULT, add_model_arguments, choose_policies, fail, model_options
from ..wording import plural
from .policies import load_policy_argument
from ..read.releases import UnmodelledRelease
from .releases import add_accept_argument, add_trtllm_argument, release_lines, unmodelled

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    """Add ``report``."""
    summary = "write one self-contained HTML page: decision matrix, history, diff and impact"
    parser = sub.add_parser("report", help=summary, description=summary + ".")
    parser.add_argument(
        "--from",
        dest="old",
        metavar="OLD",
        help="the version to compare with: a version id of --policy, a TensorRT-LLM release (v1.3.0rc24), "
        "a policy file, a folder or FOLDER@VERSION "
        "(default: the version before --to in its folder; 'none': no comparison)",
    )
    to = parser.add_mutually_exclusive_group()
    to.add_argument("--to", dest="new", metavar="NEW", help="the version to show: the same forms (default: the newest version of --policy)")
    add_trtllm_argument(to, "--to its policy version")
    add_accept_argument(parser)
    parser.add_argument("--policy", metavar="DIR", help=f"the policy folder version ids are looked up in ({POLICIES_DEFAULT})")
    parser.add_argument("--configs", nargs="+", metavar="PATH", help="serving config files or folders for the impact table")
    add_model_arguments(parser)
    parser.add_argument(
        "--link-base",
        metavar="URL",
        help="prefix for links to config files, e.g. https://github.com/ORG/REPO/blob/SHA/ (default: paths relative to the output file)",
    )
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write ('-': stdout)")
    parser.set_defaults(run=run)


def _siblings(policy_set: PolicySet) -> list[PolicySet] | str:
    """Every version beside ``policy_set`` in its folder, oldest first."""
    folder = Path(policy_set.path).parent
    found = []
    for version in policy_set.versions():
        if version == policy_set.version:
            found.append(policy_set)
            continue
        try:
            found.append(load(folder, version=version))
        except PolicyError as exc:
            return str(exc)
    return found


def run(args: Any) -> int:
    """Load the versions, resolve, render, write."""
    from ..report.page import ReportInput, render_report

    problem = _unwritable(args.output)
    if problem:  # before minutes of work, not after
        return fail(f"-o: cannot write {args.output}: {problem}")
    source = choose_policies(args.policy)
    if isinstance(source, int):
        return source
    new_option, new_text = ("--to", args.new) if args.trtllm is None else ("--trtllm", args.trtllm)
    try:
        new = load_policy_argument(new_text, source.path, accept_unmodelled=args.accept_unmodelled) if new_text else _newest(source.path)
    except UnmodelledRelease as exc:
        return unmodelled(exc, new_option)
    if isinstance(new, str):
        return fail(f"{new_option}: {new}")
    versions = _siblings(new)
    if isinstance(versions, str):
        return fail(f"--to: a version beside it does not load: {versions}")
    old: PolicySet | None
    if args.old is None:
        earlier = [v for v in versions if v.version != new.version and versions.index(v) < _position(versions, new)]
        old = earlier[-1] if earlier else None
    elif args.old.lower() == "none":
        old = None
    else:
        try:
            loaded = load_policy_argument(args.old, source.path, accept_unmodelled=args.accept_unmodelled)
        except UnmodelledRelease as exc:
            return unmodelled(exc, "--from")
        if isinstance(loaded, str):
            return fail(f"--from: {loaded}")
        old = loaded
    impact: list[Any] | None = None
    if args.configs:
        if old is None:
            return fail("--configs needs a version to compare with: pass --from OLD")
        found = _impact(args, old, new)
        if isinstance(found, int):
            return found
        impact = found
    output = args.output
    link = _linker(args.link_base, None if output == "-" else Path(output).parent)
    from .. import __version__

    # Paths show relative to where the command runs (the repository, in CI); the full path on hover.
    page = render_report(ReportInput(versions, new, old, impact, link, f"kvpolicy {__version__}", root=os.getcwd()))
    if output == "-":
        print(page, end="")
        return 0
    try:
        Path(output).write_text(page, encoding="utf-8")
    except OSError as exc:
        return fail(f"-o: cannot write {output}: {exc.strerror or exc}")
    size = len(page.encode("utf-8"))
    compared = f"{old.version} -> {new.version}" if old is not None else new.version
    print(source.describe())
    for line in release_lines(("--from", args.old), (new_option, new_text)):
        print(line)
    print(f"kvpolicy report {compared}: wrote {output} ({size / 1024:,.0f} KiB, {plural(len(versions), 'version')})")
    return 0


def _unwritable(output: str) -> str:
    """Why ``output`` cannot be written (its folder is missing or not writable, it is a folder), or ''."""
    if output == "-":
        return ""
    path = Path(output)
    folder = path.parent
    if not folder.is_dir():
        return f"no such folder {folder}; create it first"
    if path.is_dir():
        return "it is a folder; name a file"
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "permission denied"
    return ""


def _newest(folder: Path | None) -> PolicySet | str:
    try:
        return load(folder)
    except PolicyError as exc:
        return str(exc)


def _position(versions: list[PolicySet], new: PolicySet) -> int:
    return next(i for i, v in enumerate(versions) if v is new)


def _impact(args: Any, old: PolicySet, new: PolicySet) -> list[Any] | int:
    from ..analyse.impact import impact_of

    arch_map = model_options(args, old.architectures | new.architectures)
    if isinstance(arch_map, int):
        return arch_map
    missing = [p for p in args.configs if not Path(p).exists()]
    if len(missing) == len(args.configs):
        return fail(f"--configs: no such file or folder: {', '.join(missing)}")
    results = impact_of(args.configs, old, new, models_root=args.models_root, architecture_map=arch_map)
    if arch_map is not None:  # the map may live beside the configs; it is not one of them
        mapped = Path(arch_map.path).resolve()
        results = [r for r in results if Path(r.path).resolve() != mapped]
    return results


def _linker(base: str | None, folder: Path | None) -> Any:
    """``link(path, line)``: the href of a config file and line."""

    def link(path: str, line: int | None) -> str:
        if base:
            target = base.rstrip("/") + "/" + Path(os.path.relpath(path)).as_posix()
        elif folder is not None:
            target = Path(os.path.relpath(Path(path).resolve(), folder.resolve())).as_posix()
        else:
            target = Path(path).as_posix()
        return target + (f"#L{line}" if line else "")

    return link
