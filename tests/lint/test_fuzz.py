"""The linter never crashes: every input gives findings or a clean result, never a traceback.

Inputs: arbitrary bytes, random TOML documents over the policy vocabulary, textual mutations of
the shipped files (lines dropped, duplicated, swapped, tokens replaced) and structural mutations
of their data (keys dropped, values retyped or swapped), each rendered in every output format.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import tomlkit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvpolicy.lint import RULES
from kvpolicy.lint.cases import run_tests
from kvpolicy.lint.report import FORMATS, render
from kvpolicy.lint.runner import lint_files, load_policy_bytes
from kvpolicy.read.loader import shipped_root
from tomlkit.exceptions import TOMLKitError

from tests.support.strategies import hostile_structures

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SHIPPED = {p.name: p.read_text(encoding="utf-8") for p in sorted(shipped_root().glob("2026.*.toml")) if ".cases." not in p.name}
# Two of the cheapest shipped files to lint (~1 s each against 3-4 s for the newest), early and mid history.
SMALL = {k: v for k, v in SHIPPED.items() if k in ("2026.07.09.toml", "2026.08.11.toml")}
#: Examples per fuzz test; raise it for a deep run: ``KVPOLICY_FUZZ_EXAMPLES=2000 pytest tests/lint/test_fuzz.py``.
EXAMPLES = int(os.environ.get("KVPOLICY_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

KEYS = (
    "schema", "version", "summary", "source", "features", "decisions", "constraints", "backend",
    "transceiver_runtime", "kv_cache_manager", "values", "auto", "null", "inputs", "default", "requirement",
    "conditional", "preference", "rows", "architecture", "model_type", "value", "id", "when", "adopt_when",
    "notice", "severity", "message", "fix", "env", "features", "kv_transfer_timeout_ms", "not", "reason",
)
TOKENS = (
    '"NIXL"', '"UCX"', '"PYTHON"', '"CPP"', '"V2"', '"auto"', '"DEFAULT"', "true", "false", "1", '"null"',
    '{ not = "NIXL" }', '["NIXL", "UCX"]', '"LlamaForCausalLM"', '"x"', "[]", "{}", '"{backend}"', '"{nope}"',
)


def _lint(raw: bytes) -> None:
    file = load_policy_bytes(raw, "fuzz.toml")
    result = lint_files([file])
    for finding in result.findings + result.suppressed:
        assert finding.code in RULES
        assert finding.location.line >= 1 and finding.location.column >= 1
    for fmt in FORMATS:
        assert isinstance(render(result, fmt), str)


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes(raw):
    _lint(raw)


_scalars = st.one_of(st.sampled_from(["NIXL", "UCX", "PYTHON", "CPP", "auto", "DEFAULT", "x", ""]), st.integers(-2, 3), st.booleans())
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
    max_leaves=20,
)


@FUZZ
@given(st.dictionaries(st.sampled_from(KEYS), _values, max_size=8))
def test_random_toml_documents(data):
    try:
        text = tomlkit.dumps(data)
    except (TOMLKitError, TypeError, ValueError):  # tomlkit refuses some shapes; not our input
        return
    _lint(text.encode())


@FUZZ
@given(st.sampled_from(sorted(SMALL)), st.data())
def test_textual_mutations_of_shipped_files(name, data):
    lines = SMALL[name].split("\n")
    for _ in range(data.draw(st.integers(1, 4))):
        if not lines:
            break
        index = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["drop", "duplicate", "swap", "token", "truncate"]))
        if action == "drop":
            del lines[index]
        elif action == "duplicate":
            lines.insert(index, lines[index])
        elif action == "swap":
            other = data.draw(st.integers(0, len(lines) - 1))
            lines[index], lines[other] = lines[other], lines[index]
        elif action == "token" and "=" in lines[index]:
            key = lines[index].split("=", 1)[0]
            lines[index] = f"{key}= {data.draw(st.sampled_from(TOKENS))}"
        elif action == "truncate":
            lines[index] = lines[index][: data.draw(st.integers(0, len(lines[index])))]
    _lint("\n".join(lines).encode())


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, prefix + (index,))
    return found


@FUZZ
@given(st.sampled_from(sorted(SMALL)), st.data())
def test_structural_mutations_of_shipped_files(name, data):
    document = tomllib.loads(SMALL[name])
    paths = _paths(document)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = document
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = data.draw(st.sampled_from(["drop", "retype", "copy"]))
            if action == "drop":
                del parent[path[-1]]
            elif action == "retype":
                parent[path[-1]] = data.draw(_scalars)
            else:
                parent[path[-1]] = data.draw(st.sampled_from(["NIXL", ["CPP", "PYTHON"], {"not": "UCX"}, 7]))
        except (KeyError, IndexError, TypeError):
            continue
    try:
        text = tomlkit.dumps(document)
    except (TOMLKitError, TypeError, ValueError):
        return
    _lint(text.encode())


@settings(max_examples=15, deadline=None)
@given(st.text(max_size=200))
def test_cases_files_never_crash(tmp_path_factory, text):
    folder = tmp_path_factory.mktemp("cases")
    (folder / "p.toml").write_text(SMALL["2026.07.09.toml"])
    (folder / "p.cases.toml").write_text("[[case]]\n" + text)
    run = run_tests([str(folder)])
    assert run.errors or run.cases


@FUZZ
@given(st.sampled_from(sorted(SMALL)), st.data())
def test_fmt_of_mutated_files_keeps_data_or_refuses(name, data):
    """fmt never crashes either: it formats (keeping the data, idempotently) or says "not TOML"."""
    from kvpolicy.lint.fmt import FormatError, format_text

    lines = SMALL[name].split("\n")
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(lines) - 1))
        lines[index] = data.draw(st.sampled_from(["", "# note", "x = 1", "[t]", "a.b = 2", lines[index] * 2, lines[index][:5]]))
    text = "\n".join(lines)
    try:
        formatted = format_text(text)
    except FormatError:
        return
    try:
        original = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return  # tomlkit accepted what tomllib refuses; nothing to compare
    assert _rows_sorted(tomllib.loads(formatted)) == _rows_sorted(original)
    assert format_text(formatted) == formatted


def _rows_sorted(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: sorted((_rows_sorted(v) for v in value), key=repr) if k == "rows" and isinstance(value, list) else _rows_sorted(value)
            for k, value in node.items()
        }
    if isinstance(node, list):
        return [_rows_sorted(v) for v in node]
    return node


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(hostile_structures())
def test_lint_verdict_equals_load_on_hostile_structures(case):
    """Deep nesting, long keys and long integers: lint's loader rules fail exactly when load
    refuses (both ways); other rules may find more in a file load accepts (KVP030), never less."""
    from kvpolicy.errors import PolicyError
    from kvpolicy.read.loader import parse_policy

    raw, _ = case
    try:
        parse_policy(raw, "fuzz.toml")
        refused = False
    except PolicyError:
        refused = True
    result = lint_files([load_policy_bytes(raw, "fuzz.toml")])
    loader_errors = [f for f in result.findings if RULES[f.code].kind == "loader" and f.severity == "error"]
    assert bool(loader_errors) == refused, (refused, [f.code for f in result.findings])
    if refused:
        assert result.failed("error") and all(f.location.line >= 1 for f in result.findings)
