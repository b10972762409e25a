"""The ``kvpolicy`` command line: a thin layer that parses arguments and formats output.

Each command lives in its own module with ``register(subparsers)`` and a ``run(args) -> int``.
Exit codes: 0 success, 1 findings or errors in a resolution, 2 usage error or unreadable input.
Commands that only read policies (resolve, explain, versions, releases, table, lint, diff, report) never import
torch or nixl.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]

#: command name -> module (relative to this package); imported only when the command runs.
COMMANDS: dict[str, str] = {
    "resolve": ".resolve",
    "explain": ".resolve",
    "versions": ".versions",
    "releases": ".releases",
    "table": ".versions",
    "lint": ".lint",
    "rule": ".lint",
    "rules": ".lint",
    "test": ".cases",
    "check": ".author",
    "new": ".author",
    "fmt": ".fmt",
    "diff": ".diff",
    "impact": ".impact",
    "report": ".report",
    "demo": ".demo",
    "keys": ".keys",
    "upstream": ".upstream",
}

#: One line per command for `kvpolicy --help`, so listing them imports none of their modules.
SUMMARIES: dict[str, str] = {
    "resolve": "resolve one serving context: values, deciding rules, errors",
    "explain": "resolve one serving context and print every step of the decision",
    "versions": "list the policy versions",
    "releases": "list TensorRT-LLM releases and the policy version that reproduces each",
    "table": "print what a version resolves for every architecture it names and every backend",
    "lint": "check policy files (rule catalogue, CI output formats)",
    "rule": "print the documentation of one lint rule",
    "rules": "list the lint rules",
    "test": "run policy test cases, with coverage",
    "check": "lint, fmt --check and test --coverage in one run (CI, pre-commit)",
    "new": "start the next policy version from the newest one",
    "fmt": "format policy files canonically",
    "diff": "every context two policy versions resolve differently",
    "impact": "how serving configs resolve under two policy versions",
    "report": "one self-contained HTML page: decision matrix, history, diff and impact",
    "demo": "run prefill -> decode on real models through the runtime the policy chose",
    "keys": "make or inspect the CURVE keys of the transfer layer's control plane",
    "upstream": "compare policy versions with TensorRT-LLM's own source (drift), and draft the next version",
}


def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` finds it ($COLUMNS, then the terminal,
    then 80), without importing shutil (and with it zlib, bz2 and lzma) into every cold start:
    argparse builds a formatter for every argument it adds, though only help text reads the width."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        stdout = sys.__stdout__  # None where Python started without one
        try:
            columns = os.get_terminal_size(stdout.fileno()).columns if stdout is not None else 0
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]  # passed through to argparse unchanged; its keywords are typed one by one

    def error(self, message: str) -> None:  # type: ignore[override]  # argparse types error() NoReturn; this one raises SystemExit(2) too
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser. Only the module of the command in ``argv`` is imported (all of them
    when ``argv`` is None); the others get a placeholder that lists them in ``--help``: a cold
    `kvpolicy resolve` must not pay for importing lint, diff or the demo."""
    parser = _Parser(
        prog="kvpolicy",
        description="Declarative, checkable selection of the KV-cache transceiver runtime.",
    )
    parser.add_argument("--version", action="version", version=f"kvpolicy {_package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    wanted = set(COMMANDS) if argv is None else {a for a in argv if a in COMMANDS}
    modules = {COMMANDS[name] for name in wanted}
    for module in sorted(modules):
        importlib.import_module(module, __name__).register(sub)
    registered = set(sub.choices)
    if argv is not None and wanted and not {"-h", "--help"} & set(argv):
        # The command is known: the others' placeholders would only serve `kvpolicy --help` and
        # the list of choices in an error about the command, neither of which can happen now
        # (each placeholder parser costs ~0.5 ms of a cold start).
        return parser
    for name in COMMANDS:
        if name not in registered:
            sub.add_parser(name, help=SUMMARIES[name], description=SUMMARIES[name])
    return parser


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)sub-command parser that ``args`` were parsed by (``kvpolicy keys new``: ``new``'s)."""
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, actions[0].dest, None) if actions else None
        if chosen not in (actions[0].choices if actions else {}):
            return parser
        parser = actions[0].choices[chosen]


def _package_version() -> str:
    from .. import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # The command is the first argument that is not an option.
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser([command] if command else [])
    args, extra = parser.parse_known_args(argv)
    if extra:  # the sub-command's usage, not the top level's: that is the parser the arguments were for
        _innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.run(args))
    except BrokenPipeError:  # e.g. `kvpolicy table | head`
        return 0
    except KeyboardInterrupt:
        return 130
