"""Naming a TensorRT-LLM release on the command line (``--trtllm v1.3.0rc25``), the installed
release as resolve's default, and ``kvpolicy releases``: which policy version reproduces which release.

The mapping itself lives in :mod:`kvpolicy.read.releases`; this module only parses and formats.
"""

from __future__ import annotations

import json

from ..errors import PolicyError
from ..evaluate.policyset import PolicySet
from .common import EXIT_UNMODELLED, fail

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

    from ..read.policyroot import PolicySource
    from ..read.releases import Release

__all__ = ["add_accept_argument", "add_trtllm_argument", "load_for_release", "register", "release_lines", "run", "unmodelled"]

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


def add_accept_argument(parser: Any) -> None:
    """``--accept-unmodelled``: answer a release no policy version models with the closest one."""
    parser.add_argument(
        "--accept-unmodelled",
        action="store_true",
        help="a TensorRT-LLM release (named or installed) that no policy version models is answered with the closest "
        f"version, with a warning; without it such a release exits {EXIT_UNMODELLED}",
    )


def unmodelled(exc: Any, option: str | None = None) -> int:
    """Report a release no policy version models; exit code :data:`EXIT_UNMODELLED`."""
    import sys

    prefix = f"{option} {exc.given}: " if option else f"TensorRT-LLM {exc.given} installed: "
    print(f"kvpolicy: error: {prefix}{exc}", file=sys.stderr)
    return EXIT_UNMODELLED


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
        print(
            json.dumps(
                {
                    "installed": installed,
                    "releases": [{**row.to_dict(), "installed": row.tag == tag} for row in rows],
                },
                indent=2,
            )
        )
        return 0
    print(f"TensorRT-LLM releases and the policy version that reproduces each ({RELEASES_FILE.name}, shipped with kvpolicy)\n")
    table = [("tag", "date", "policy", "certainty")] + [
        (
            ("*" if row.tag == tag else " ") + row.tag,
            row.date,
            row.policy_version or (f"none (closest {row.closest})" if row.closest else "none"),
            row.certainty,
        )
        for row in rows
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
    """``resolve``/``explain``: the policy set :func:`kvpolicy.evaluate.choice.choose_version` chooses
    (``--version``, else ``--trtllm``'s release, else the installed TensorRT-LLM's release, else the
    newest), with the line that says a release chose it and the same as JSON data (None when no
    release was involved). A release no version models exits :data:`EXIT_UNMODELLED` after saying
    what comes closest and the ways forward, unless ``--accept-unmodelled``; other unusable input 2."""
    from ..evaluate.choice import choose_version
    from ..read.releases import ReleaseError, UnmodelledRelease

    given = getattr(args, "trtllm", None)
    if given is not None and args.policy_version is not None:
        return fail("--trtllm and --version both pick the policy version: give one of them")
    try:
        choice = choose_version(
            source.path,
            version=args.policy_version,
            release=given,
            accept_unmodelled=getattr(args, "accept_unmodelled", False),
            installed=True,
        )
    except UnmodelledRelease as exc:
        return unmodelled(exc, "--trtllm" if given is not None else None)
    except ReleaseError as exc:
        return fail(f"--trtllm {given}: {exc}" if given is not None else f"TensorRT-LLM {exc.given} installed: {exc}")
    except PolicyError as exc:
        return fail(str(exc))
    if choice.how in ("version", "newest"):
        return choice.policy_set, None, None
    installed = choice.how == "installed"
    data: dict[str, Any] = {"given": choice.given, "installed": installed, "release": choice.release.to_dict() if choice.release else None}
    who = f"TensorRT-LLM {choice.given} installed" if installed else f"TensorRT-LLM {choice.release.tag if choice.release else choice.given}"
    if choice.warning:
        data["warning"] = choice.warning
        return choice.policy_set, f"warning: {choice.warning} (--accept-unmodelled)", data
    assert choice.release is not None
    line = f"{who}: {_describe(choice.release)}" + ("; --version V or --trtllm T picks another" if installed else "")
    return choice.policy_set, line, data


def release_lines(*options: tuple[str, str | None]) -> list[str]:
    """For ``impact`` and ``report``: one line per option (``("--to", "v1.3.0rc25")``) whose value is
    a TensorRT-LLM release, saying which policy version it stands for and how surely."""
    from ..read.releases import ReleaseError, UnmodelledRelease, normalise_tag, policy_version_for

    lines = []
    for option, text in options:
        if text is None or normalise_tag(text) is None:
            continue
        try:
            row = policy_version_for(text)
        except UnmodelledRelease as exc:  # answered only where the user accepted the risk
            lines.append(f"warning: {option} {text}: not modelled, answered with policy {exc.closest} (--accept-unmodelled); it misses {exc.misses}")
            continue
        except (ReleaseError, PolicyError):
            continue  # the command has already reported it
        lines.append(f"{option} {text}: TensorRT-LLM {row.tag} is {_describe(row)}")
    return lines
