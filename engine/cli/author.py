"""The policy author's loop: ``kvpolicy check [DIR]`` and ``kvpolicy new VERSION``.

``check`` is what CI and pre-commit call: lint, ``fmt --check`` and ``test --coverage`` over one
policy folder, every report, one summary and one exit code (0 all passed, 1 something failed,
2 the folder cannot be used). ``new`` starts the next version from the newest one.
"""

from __future__ import annotations

import datetime
import re
import sys
from pathlib import Path
from typing import Any

from ..wording import plural
from .common import add_colour_argument, choose_policies, fail, use_colour

__all__ = ["next_version_text", "placeholders", "register"]

DEFAULT_PATH = "policies"


def register(sub: Any) -> None:
    """Add ``check`` and ``new``."""
    parser = sub.add_parser(
        "check",
        help="lint, fmt --check and test --coverage in one run (what CI and pre-commit call)",
        description=(
            "Run `kvpolicy lint`, `kvpolicy fmt --check` and `kvpolicy test --coverage --threshold PCT` on one "
            "policy folder; print each report, then one summary. Exit 0 when all pass, 1 when one fails, 2 when "
            "the folder cannot be used."
        ),
    )
    parser.add_argument("path", nargs="?", default=None, metavar="DIR", help=f"the policy folder (default: [tool.kvpolicy] policies, else ./{DEFAULT_PATH})")
    parser.add_argument("--threshold", type=float, default=100.0, metavar="PCT", help="minimum rule coverage (default: 100)")
    parser.add_argument("--config", metavar="PYPROJECT", help="read [tool.kvpolicy] from this file (default: nearest pyproject.toml)")
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="compute every result again instead of reading unchanged files' results from the cache "
        "(kept in $KVPOLICY_CACHE_DIR, else ~/.cache/kvpolicy; KVPOLICY_CACHE_DIR='' turns it off)",
    )
    add_colour_argument(parser)
    parser.set_defaults(run=run_check)

    parser = sub.add_parser(
        "new",
        help="start the next policy version from the newest one",
        description=(
            "Copy the newest policy of DIR to VERSION.toml with its version set to VERSION, and its test cases "
            "to VERSION.cases.toml. VERSION is a date (YYYY.MM.DD, optionally .N) after the newest version. "
            "The copy's summary, source and header comment are TODO(kvpolicy new) placeholders, never the "
            "previous version's: `kvpolicy lint` refuses them (KVP042) until they say what this version changes "
            "and which upstream change it mirrors."
        ),
    )
    parser.add_argument("version", metavar="VERSION", help="the new version, e.g. 2026.10.01")
    parser.add_argument("--dir", metavar="DIR", help=f"the policy folder (default: [tool.kvpolicy] policies, else ./{DEFAULT_PATH})")
    parser.set_defaults(run=run_new)


def run_check(args: Any) -> int:
    """Lint, format check and tests; one summary line per step and one exit code."""
    from ..lint.cases import CasesUsageError, run_tests
    from ..lint.cases import render as render_tests
    from ..lint.report import render as render_lint
    from ..lint.runner import LintUsageError, find_config, lint_paths
    from .fmt import check_format

    folder = args.path
    if folder is None:
        source = choose_policies(pyproject=args.config)
        if isinstance(source, int):
            return source
        if source.path is None:  # check reads the user's files, never the shipped ones
            folder = DEFAULT_PATH
        else:
            print(source.describe())
            folder = str(source.path)
    if not Path(folder).is_dir():
        return fail(f"{folder}: not a policy folder; name the folder that holds the policy files")
    if not 0 <= args.threshold <= 100:
        return fail("--threshold must be a percentage between 0 and 100")
    summary: list[tuple[str, str, str]] = []
    usage = False

    try:
        result = lint_paths([folder], find_config(explicit=args.config), cache=not args.no_cache)
    except LintUsageError as exc:
        summary.append(("lint", "error", str(exc)))
        usage = True
    else:
        if result.findings:
            sys.stdout.write(render_lint(result, "text", colour=use_colour(args.color)))
        counts = result.counts()
        detail = (
            f"{plural(len(result.files), 'file')}, {plural(counts['error'], 'error')}, "
            f"{plural(counts['warning'], 'warning')}, {len(result.suppressed)} suppressed"
        )
        summary.append(("lint", "failed" if result.failed() else "passed", detail))

    checked = check_format([folder], cache=not args.no_cache)
    if isinstance(checked, str):
        summary.append(("fmt", "error", checked))
        usage = True
    else:
        changed, errors, count = checked
        for error in errors:
            print(f"fmt: {error}")
        for _, shown, _, _ in changed:
            print(f"Would reformat: {shown} (run `kvpolicy fmt {folder}`)")
        state = "failed" if changed or errors else "passed"
        summary.append(("fmt", state, f"{plural(count, 'file')}, {len(changed)} would be reformatted, {len(errors)} unreadable"))

    try:
        run = run_tests([folder], cache=not args.no_cache)
    except CasesUsageError as exc:
        summary.append(("test", "error", str(exc)))
        usage = True
    else:
        below = [p for p in run.coverage if run.percent(p) + 1e-9 < args.threshold]
        if run.failed or run.errors or below:
            sys.stdout.write(render_tests(run, coverage=bool(below)))
        passed = len(run.cases) - len(run.failed)
        if run.coverage:
            coverage = f"coverage {run.total_percent():.1f}% (threshold {args.threshold:g}%)"
        else:  # no policy loaded: nothing was covered, and nothing can be claimed
            coverage = "no coverage: no policy loaded, nothing to cover"
        detail = f"{passed} passed, {len(run.failed)} failed, {plural(len(run.errors), 'error')}, {coverage}"
        summary.append(("test", "failed" if run.failed or run.errors or below or not run.coverage else "passed", detail))

    failed = [name for name, state, _ in summary if state != "passed"]
    print(f"kvpolicy check {folder}:")
    for name, state, detail in summary:
        print(f"  {name:<5} {state:<7} {detail}")
    print("passed" if not failed else f"failed: {', '.join(failed)}")
    if usage:
        return 2
    return 1 if failed else 0


