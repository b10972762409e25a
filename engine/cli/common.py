"""Pieces the commands share: which policies a command uses, loading a policy from CLI arguments,
reporting unusable input."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import ContextError, PolicyError
from ..read.policyroot import DEFAULT_FOLDER, PolicySource, policy_source
from ..evaluate.policyset import PolicySet, load
from ..wording import plural

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
    "models_root_problem",
    "own_policies",
    "read_line",
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


def models_root_problem(option: str | None) -> str | None:
    """Why the models root a command would use cannot be: ``--models-root`` that is not a folder,
    or ``$LLM_MODELS_ROOT`` naming something that is not a folder (a root that does not exist
    there is only a place not to look: a shared CI setting may name a mount this machine lacks).
    None when it can be used."""
    hint = "name the folder that holds the checkpoint folders"
    if option is not None:
        if os.path.isdir(option):
            return None
        state = "not a folder" if os.path.exists(option) else "no such folder"
        return f"--models-root {option or repr(option)}: {state}; {hint}"
    value = os.environ.get("LLM_MODELS_ROOT")
    if value and os.path.exists(value) and not os.path.isdir(value):
        return f"$LLM_MODELS_ROOT={value}: not a folder; {hint}, or unset it"
    return None


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
        "--color", choices=("auto", "always", "never"), default="auto",
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
