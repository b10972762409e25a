"""Source positions: every key and array element of a policy file has a line and column."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvpolicy.errors import PolicyError
from kvpolicy.read.loader import shipped_root
from kvpolicy.read.scan import SourceMap, check_text
from kvpolicy.read.source import TomlSyntaxError, parse_document

from tests.read import reference_scanner

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TEXT = """\
# comment
schema = 1
name = "a # not a comment"

[decisions.backend]
values = ["NIXL",
  "UCX"]
default = { id = "x", value = "NIXL" }

[[constraints]]
id = "first"
multi = '''
line [ { "
'''

[[constraints]]
id = "second"
when = { env.VAR = "1", features.a = true }
rows = [
  { architecture = "A", value = "PYTHON" },  # trailing
  { architecture = "B", value = "CPP" },
]
"""


@pytest.fixture(scope="module")
def document():
    return parse_document(TEXT.encode(), "p.toml")


@pytest.mark.parametrize(
    ("path", "line", "column"),
    [
        (("schema",), 2, 1),
        (("decisions", "backend"), 5, 1),
        (("decisions", "backend", "values", 1), 7, 3),
        (("decisions", "backend", "default", "value"), 8, 23),
        (("constraints", 0, "id"), 11, 1),
        (("constraints", 1), 16, 1),
        (("constraints", 1, "id"), 17, 1),
        (("constraints", 1, "when", "env", "VAR"), 18, 10),
        (("constraints", 1, "when", "features", "a"), 18, 25),
        (("constraints", 1, "rows", 1), 21, 3),
        (("constraints", 1, "rows", 1, "value"), 21, 25),
    ],
)
def test_positions_of_keys_and_elements(document, path, line, column):
    location = document.locate(path)
    assert (location.line, location.column) == (line, column)
    assert document.data["schema"] == 1


def test_unknown_path_falls_back_to_nearest_ancestor(document):
    assert document.locate(("constraints", 1, "rows", 0, "nope")) == document.locate(("constraints", 1, "rows", 0))


def test_syntax_error_carries_its_position():
    with pytest.raises(TomlSyntaxError) as info:
        parse_document(b'a = 1\nb = [1,\nc = "x"\n', "bad.toml")
    assert info.value.location.path == "bad.toml"
    assert info.value.location.line == 3
    assert "invalid TOML" in info.value.reason


def test_non_utf8_is_located():
    with pytest.raises(TomlSyntaxError) as info:
        parse_document(b'a = 1\nb = "\xff"\n', "bin.toml")
    assert (info.value.location.line, info.value.location.column) == (2, 6)


def test_suppressions_by_line():
    document = parse_document(b'a = 1  # kvpolicy: ignore[kvp001, KVP002] why\nb = 2\n', "s.toml")
    assert document.suppressions() == {1: frozenset({"KVP001", "KVP002"})}


# -- the one-pass source map against the character-by-character scanner it replaced ------------------

ROOT = Path(__file__).parents[2]


def one_pass(raw: bytes) -> dict[tuple[Any, ...], tuple[int, int]] | None:
    """The source map the bounds pass records, completed; None where the bounds refuse the text."""
    source_map = SourceMap()
    try:
        check_text(raw, "p.toml", source_map)
    except PolicyError:
        return None
    return source_map.complete()


def test_the_sample_maps_like_the_reference_scanner():
    assert one_pass(TEXT.encode()) == reference_scanner.scan(TEXT)


def _mappable_files() -> list[Path]:
    """Every TOML file of the repository that the bounds accept (the rest, malformed or hostile
    fixtures, have nothing to locate)."""
    found = []
    for path in sorted({*shipped_root().glob("*.toml"), *(ROOT / "tests").rglob("*.toml"), *(ROOT / "examples").rglob("*.toml")}):
        raw = path.read_bytes()
        try:
            tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if one_pass(raw) is not None:
            found.append(path)
    return found


MAPPABLE = _mappable_files()


def test_the_repository_has_files_to_map():
    assert len(MAPPABLE) >= 20  # the shipped policies alone are 14


@pytest.mark.parametrize("path", MAPPABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_valid_file_maps_like_the_reference_scanner(path):
    raw = path.read_bytes()
    assert one_pass(raw) == reference_scanner.scan(raw.decode("utf-8"))


def test_row_keys_are_located_on_first_ask():
    document = parse_document(TEXT.encode(), "p.toml")
    assert ("constraints", 1, "rows", 1, "value") not in document._positions  # not located yet
    assert document.locate(("constraints", 1, "rows", 1, "value")) == document.locate(("constraints", 1, "rows", 1, "value"))
    assert document.positions[("constraints", 1, "rows", 0, "architecture")] == (20, 5)


_space = st.sampled_from(["", " ", "  ", "\t"])
_bare = st.sampled_from(["a", "b", "rows", "value", "x-y", "k_1", "1", "architecture"])
_key_part = st.one_of(
    _bare,
    st.sampled_from(['"a.b"', '"q r"', "'lit'", '"="', '"#"', '"[x]"', '"e\\"q"', '"{"']),
)


@st.composite
def _keys(draw: Any) -> str:
    parts = draw(st.lists(_key_part, min_size=1, max_size=3))
    return draw(st.sampled_from([".", " . ", "."])).join(parts)


_strings = st.sampled_from(
    ['"s"', '"a = \\"b\\""', '"x, y]}"', '""', "'lit # not a comment'", '"tab\\t"', '"k = \\"v\\", w = 1"', '"\\\\"']
)
_scalars = st.one_of(
    _strings,
    st.sampled_from(["1", "-2", "+3", "1_000", "0x1F", "1.5", "-1e3", "true", "false", "inf", "nan",
                     "1979-05-27", "1979-05-27T07:32:00Z", "1979-05-27 07:32:00", "07:32:00",
                     '"""multi\nline ] } "quoted"\n"""', "'''lit\n[x]\n'''"]),
)


def _values(depth: int) -> st.SearchStrategy[str]:
    if depth == 0:
        return _scalars
    inner = _values(depth - 1)

    @st.composite
    def array(draw: Any) -> str:
        items = draw(st.lists(inner, max_size=4))
        seps = [draw(st.sampled_from([", ", ",", " ,\n  ", ",  # c\n ", ",\n"])) for _ in items]
        body = "".join(item + sep for item, sep in zip(items, seps))
        if items and not draw(st.booleans()):
            body = body[: -len(seps[-1])]  # no trailing comma
        return "[" + draw(st.sampled_from(["", " ", "\n  "])) + body + draw(st.sampled_from(["", " ", "\n"])) + "]"

    @st.composite
    def table(draw: Any) -> str:
        keys = draw(st.lists(_bare, max_size=4, unique=True))
        pairs = [f"{k}{draw(_space)}={draw(_space)}{draw(inner)}" for k in keys]
        return "{" + draw(_space) + ("," + draw(_space)).join(pairs) + draw(_space) + "}"

    return st.one_of(inner, array(), table())


@st.composite
def documents(draw: Any) -> str:
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["pair", "pair", "table", "array", "comment", "blank"]))
        if kind == "pair":
            lines.append(f"{draw(_space)}{draw(_keys())}{draw(_space)}={draw(_space)}{draw(_values(2))}{draw(st.sampled_from(['', '  # c']))}")
        elif kind == "table":
            lines.append(f"{draw(_space)}[{draw(_space)}{draw(_keys())}{draw(_space)}]")
        elif kind == "array":
            lines.append(f"[[{draw(_space)}{draw(_keys())}{draw(_space)}]]{draw(st.sampled_from(['', ' # c']))}")
        elif kind == "comment":
            lines.append("# a comment with = [ { \" '")
        else:
            lines.append("")
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n"]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(text=documents())
def test_random_documents_map_like_the_reference_scanner(text):
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        assume(False)
    found = one_pass(text.encode())
    assume(found is not None)
    assert found == reference_scanner.scan(text)
