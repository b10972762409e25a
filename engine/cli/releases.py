"""Naming a TensorRT-LLM release on the command line (``--trtllm v1.3.0rc25``), the installed
release as resolve's default, and ``kvpolicy releases``: which policy version reproduces which release.

The mapping itself lives in :mod:`kvpolicy.read.releases`; this module only parses and formats.
"""

from __future__ import annotations

import json

from ..errors import PolicyError
from ..evaluate.policyset import PolicySet, load
from .common import fail, load_from_args

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

    from ..read.policyroot import PolicySource
    from ..read.releases import Release

__all__ = ["add_trtllm_argument", "load_for_release", "register", "release_lines", "run"]

_FOOTER = "`kvpolicy releases` lists every release with its evidence"


def register(sub: Any) -> None:
    """Add ``releases``."""
    summary = "list TensorRT-LLM releases and the policy version that reproduces each"
    parser = sub.add_parser("releases", help=summary, description=summary + " (with how sure the mapping is).")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run)


def add_trtllm_argument(parser: Any, what: str) -> None:
    """``--trtllm VERSION``; ``what`` ends the help text (what the release's policy version is used as)."""
    parser.add_argument(
        "--trtllm",
        metavar="VERSION",
        help=f"a TensorRT-LLM release (v1.3.0rc25, 1.3.0rc25): {what} (`kvpolicy releases` lists them)",
    )


def run(args: Any) -> int:
    """Print the release table: tag, date, policy version, certainty (JSON: every field)."""
    from ..read.releases import RELEASES_FILE, installed_trtllm, normalise_tag, releases

    try:
        rows = releases()
    except PolicyError as exc:
        return fail(str(exc))
    installed = installed_trtllm()
    tag = normalise_tag(installed) if installed else None
    if args.format == "json":
        print(json.dumps({
            "installed": installed,
            "releases": [{**row.to_dict(), "installed": row.tag == tag} for row in rows],
        }, indent=2))
        return 0
    print(f"TensorRT-LLM releases and the policy version that reproduces each ({RELEASES_FILE.name}, shipped with kvpolicy)\n")
    table = [("tag", "date", "policy", "certainty")] + [
        (("*" if row.tag == tag else " ") + row.tag, row.date, row.policy_version or "none", row.certainty) for row in rows
    ]
    widths = [max(len(cells[i]) for cells in table) for i in range(4)]
    table[0] = (" " + table[0][0], *table[0][1:])
    for cells in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip())
    print()
    if installed:
        print(f"* installed: tensorrt_llm {installed}" + ("" if tag in {row.tag for row in rows} else " (not in the table)"))
    print("none: no policy version models the release; --format json gives every row's source and note (what it has, why none)")
    return 0


def _describe(row: Release) -> str:
    date = "date unknown" if row.date == "unknown" else row.date
    return f"policy {row.policy_version} ({row.certainty} certainty, {date}; {_FOOTER})"


def load_for_release(args: Any, source: PolicySource) -> tuple[PolicySet, str | None, dict[str, Any] | None] | int:
    """``resolve``/``explain``: the policy set of ``--version``, else of ``--trtllm``'s release, else of
    the installed TensorRT-LLM's release, else the newest; with the line that says a release chose it
    and the same as JSON data (None when no release was involved). Exit code 2 after saying why
    ``--trtllm`` names no usable version (an explicit choice is never replaced by a guess)."""
    from ..read.releases import ReleaseError, installed_trtllm, policy_version_for

    given = getattr(args, "trtllm", None)
    if given is not None:
        if args.policy_version is not None:
            return fail("--trtllm and --version both pick the policy version: give one of them")
        try:
            row = policy_version_for(given)
        except ReleaseError as exc:
            return fail(f"--trtllm {given}: {exc}")
        except PolicyError as exc:
            return fail(str(exc))
        loaded = _load_version(source, row.policy_version)
        if isinstance(loaded, str):
            return fail(f"--trtllm {given}: TensorRT-LLM {row.tag} is reproduced by policy {row.policy_version}, but {loaded}")
        return loaded, f"TensorRT-LLM {row.tag}: {_describe(row)}", {"given": given, "installed": False, "release": row.to_dict()}
    installed = None
    if args.policy_version is None and (source.path is None or source.path.is_dir()):
        installed = installed_trtllm()
    if installed is None:
        policy_set = load_from_args(args, source)
        return policy_set if isinstance(policy_set, int) else (policy_set, None, None)
    # The installed release picks the default: a guess about a choice the user did not make, so what
    # cannot be used falls back to the newest version, with a warning, instead of failing.
    warning = None
    data: dict[str, Any] = {"given": installed, "installed": True, "release": None}
    try:
        row = policy_version_for(installed)
    except ReleaseError as exc:
        row = None
        data["release"] = exc.release.to_dict() if exc.release is not None else None
        warning = str(exc) if exc.release is not None else f"kvpolicy's release table does not list it ({_FOOTER})"
    except PolicyError as exc:
        row = None
        warning = str(exc)
    if row is not None:
        data["release"] = row.to_dict()
        loaded = _load_version(source, row.policy_version)
        if not isinstance(loaded, str):
            return loaded, f"TensorRT-LLM {installed} installed: {_describe(row)}; --version V or --trtllm T picks another", data
        warning = f"it is policy {row.policy_version}, but {loaded}"
    policy_set = load_from_args(args, source)
    if isinstance(policy_set, int):
        return policy_set
    data["warning"] = warning
    return policy_set, f"warning: TensorRT-LLM {installed} installed: {warning}; using the newest policy, {policy_set.version}", data


def _load_version(source: PolicySource, version: str | None) -> PolicySet | str:
    """The policy set of ``version`` in the chosen policies, or why not."""
    try:
        return load(source.path, version=version)
    except PolicyError as exc:
        where = "the shipped policies" if source.path is None else f"the policies in {source.shown}"
        if len(exc.problems) == 1 and exc.problems[0].message.startswith(f"no policy version {version};"):
            return f"{where} hold no such version ({exc.problems[0].message.split('; ', 1)[1]}); pick one with --version V"
        return str(exc)


def release_lines(*options: tuple[str, str | None]) -> list[str]:
    """For ``impact`` and ``report``: one line per option (``("--to", "v1.3.0rc25")``) whose value is
    a TensorRT-LLM release, saying which policy version it stands for and how surely."""
    from ..read.releases import ReleaseError, normalise_tag, policy_version_for

    lines = []
    for option, text in options:
        if text is None or normalise_tag(text) is None:
            continue
        try:
            row = policy_version_for(text)
        except (ReleaseError, PolicyError):
            continue  # the command has already reported it
        lines.append(f"{option} {text}: TensorRT-LLM {row.tag} is {_describe(row)}")
    return lines
