"""Pieces the commands share: loading a policy from CLI arguments, reporting unusable input."""

from __future__ import annotations

import argparse
import sys
TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

from ..errors import ContextError, PolicyError
from ..policyset import PolicySet, load

__all__ = ["add_policy_arguments", "fail", "load_from_args"]


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """``--policy PATH`` and ``--version V`` (alias ``--policy-version``)."""
    parser.add_argument(
        "--policy", metavar="PATH", help="a policy file or folder (default: the shipped policies)"
    )
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


def load_from_args(args: Any) -> PolicySet | int:
    """The policy set the arguments name, or exit code 2 after reporting why it cannot be used."""
    try:
        return load(args.policy, version=args.policy_version)
    except PolicyError as exc:
        return fail(str(exc))


def context_error(exc: ContextError) -> int:
    """Report a bad context field (exit 2)."""
    return fail(f"invalid context: {exc}")
