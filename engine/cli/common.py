"""Pieces the commands share: which policies a command uses, loading a policy from CLI arguments,
reporting unusable input."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import ContextError, PolicyError
from ..read.policyroot import DEFAULT_FOLDER, PolicySource, policy_source
from ..evaluate.policyset import PolicySet, load

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "EXIT_UNMODELLED",
    "POLICIES_DEFAULT",
    "add_policy_arguments",
    "choose_policies",
    "fail",
    "load_from_args",
    "add_model_arguments",
    "model_options",
    "own_policies",
    "split_outputs",
    "with_policies",
]

#: Where commands look for policies when none is named (kvpolicy.read.policyroot), for help texts.
POLICIES_DEFAULT = "default: [tool.kvpolicy] policies in pyproject.toml, else ./policies, else the shipped policies"


#: The exit code of a TensorRT-LLM release (named or installed) that no policy version models:
#: neither "starts" (0), "cannot start" (1), bad input (2) nor "depends on the model" (3), since
#: kvpolicy cannot say; ``--accept-unmodelled`` answers with the closest version instead.
EXIT_UNMODELLED = 4


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """``--policy PATH`` and ``--version V`` (alias ``--policy-version``)."""
    parser.add_argument("--policy", metavar="PATH", help=f"a policy file or folder ({POLICIES_DEFAULT})")
    parser.add_argument(
        "--version",
        "--policy-version",
        dest="policy_version",
        metavar="V",
        help="a policy version from the folder (default: the newest)",
    )


def fail(message: str) -> int:
    """Report unusable input on stderr; exit code 2."""
    print(f"kvpolicy: error: {message}", file=sys.stderr)
    return 2


def add_model_arguments(parser: Any, *, scope: str = "") -> None:
    """``--models-root`` and ``--arch-map``: how a command that reads serving configs finds the model
    each server runs (``scope``, e.g. ``"with --config: "``, starts their help)."""
    parser.add_argument("--models-root", metavar="DIR", help=f"{scope}where checkpoint folders (with config.json) live (default: $LLM_MODELS_ROOT)")
    parser.add_argument("--arch-map", metavar="FILE", help=f"{scope}YAML/JSON mapping of model path globs to architectures")


def model_options(args: Any, architectures: Any) -> Any:
    """The architecture map of ``--arch-map`` (None without it), checked against the architectures
    the policies name, after checking the models root the command would use; the exit code (an
    int) when either cannot be used (the message printed)."""
    from ..serving.identity import load_architecture_map, models_root_problem

    arch_map = None
    if args.arch_map:
        try:
            arch_map = load_architecture_map(args.arch_map)
        except ValueError as exc:
            return fail(f"--arch-map: {exc}")
        misses = arch_map.near_misses(architectures)
        if misses:
            return fail("--arch-map: " + "; ".join(misses))
    problem = models_root_problem(args.models_root)
    if problem:
        return fail(problem)
    return arch_map


def choose_policies(option: str | None = None, *, pyproject: str | None = None) -> PolicySource | int:
    """The policies a command uses: ``--policy``'s value, else the folder ``[tool.kvpolicy]
    policies`` names (in ``pyproject`` or the nearest pyproject.toml), else ./policies, else the
    shipped history (:func:`kvpolicy.read.policyroot.policy_source`). Exit code 2 after reporting why
    the configured folder cannot be used."""
    try:
        return policy_source(option, pyproject=pyproject)
    except PolicyError as exc:  # a problem of pyproject.toml, not of a policy: its location alone
        return fail("; ".join(str(problem) for problem in exc.problems))


def own_policies(verb: str, *, pyproject: str | None = None) -> tuple[list[str], PolicySource | None] | int:
    """The default PATHS of a command that works on the user's own policy files (lint, test, fmt):
    the chosen folder, or ``./policies`` when the choice falls to the shipped history (these
    commands never read or rewrite the installed package as "yours"). Returns the paths and the
    source (None when ``./policies`` was the fallback), or exit code 2 when there is no folder."""
    source = choose_policies(pyproject=pyproject)
    if isinstance(source, int):
        return source
    if source.path is None:
        if not os.path.isdir(DEFAULT_FOLDER):
            return fail(f"no PATHS given and ./{DEFAULT_FOLDER}/ does not exist; name the policy files or folders to {verb}")
        if source.foreign:  # another tool's folder: never lint or rewrite it as ours
            return fail(f"no PATHS given and {source.note}, or name the files to {verb}")
        return [DEFAULT_FOLDER], None
    return [str(source.path)], source


def load_from_args(args: Any, source: PolicySource) -> PolicySet | int:
    """The version ``--version`` names (default: the newest) of the chosen policies, or exit code 2
    after reporting why it cannot be used."""
    try:
        return load(source.path, version=args.policy_version)
    except PolicyError as exc:
        return fail(str(exc))


def with_policies(report: str, fmt: str, source: PolicySource) -> str:
    """A report of the folder chosen for the command, saying which it was: the header line first
    in text, a top-level ``policies`` field in JSON; formats other tools parse are left as they are."""
    if fmt == "text":
        return source.describe() + "\n" + report
    if fmt == "json":
        import json

        return json.dumps({"policies": source.to_dict(), **json.loads(report)}, indent=2) + "\n"
    return report


def context_error(exc: ContextError) -> int:
    """Report a bad context field (exit 2)."""
    return fail(f"invalid context: {exc}")


def add_colour_argument(parser: argparse.ArgumentParser) -> None:
    """``--color auto|always|never`` (auto: on a terminal, unless NO_COLOR is set)."""
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the text report (default auto: on a terminal; NO_COLOR set turns it off, FORCE_COLOR on)",
    )


def use_colour(choice: str, stream: Any = None) -> bool:
    """Whether to colour what goes to ``stream`` (stdout): the --color choice, then the NO_COLOR
    and FORCE_COLOR conventions (no-color.org, force-color.org), then whether it is a terminal."""
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    stream = stream or sys.stdout
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def split_outputs(values: list[str], formats: tuple[str, ...]) -> tuple[str | None, list[tuple[str, str]]] | str:
    """``-o`` values of a command with report formats (lint, impact): the file the ``--format``
    report goes to (``-o FILE``, at most one) and the other reports (``-o FORMAT=FILE``); a message
    saying what is wrong instead, for the caller to report (exit 2)."""
    main_file, extra = None, []
    for value in values:
        name, sep, path = value.partition("=")
        if sep and name in formats:
            if not path:
                return f"--output {name}=: name the file to write"
            extra.append((name, path))
        elif main_file is None:
            main_file = value
        else:
            return f"--output {value}: the --format report already goes to {main_file}; name another report FORMAT=FILE ({', '.join(formats)})"
    return main_file, extra
