"""The ``kvpolicy`` command line: a thin layer that parses arguments and formats output.

Each command lives in its own module with ``register(subparsers)`` and a ``run(args) -> int``.
Exit codes: 0 success, 1 findings or errors in a resolution, 2 usage error or unreadable input.
Commands that only read policies (resolve, explain, versions, table, lint, diff) never import
torch or nixl.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

#: command name -> module (relative to this package); imported only when the command runs.
COMMANDS: dict[str, str] = {
    "resolve": ".resolve",
    "explain": ".resolve",
    "versions": ".versions",
    "table": ".versions",
    "lint": ".lint",
    "rule": ".lint",
    "rules": ".lint",
    "test": ".cases",
    "fmt": ".fmt",
    "diff": ".diff",
    "impact": ".impact",
    "demo": ".demo",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = _Parser(
        prog="kvpolicy",
        description="Declarative, checkable selection of the KV-cache transceiver runtime.",
    )
    parser.add_argument("--version", action="version", version=f"kvpolicy {_package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    seen: set[str] = set()
    for module in COMMANDS.values():
        if module not in seen:
            seen.add(module)
            importlib.import_module(module, __name__).register(sub)
    return parser


def _package_version() -> str:
    from .. import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except BrokenPipeError:  # e.g. `kvpolicy table | head`
        return 0
    except KeyboardInterrupt:
        return 130