_VERSION = re.compile(r"^[0-9]{4}\.[0-9]{2}\.[0-9]{2}(\.[0-9]+)?$")
_VERSION_LINE = re.compile(r'^(version\s*=\s*)"([^"]*)"', re.MULTILINE)
_POLICY_LINE = re.compile(r'^(policy\s*=\s*)"([^"]*)"', re.MULTILINE)
#: A top-level ``summary`` / ``source`` line and its string (basic, literal, or multi-line).
_STRING = r"""(\"\"\"[\s\S]*?\"\"\"|'\'\'[\s\S]*?'\'\'|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
_TOP_LINES = {key: re.compile(rf"^({key}\s*=\s*){_STRING}", re.MULTILINE) for key in ("summary", "source")}
_TABLE_LINE = re.compile(r"^\s*\[", re.MULTILINE)


def placeholders() -> dict[str, str]:
    """What ``new`` writes where only the author can say what the version is (KVP042 refuses them)."""
    from ..lint.rules import PLACEHOLDER

    return {
        "summary": f"{PLACEHOLDER}: one line on what this version changes",
        "source": f"{PLACEHOLDER}: the upstream change this version mirrors (repository, PR, merge date, file)",
        "comment": f"# {PLACEHOLDER}: what this version changes, and the upstream change it mirrors.",
    }


def next_version_text(text: str, version: str) -> str | None:
    """A version's text as the start of the next one (``new``, ``upstream draft``): ``version``
    rewritten, and the header comment, ``summary`` and ``source`` replaced with placeholders that lint
    refuses (KVP042) until the author fills them. None when those top-level lines are not there."""
    text, count = _VERSION_LINE.subn(lambda m: f'{m.group(1)}"{version}"', text, count=1)
    return _fresh_header(text, placeholders()) if count == 1 else None


def _fresh_header(text: str, marks: dict[str, str]) -> str | None:
    """The previous version's text with its own description replaced by placeholders: the header
    comment (a ``#:schema`` line is kept), ``summary`` and ``source``. None when the top-level
    ``summary`` or ``source`` is not a plain key = string line to rewrite."""
    lines = text.splitlines(keepends=True)
    header = 0
    while header < len(lines) and (not lines[header].strip() or lines[header].lstrip().startswith("#")):
        header += 1
    kept = [line for line in lines[:header] if line.startswith("#:")]
    body = "".join(lines[header:])
    table = _TABLE_LINE.search(body)
    top, rest = (body[: table.start()], body[table.start() :]) if table else (body, "")
    for key, pattern in _TOP_LINES.items():
        value = marks[key].replace("\\", "\\\\").replace('"', '\\"')

        def quoted(m: re.Match[str], v: str = value) -> str:
            return f'{m.group(1)}"{v}"'

        top, count = pattern.subn(quoted, top, count=1)
        if count != 1:
            return None
    return "".join(kept) + marks["comment"] + "\n" + top + rest


def run_new(args: Any) -> int:
    """Scaffold VERSION.toml and VERSION.cases.toml from the newest version of the folder."""
    from ..errors import PolicyError
    from ..read.loader import CASES_SUFFIX, load_policy_file, version_key
    from ..read.policyfile import read_policy_bytes
    from ..evaluate.policyset import load

    version = args.version
    if not _VERSION.match(version):
        return fail(f"{version!r} is not a version: write a date, YYYY.MM.DD (optionally .N)")
    try:
        datetime.date(*(int(part) for part in version.split(".")[:3]))
    except ValueError as exc:
        return fail(f"{version} is not a date: {exc}")
    if args.dir is not None:
        folder = Path(args.dir)
        if not folder.is_dir():
            state = "not a folder" if folder.exists() else "no such folder"
            return fail(f"--dir {args.dir}: {state}; name the policy folder that holds the versions (e.g. --dir {folder.parent})")
    else:
        source = choose_policies()
        if isinstance(source, int):
            return source
        if source.path is None:  # new writes into the user's folder, never into the installed package
            missing = source.note or f"./{DEFAULT_PATH} does not exist"
            return fail(
                f"no policy folder to add a version to: {missing} and [tool.kvpolicy] policies names none; "
                f"copy the newest shipped version into ./{DEFAULT_PATH} or pass --dir DIR"
            )
        print(source.describe())
        folder = source.path
    try:
        newest = load(folder)
    except PolicyError as exc:
        return fail(f"{folder}: {exc}")
    if version_key(version) <= version_key(newest.version):
        return fail(f"{version} is not after the newest version {newest.version}; pick a later date")
    target = folder / f"{version}.toml"
    cases_target = folder / f"{version}{CASES_SUFFIX}"
    for path in (target, cases_target):
        if path.exists():
            return fail(f"{path} already exists")
    newest_file = Path(newest.path)
    try:
        text = read_policy_bytes(newest_file, str(newest_file), root=folder).decode("utf-8")
    except PolicyError as exc:
        return fail(str(exc))
    text, count = _VERSION_LINE.subn(lambda m: f'{m.group(1)}"{version}"', text, count=1)
    if count != 1:
        return fail(f'{newest_file}: no top-level `version = "..."` line to rewrite')
    # What the version is (summary, source, header comment) is the author's to say: placeholders
    # that lint refuses (KVP042) until they are filled, never the previous version's claims.
    marks = placeholders()
    fresh = _fresh_header(text, marks)
    if fresh is None:
        return fail(f'{newest_file}: no top-level `summary = "..."` and `source = "..."` lines to rewrite')
    text = fresh
    target.write_text(text, encoding="utf-8")
    try:
        copy = load_policy_file(target, root=folder)
    except PolicyError as exc:  # pragma: no cover - the newest version loaded a moment ago
        target.unlink()
        return fail(f"the copy does not load: {exc}")
    if (copy.summary, copy.source) != (marks["summary"], marks["source"]):  # pragma: no cover - a defence
        target.unlink()
        return fail(f"{newest_file}: its summary and source could not be replaced with placeholders")
    created = [str(target)]
    cases_source = newest_file.with_name(newest_file.name[: -len(".toml")] + CASES_SUFFIX)
    if cases_source.is_file():
        cases = read_policy_bytes(cases_source, str(cases_source), root=folder).decode("utf-8")
        cases = _POLICY_LINE.sub(lambda m: f'{m.group(1)}"{target.name}"', cases, count=1)
        # The header comment names the file it tests: name the new one.
        lines = cases.splitlines(keepends=True)
        for index, line in enumerate(lines):
            if not line.lstrip().startswith("#"):
                break
            lines[index] = line.replace(newest_file.name, target.name)
        cases = "".join(lines)
    else:
        cases = (
            f"# Test cases of {target.name}: `kvpolicy test {folder}` runs them.\n\n"
            '[[case]]\nname = "describe the context"\ncontext = { architecture = "LlamaForCausalLM" }\n'
            'expect = { transceiver_runtime = "CPP" }\n'
        )
    cases_target.write_text(cases, encoding="utf-8")
    created.append(str(cases_target))
    print(f"created {', '.join(created)} from {newest.version}")
    print(
        f"next: in {target.name}, make the change and replace the {marks['summary'].split(':')[0]} placeholders "
        f"(summary, source, header comment); add cases for what changes, then `kvpolicy check {folder}`"
    )
    return 0
