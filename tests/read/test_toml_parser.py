"""The policy parser (``kvpolicy.read.source.toml_parser``) accepts and refuses exactly what the standard
library's ``tomllib`` does, with the same data and the same located messages.

kvpolicy parses with tomli's compiled build when it is installed at a TOML 1.0 version (< 2.4), for
speed; the published behaviour stays that of Python 3.11's ``tomllib``. Valid, hostile and malformed
documents (TOML 1.1-only syntax among them) are run through both."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpolicy.read.loader import shipped_root
from kvpolicy.read.source import parse_document, toml_parser

tomllib = pytest.importorskip("tomllib", reason="tomllib is the reference (Python >= 3.11)")

ROOT = Path(__file__).parents[2]
FILES = sorted({*shipped_root().glob("*.toml"), *(ROOT / "tests").rglob("*.toml"), *(ROOT / "examples").rglob("*.toml")})
SHIPPED = [p.read_bytes() for p in sorted(shipped_root().glob("2026.*.toml"))]

#: Documents that are not TOML 1.0, several of them TOML 1.1 (which tomli >= 2.4 would accept).
MALFORMED = [
    'a = { b = "x",\n c = "y" }\n',  # newline inside an inline table (TOML 1.1)
    'a = { b = "x", }\n',  # trailing comma in an inline table (TOML 1.1)
    'a = "\\e"\n',  # \e escape (TOML 1.1)
    'a = "\\x41"\n',  # \xHH escape (TOML 1.1)
    "a = 07:32\n",  # a time without seconds (TOML 1.1)
    "a = 1979-05-27T07:32Z\n",
    "a = 1\na = 2\n",
    "[t]\n[t]\n",
    "a = [1, 2\n",
    'a = "unterminated\n',
    "a = '''never closed\n",
    "= 1\n",
    "a.b = 1\na = 2\n",
    "[[t]]\n[t]\n",
    "a = 1 b = 2\n",
    "a = 0x\n",
    "a = 1__0\n",
    "a = +inf\nb = nan\nc = -0.0\nd = 1e1000\n",  # valid: the odd numbers
    'a = """\\\n  folded \\\n"""\n',  # valid: line-ending backslash
    "a = 1979-05-27 07:32:00.999999999-07:00\n",  # valid: a space-separated datetime
    "\ufeffa = 1\n",  # a byte-order mark
    "a = \"\x7f\"\n",  # a control character
    "a = 1\r\nb = [\r\n 2,\r\n]\r\n",  # valid: CRLF
    "a = 1\rb = 2\n",  # a lone CR
    "a = " + "[" * 30 + "]" * 30 + "\n",  # deep, valid TOML (the bounds refuse it before kvpolicy parses)
]


def outcome(loads: Any, text: str) -> tuple[str, Any]:
    try:
        return "data", loads(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer past the digit limit
        return type(exc).__name__, str(exc)


def same(text: str) -> None:
    parser = toml_parser()
    expected = outcome(tomllib.loads, text)
    got = outcome(parser.loads, text)
    if expected[0] == "data" and got[0] == "data":
        assert repr(got[1]) == repr(expected[1])  # repr: nan == nan and 0.0 vs -0.0 count
    else:
        assert got == expected


@pytest.fixture(autouse=True, scope="module")
def _compiled_parser() -> None:
    if toml_parser() is tomllib:
        pytest.skip("tomli's compiled TOML 1.0 build is not installed (pip install 'tomli>=2.0.1,<2.4'): kvpolicy parses with tomllib itself")


def test_the_parser_is_a_toml_1_0_tomli():
    parser = toml_parser()
    version = tuple(int(part) for part in parser.__version__.split(".")[:2])
    assert parser.__name__ == "tomli" and (2, 0) <= version < (2, 4)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_and_fixture_file(path):
    same(path.read_bytes().decode("utf-8", errors="replace"))


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_and_toml_1_1_documents(text):
    same(text)


def test_a_toml_1_1_document_is_refused_with_its_location():
    with pytest.raises(ValueError, match=r"\(at line 1, column 16\)") as caught:
        toml_parser().loads('a = { b = "x", }\n')
    assert str(caught.value) == outcome(tomllib.loads, 'a = { b = "x", }\n')[1]


@st.composite
def mutated(draw: Any) -> str:
    raw = bytearray(draw(st.sampled_from(SHIPPED)))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(raw) - 1))
        kind = draw(st.sampled_from(("flip", "delete", "insert")))
        if kind == "flip":
            raw[at] = draw(st.integers(0, 127))
        elif kind == "delete":
            del raw[at : at + draw(st.integers(1, 40))]
        else:
            raw[at:at] = draw(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"'", b"=", b",", b"\n", b"\\", b"'''", b'"""', b"#", b".", b"\r"]))
    return raw.decode("utf-8", errors="replace")


toml_values = st.recursive(
    st.one_of(st.booleans(), st.integers(), st.floats(), st.text(max_size=8), st.dates(), st.datetimes(), st.times()),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(min_size=1, max_size=6), children, max_size=3)),
    max_leaves=15,
)


@st.composite
def documents(draw: Any) -> str:
    data = draw(st.dictionaries(st.text(min_size=1, max_size=6), toml_values, max_size=6))
    try:
        return tomlkit.dumps(data)
    except Exception:  # tomlkit refuses some shapes
        return repr(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=st.one_of(mutated(), documents(), st.text(alphabet=st.sampled_from(list('ab1=.[]{}"\',#\n \\e\t')), max_size=60)))
def test_random_and_mutated_documents(text):
    same(text)


def test_a_toml_1_1_tomli_is_not_used(monkeypatch):
    """A tomli that parses TOML 1.1 (>= 2.4) would accept files tomllib refuses: tomllib is used."""
    fake = types.ModuleType("tomli")
    fake.__version__ = "2.4.0"  # type: ignore[attr-defined]
    fake_parser = types.ModuleType("tomli._parser")
    fake_parser.__file__ = "/somewhere/_parser.cpython-311-x86_64-linux-gnu.so"
    fake._parser = fake_parser  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tomli", fake)
    monkeypatch.setitem(sys.modules, "tomli._parser", fake_parser)
    toml_parser.cache_clear()
    try:
        assert toml_parser() is tomllib
    finally:
        monkeypatch.undo()
        toml_parser.cache_clear()
    assert toml_parser().__name__ == "tomli"


def test_a_policy_error_names_the_same_place_either_way():
    text = shipped_root().joinpath("2026.09.10.toml").read_text(encoding="utf-8").replace('summary = "', 'summary = "\\e', 1)
    line = next(i for i, row in enumerate(text.splitlines(), start=1) if "\\e" in row)
    from kvpolicy.read.source import TomlSyntaxError

    with pytest.raises(TomlSyntaxError) as caught:
        parse_document(text.encode(), "p.toml")
    assert caught.value.location.line == line
    with pytest.raises(tomllib.TOMLDecodeError, match=rf"line {line}, column {caught.value.location.column}\)"):
        tomllib.loads(text)
