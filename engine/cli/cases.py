"""``kvpolicy test``: run policy test cases (TOML beside each policy), optionally with coverage.

Exit codes: 0 every case passed (and coverage reached ``--threshold``), 1 a case failed, a cases
file is broken or coverage is below the threshold, 2 a usage error.
"""

from __future__ import annotations

import sys
from typing import Any

from .common import fail, own_policies, with_policies

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``test``."""
    parser = sub.add_parser(
        "test",
        help="run policy test cases (<policy>.cases.toml) and report rule coverage",
        description=(
            "Run the [[case]] tables of each policy's <name>.cases.toml: resolve the context and compare the "
            "values, the deciding rules and the diagnostic ids. With no PATHS, tests the folder [tool.kvpolicy] "
            "policies names, else ./policies/."
        ),
    )
    parser.add_argument("paths", nargs="*", metavar="PATHS", help="policy files, cases files or folders (default: [tool.kvpolicy] policies, else ./policies)")
    parser.add_argument("--coverage", action="store_true", help="report the rules, rows and constraints no case exercised")
    parser.add_argument("--threshold", type=float, metavar="PCT", help="fail when a policy file's coverage is below PCT (implies --coverage)")
    parser.add_argument("--verbose", "-v", action="store_true", help="list every case")
    parser.add_argument("--format", choices=("text", "json", "junit"), default="text", help="output format (default: text)")
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="compute every result again instead of reading unchanged files' results from the cache "
        "(kept in $KVPOLICY_CACHE_DIR, else ~/.cache/kvpolicy; KVPOLICY_CACHE_DIR='' turns it off)",
    )
    parser.set_defaults(run=run_test)


def run_test(args: Any) -> int:
    """Run the cases; print failures, coverage and the closing line."""
    from ..lint.cases import CasesUsageError, as_json, as_junit, render, run_tests

    paths = args.paths
    source = None
    if not paths:
        chosen = own_policies("test")
        if isinstance(chosen, int):
            return chosen
        paths, source = chosen
    if args.threshold is not None and not 0 <= args.threshold <= 100:
        return fail("--threshold must be a percentage between 0 and 100")
    try:
        run = run_tests(paths, cache=not args.no_cache)
    except CasesUsageError as exc:
        return fail(str(exc))
    coverage = args.coverage or args.threshold is not None
    if args.format == "json":
        report = as_json(run)
    elif args.format == "junit":
        report = as_junit(run)
    else:
        report = render(run, coverage=coverage, verbose=args.verbose)
    sys.stdout.write(report if source is None else with_policies(report, args.format, source))
    below = []
    if args.threshold is not None:
        below = [p for p in run.coverage if run.percent(p) + 1e-9 < args.threshold]
        for path in below:
            print(f"kvpolicy test: coverage of {path} is {run.percent(path):.1f}%, below --threshold {args.threshold:g}%", file=sys.stderr)
    return 1 if run.failed or run.errors or below else 0
