"""Source positions: every key and array element of a policy file has a line and column."""

from __future__ import annotations

import pytest

from kvpolicy.source import TomlSyntaxError, parse_document

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
