"""``kvpolicy lint``, ``kvpolicy rule CODE`` and ``kvpolicy rules``.

Diagnostics go to stdout in the chosen format; logs and usage errors to stderr. Exit codes:
0 clean, 1 findings at or above the fail level, 2 usage error or a path that cannot be read.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from ..wording import plural
from .common import add_colour_argument, fail, own_policies, split_outputs, use_colour, with_policies

__all__ = ["register"]

#: What ``kvpolicy lint`` checks when no path is given.
DEFAULT_PATH = "policies"
FORMATS = ("text", "json", "github", "sarif", "junit")
"""Report formats (kvpolicy.lint.report renders each; defined here so `--help` imports nothing)."""


def register(sub: Any) -> None:
    """Add ``lint``, ``rule`` and ``rules``."""
    parser = sub.add_parser(
        "lint",
        help="check policy files for mistakes and risky rules (for CI and pre-commit)",
        description=(
            "Check policy files: schema, names, precedence (shadowed, unreachable, conflicting rules), "
            "auto choices that fail at start-up, documentation and version hygiene. With no PATHS, lints the folder "
            f"[tool.kvpolicy] policies names, else ./{DEFAULT_PATH}/. Exit 0 when clean, 1 with findings at or above --fail-level, 2 on a usage error."
        ),
    )
    parser.add_argument("paths", nargs="*", metavar="PATHS", help=f"policy files or folders (default: [tool.kvpolicy] policies, else ./{DEFAULT_PATH})")
    parser.add_argument("--format", choices=FORMATS, default="text")
    parser.add_argument("--fail-level", choices=("warning", "error"), help="lowest severity that fails the run (default: warning)")
    parser.add_argument("--select", metavar="CODES", help="comma-separated codes, prefixes, names or categories to run")
    parser.add_argument("--ignore", metavar="CODES", help="comma-separated codes, prefixes, names or categories to skip")
    parser.add_argument("--base", metavar="GIT_REF", help="also report content changed since GIT_REF without a version bump")
    parser.add_argument("--config", metavar="PYPROJECT", help="read [tool.kvpolicy] from this file (default: nearest pyproject.toml)")
    parser.add_argument(
        "--output",
        "-o",
        metavar="[FORMAT=]FILE",
        action="append",
        default=[],
        help="FILE: write the --format report to FILE instead of stdout; FORMAT=FILE (repeatable): also write "
        "the report in FORMAT to FILE, from the same run (e.g. -o sarif=kvpolicy.sarif -o junit=lint.xml)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="analyse every file again instead of reading unchanged files' results from the cache "
        "(kept in $KVPOLICY_CACHE_DIR, else ~/.cache/kvpolicy; KVPOLICY_CACHE_DIR='' turns it off)",
    )
    add_colour_argument(parser)
    parser.set_defaults(run=run_lint)

    parser = sub.add_parser("rule", help="explain a lint rule", description="Print a lint rule's documentation.")
    parser.add_argument("code", metavar="CODE", help="a rule code (KVP021) or name (shadowed-rule)")
    parser.set_defaults(run=run_rule)

    parser = sub.add_parser("rules", help="list the lint rules", description="List every lint rule by category.")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run_rules)


def _split(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(part.strip() for part in value.split(",") if part.strip())


def run_lint(args: Any) -> int:
    """Lint, print the report, and return the exit code."""
    from ..lint.report import render
    from ..lint.runner import (
        LintUsageError,
        check_pattern,
        find_config,
        lint_paths,
    )

    started = time.perf_counter()
    try:
        config = find_config(explicit=args.config)
        select, ignore = _split(args.select), _split(args.ignore)
        for pattern in (*(select or ()), *(ignore or ())):
            check_pattern(pattern, "--select/--ignore")
        config = dataclasses.replace(
            config,
            select=select if select is not None else config.select,
            ignore=(*config.ignore, *ignore) if ignore else config.ignore,
            fail_level=args.fail_level or config.fail_level,
        )
        paths = args.paths
        source = None
        if not paths:
            chosen = own_policies("lint", pyproject=args.config)
            if isinstance(chosen, int):
                return chosen
            paths, source = chosen
        result = lint_paths(paths, config, base=args.base, cache=not args.no_cache)
    except LintUsageError as exc:
        return fail(str(exc))
    outputs = split_outputs(args.output, FORMATS)
    if isinstance(outputs, str):
        return fail(outputs)
    main_file, extra = outputs
    for name, path in [(args.format, main_file), *extra]:
        if path is None:
            continue
        report = render(result, name)
        if source is not None:
            report = with_policies(report, name, source)
        try:
            Path(path).write_text(report, encoding="utf-8")
        except OSError as exc:
            return fail(f"cannot write {path}: {exc.strerror or exc}")
    if main_file is None:
        report = render(result, args.format, colour=args.format == "text" and use_colour(args.color))
        sys.stdout.write(with_policies(report, args.format, source) if source is not None else report)
    elapsed = time.perf_counter() - started
    for file in result.files:
        if file.skipped:
            print(f"kvpolicy lint: warning: {file.skipped}", file=sys.stderr)
    if config.source:
        print(f"kvpolicy lint: configuration from {config.source}", file=sys.stderr)
    if main_file is not None or args.format != "text":
        # The text report on stdout ends with its own summary; one summary a run, not two. A machine
        # format (or a report written to a file) leaves the console without one: say it here.
        print(
            f"kvpolicy lint: {plural(len(result.files), 'file')}, {plural(len(result.findings), 'finding')}, "
            f"{len(result.suppressed)} suppressed, in {elapsed:.2f}s",
            file=sys.stderr,
        )
    return 1 if result.failed() else 0


def run_rule(args: Any) -> int:
    """Print one rule's documentation."""
    from ..lint.report import rule_text
    from ..lint.rules import RULES
    from ..wording import suggest

    code = args.code.upper()
    if code not in RULES:
        by_name = {rule.name: rule.code for rule in RULES.values()}
        if args.code in by_name:
            code = by_name[args.code]
        else:
            hint = suggest(args.code, [*RULES, *by_name])  # "; did you mean 'X'?" or ""
            return fail(f"no lint rule {args.code!r}" + (f" ({hint[2:]})" if hint else "") + "; `kvpolicy rules` lists them")
    sys.stdout.write(rule_text(code))
    return 0


def run_rules(args: Any) -> int:
    """List every rule."""
    from ..lint.report import rules_table
    from ..lint.rules import RULES

    if args.format == "json":
        import json

        print(
            json.dumps(
                [{"code": r.code, "name": r.name, "category": r.category, "severity": r.severity, "summary": r.summary} for r in RULES.values()], indent=2
            )
        )
        return 0
    sys.stdout.write(rules_table())
    return 0
