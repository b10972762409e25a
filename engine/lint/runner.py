"""Running the rules over files: selection, suppressions, configuration and version history.

Never raises on bad policy input: a file that does not parse is a finding with its location.
Only unusable *arguments* (a path that cannot be read, a bad ``--base`` ref, a broken
``[tool.kvpolicy]`` table) raise :class:`LintUsageError`, which the CLI turns into exit code 2.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PolicyError
from ..read.loader import CASES_SUFFIX, display_path, parse_policy, policy_files
from ..read.policyfile import read_policy_bytes
from ..read.source import Location, SourceDocument, TomlSyntaxError, parse_document
from .rules import ANALYSIS_RULES, RULES, Finding, PolicyFile, Severity

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["LintConfig", "LintResult", "LintUsageError", "find_config", "lint_paths", "selected_codes"]

FAIL_LEVELS = ("warning", "error")
_SEVERITY_RANK = {"warning": 1, "error": 2}
_SUPPRESSION = re.compile(r"#\s*kvpolicy:\s*ignore\[([^\]]*)\]([^#]*)")


class LintUsageError(Exception):
    """The arguments or configuration cannot be used (exit code 2)."""


@dataclass(frozen=True)
class LintConfig:
    """Which rules run and what fails the run (``[tool.kvpolicy]`` in ``pyproject.toml``)."""

    select: tuple[str, ...] = ("KVP",)
    ignore: tuple[str, ...] = ()
    fail_level: str = "warning"
    source: str | None = None
    """The file the configuration came from, if any."""
    allow_symlinks: tuple[Path, ...] = ()
    """Folders outside the policy folder that policy symlinks may point into (resolved)."""
    analysis_limit: Severity = "error"
    """Severity of KVP029 (the exact analysis could not run within its budget)."""

    def enabled(self, code: str) -> bool:
        """Whether a rule code is selected and not ignored (by code prefix, name or category)."""
        return _matches(code, self.select) and not _matches(code, self.ignore)


def _matches(code: str, patterns: Iterable[str]) -> bool:
    rule = RULES.get(code)
    for pattern in patterns:
        if pattern == "ALL" or code.startswith(pattern.upper()):
            return True
        if rule is not None and pattern in (rule.name, rule.category):
            return True
    return False


def selected_codes(config: LintConfig) -> list[str]:
    """The codes a configuration runs."""
    return [code for code in RULES if config.enabled(code)]


def find_config(start: Path | None = None, explicit: str | None = None) -> LintConfig:
    """Read ``[tool.kvpolicy]`` from ``explicit`` or the nearest ``pyproject.toml`` upwards."""
    from ..read.policyroot import find_pyproject, kvpolicy_table

    if explicit is not None:
        given = Path(explicit)
        if not given.is_file():
            raise LintUsageError(f"config file {explicit} does not exist")
        path: Path | None = given
    else:
        path = find_pyproject(start)
    if path is None:
        return LintConfig()
    try:
        table = kvpolicy_table(path)
    except PolicyError as exc:
        raise LintUsageError(str(exc.problems[0])) from None
    if table is None:
        return LintConfig()
    return config_from_table(table, str(path))


def config_from_table(table: Any, source: str) -> LintConfig:
    """Check and turn a ``[tool.kvpolicy]`` table into a configuration."""
    if not isinstance(table, dict):
        raise LintUsageError(f"{source}: [tool.kvpolicy] must be a table")
    # policies: the folder commands use (checked where it is used, kvpolicy.read.policyroot.policy_source)
    known = ("select", "ignore", "fail-level", "allow-symlinks", "analysis-limit", "policies")
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise LintUsageError(f"{source}: unknown [tool.kvpolicy] key(s) {', '.join(unknown)} (known: {', '.join(known)})")
    lists = {}
    for key in ("select", "ignore"):
        value = table.get(key, ["KVP"] if key == "select" else [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise LintUsageError(f"{source}: [tool.kvpolicy] {key} must be a list of rule codes")
        for pattern in value:
            check_pattern(pattern, f"{source}: [tool.kvpolicy] {key}")
        lists[key] = tuple(value)
    level = table.get("fail-level", "warning")
    if level not in FAIL_LEVELS:
        raise LintUsageError(f"{source}: [tool.kvpolicy] fail-level must be one of {', '.join(FAIL_LEVELS)}, not {level!r}")
    allowed = table.get("allow-symlinks", [])
    if not isinstance(allowed, list) or not all(isinstance(v, str) for v in allowed):
        raise LintUsageError(f"{source}: [tool.kvpolicy] allow-symlinks must be a list of folders")
    limit = table.get("analysis-limit", "error")
    if limit not in FAIL_LEVELS:
        raise LintUsageError(f"{source}: [tool.kvpolicy] analysis-limit must be one of {', '.join(FAIL_LEVELS)}, not {limit!r}")
    base = Path(source).parent
    return LintConfig(lists["select"], lists["ignore"], level, source, tuple(Path(os.path.abspath(base / a)) for a in allowed), limit)


def check_pattern(pattern: str, where: str) -> None:
    """Reject a select/ignore entry that matches no rule."""
    if not any(_matches(code, [pattern]) for code in RULES):
        from ..wording import suggest

        names = [*RULES, *(r.name for r in RULES.values())]
        raise LintUsageError(f"{where}: {pattern!r} matches no rule{suggest(pattern, names)}")


@dataclass
class LintResult:
    """The findings of one run, what was suppressed, and the files read."""

    findings: list[Finding] = field(default_factory=list)
    suppressed: list[Finding] = field(default_factory=list)
    files: list[PolicyFile] = field(default_factory=list)
    config: LintConfig = field(default_factory=LintConfig)
    reasons: dict[tuple[str, int], str] = field(default_factory=dict)
    """The reason given by the suppression comment at (path, line)."""

    def reason(self, finding: Finding) -> str:
        """Why a suppressed finding is accepted, as its comment says ('' when it says nothing)."""
        return self.reasons.get((finding.location.path, finding.location.line), "")

    def failed(self, fail_level: str | None = None) -> bool:
        """Whether a finding reaches the fail level."""
        level = _SEVERITY_RANK[fail_level or self.config.fail_level]
        return any(_SEVERITY_RANK[f.severity] >= level for f in self.findings)

    def counts(self) -> dict[str, int]:
        """Findings by severity."""
        counts = {"error": 0, "warning": 0}
        for finding in self.findings:
            counts[finding.severity] += 1
        return counts


def expand_paths(paths: Sequence[str]) -> list[tuple[Path, Path]]:
    """(policy file, policy folder) for every file ``paths`` name (folders: their ``*.toml``
    except test-case files). Raises :class:`LintUsageError` when they name no policy file."""
    files: list[tuple[Path, Path]] = []
    cases: list[str] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files += [(found, path) for found in policy_files(path)]
            if not policy_files(path):
                cases += [str(p) for p in sorted(path.glob("*" + CASES_SUFFIX))]
        elif os.path.lexists(path):
            if path.name.endswith(CASES_SUFFIX):
                cases.append(name)
                continue  # policy test cases: `kvpolicy test` reads them
            # Not resolved here: a FIFO, a device or a symlink loop is reported by the reader.
            files.append((path, path.parent))
        else:
            raise LintUsageError(f"{name}: no such file or folder")
    if not files:
        hint = f" ({', '.join(cases)} hold policy test cases: `kvpolicy test` runs them)" if cases else ""
        raise LintUsageError(f"no policy files (*.toml) in {', '.join(paths)}{hint}; name a policy file or folder")
    unique: dict[str, tuple[Path, Path]] = {}
    for file, root in files:
        unique.setdefault(os.path.realpath(file), (file, root))  # realpath: never raises on a loop
    return list(unique.values())


def read_policy_file(path: Path, root: Path | None = None, allowed: tuple[Path, ...] | None = None, *, load: bool = True) -> PolicyFile:
    """Read and load one file, keeping the loader's problems (and the reader's refusal) instead of
    raising; with ``load=False`` only read it (:func:`lint_files` loads it if its results are
    not in the cache)."""
    shown = display_path(path)
    try:
        raw = read_policy_bytes(path, shown, root=root, allowed=allowed)
    except PolicyError as exc:
        return PolicyFile(shown, b"", None, None, exc.problems)
    if not load:
        unread = PolicyFile(shown, raw, None, None)
        unread.pending = True
        return unread
    return load_policy_bytes(raw, shown)


def load_policy_bytes(raw: bytes, shown: str) -> PolicyFile:
    """Load policy bytes for linting; ``shown`` names the file in findings."""
    document: SourceDocument | None
    try:
        document = parse_document(raw, shown)
    except TomlSyntaxError as exc:
        if exc.check != "toml":  # refused before parsing: parsing it again would only cost the same
            from ..errors import PolicyProblem

            return PolicyFile(shown, raw, None, None, (PolicyProblem(exc.location, exc.check, exc.reason),))
        document = None
    try:
        policy = parse_policy(raw, shown)
    except PolicyError as exc:
        return PolicyFile(shown, raw, document, None, exc.problems)
    return PolicyFile(shown, raw, document, policy)


def git_base(ref: str) -> Callable[[str], dict[str, Any] | None]:
    """A function giving a file's TOML data at ``ref`` (None where the file did not exist)."""
    try:
        subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError):
        raise LintUsageError(f"--base {ref}: not a git revision here") from None

    def at_base(path: str) -> dict[str, Any] | None:
        folder = Path(path).resolve().parent
        try:
            top = subprocess.run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"], check=True, capture_output=True, text=True).stdout.strip()
            relative = Path(path).resolve().relative_to(Path(top).resolve()).as_posix()
            shown = subprocess.run(["git", "-C", top, "show", f"{ref}:{relative}"], check=True, capture_output=True).stdout
            return tomllib.loads(shown.decode("utf-8"))
        except (OSError, ValueError, subprocess.CalledProcessError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return None

    return at_base


def lint_paths(
    paths: Sequence[str],
    config: LintConfig | None = None,
    *,
    base: str | None = None,
    cache: bool = True,
) -> LintResult:
    """Lint the policy files that ``paths`` name. With ``cache`` (the default), files whose
    results are stored (:mod:`kvpolicy.lint.cache`) are neither parsed nor analysed again."""
    config = config or LintConfig()
    # The configuration's allow-symlinks; without one, the reader looks for pyproject.toml from the
    # policy folder when it meets a symlink (as load() does).
    allowed = config.allow_symlinks if config.source else None
    files = [read_policy_file(path, root, allowed, load=not cache) for path, root in expand_paths(paths)]
    return lint_files(files, config, base=git_base(base) if base else None, cache=cache)


def lint_files(
    files: list[PolicyFile],
    config: LintConfig | None = None,
    *,
    base: Callable[[str], dict[str, Any] | None] | None = None,
    cache: bool = False,
) -> LintResult:
    """Run every enabled rule over files and apply suppressions. Files read with ``load=False``
    are loaded here, only where their results must be computed; with ``cache``, results are
    read from and stored in the lint cache (never with ``base``, which reads git, for the set
    rules)."""
    from . import cache as stored

    config = config or LintConfig()
    files = list(files)
    rules = stored.rules_key(selected_codes(config)) if cache else None
    raw: list[Finding] = []
    loaded: set[str] = set()
    unanalysed: set[str] = set()  # files whose exact analysis was skipped
    keys: list[str | None] = []
    for index, file in enumerate(files):
        key = None
        if rules is not None and (file.pending or file.policy is not None):
            key = stored.file_key(rules, file.path, file.raw)
            hit = stored.load_file(key)
            if hit is not None:
                keys.append(key)
                raw += hit.findings
                if hit.loaded:
                    loaded.add(file.path)
                if hit.skipped_reason is not None:
                    file.skipped_reason = hit.skipped_reason
                    file.skipped = f"{file.path}: precedence and safety analysis skipped: {hit.skipped_reason}"
                    unanalysed.add(file.path)
                continue
        if file.pending:
            files[index] = file = load_policy_bytes(file.raw, file.path)
        found = _file_findings(file, config)
        raw += found
        if file.policy is not None:
            loaded.add(file.path)
            if file.skipped_reason is not None:
                unanalysed.add(file.path)
        if key is not None:
            stored.store_file(key, stored.FileResult(found, file.policy is not None, file.skipped_reason))
        keys.append(key)
    found_in_set: list[Finding] | None = None
    set_key = None
    if rules is not None and base is None and None not in keys:
        set_key = stored.set_key(rules, [key for key in keys if key is not None])
        found_in_set = stored.load_set(set_key)
    if found_in_set is None:
        for index, file in enumerate(files):
            if file.pending:  # the set rules read every file's policy
                files[index] = load_policy_bytes(file.raw, file.path)
        found_in_set = _set_findings(files, config, base)
        if set_key is not None:
            stored.store_set(set_key, found_in_set)
    raw += found_in_set
    return _result(files, config, raw, loaded, unanalysed)


def _file_findings(file: PolicyFile, config: LintConfig) -> list[Finding]:
    """The findings of the loader and policy rules, which read one file only."""
    found: list[Finding] = []
    for rule in RULES.values():
        if not config.enabled(rule.code):
            continue
        # KVP020 also reports the loader's conflicting rows when the file does not load.
        if rule.kind == "loader" or (rule.kind == "policy" and (file.policy is not None or rule.code == "KVP020")):
            found += rule.check(file)
    return found


def _set_findings(files: list[PolicyFile], config: LintConfig, base: Callable[[str], dict[str, Any] | None] | None) -> list[Finding]:
    """The findings of the set rules, which compare files."""
    found: list[Finding] = []
    for rule in RULES.values():
        if rule.kind == "set" and config.enabled(rule.code):
            found += rule.check(files, base)
    return found


def _result(files: list[PolicyFile], config: LintConfig, raw: list[Finding], loaded: set[str], unanalysed: set[str]) -> LintResult:
    """Apply the configuration and the suppression comments to the findings of a run."""
    result = LintResult(files=files, config=config)
    if config.analysis_limit != "error":
        raw = [dataclasses.replace(f, severity=config.analysis_limit) if f.code == "KVP029" else f for f in raw]
    used: set[tuple[str, int, str]] = set()
    comments = {file.path: suppressions(file) for file in files}
    unique = {f.sort_key(): f for f in raw}
    for finding in sorted(unique.values(), key=Finding.sort_key):
        suppression = comments.get(finding.location.path, {}).get(finding.location.line)
        if suppression is not None and finding.code in suppression[0]:
            used.add((finding.location.path, finding.location.line, finding.code))
            result.suppressed.append(finding)
            result.reasons[(finding.location.path, finding.location.line)] = suppression[2]
        else:
            result.findings.append(finding)
    # Where the exact analysis was skipped, its rules did not run: their suppressions are not unused.
    for path, lines in comments.items():
        for line, (codes, column, reason) in lines.items():
            if not reason and config.enabled("KVP091"):
                result.findings.append(
                    Finding(
                        "KVP091",
                        f"suppression of {', '.join(sorted(codes)) or 'nothing'} gives no reason; say why the finding is accepted after the brackets",
                        Location(path, line, column),
                        "warning",
                    )
                )
            if not config.enabled("KVP090"):
                continue
            for code in sorted(codes):
                if code not in RULES:
                    result.findings.append(Finding("KVP090", f"suppression names unknown rule code {code!r}", Location(path, line, column), "warning"))
                # In a file that does not load, most rules did not run: nothing to judge.
                elif config.enabled(code) and path in loaded and (path, line, code) not in used and not (path in unanalysed and code in ANALYSIS_RULES):
                    result.findings.append(
                        Finding(
                            "KVP090",
                            f"unused suppression of {code}: no {code} finding on this line; delete it",
                            Location(path, line, column),
                            "warning",
                        )
                    )
    result.findings.sort(key=Finding.sort_key)
    return result


def suppressions(file: PolicyFile) -> dict[int, tuple[frozenset[str], int, str]]:
    """``# kvpolicy: ignore[CODE, ...] reason`` comments of a file: line -> (codes, column, reason)."""
    try:
        text = file.raw.decode("utf-8")
    except UnicodeDecodeError:
        return {}
    found: dict[int, tuple[frozenset[str], int, str]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = _SUPPRESSION.search(line)
        if match and _in_comment(line, match.start()):
            codes = frozenset(c.strip().upper() for c in match.group(1).split(",") if c.strip())
            found[number] = (codes, match.start() + 1, match.group(2).strip())
    return found


def _in_comment(line: str, index: int) -> bool:
    """Whether position ``index`` (a ``#``) starts a comment rather than sitting in a string."""
    quote: str | None = None
    i = 0
    while i < index:
        char = line[i]
        if quote:
            if char == "\\" and quote == '"':
                i += 2
                continue
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#":
            return True  # an earlier "#" already opened the comment
        i += 1
    return quote is None
