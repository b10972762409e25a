"""The compiled row validator and the JSON Schema accept and reject the same documents.

Loading checks preference rows with a predicate compiled from the schema's ``row`` definition
and sends only the rest of the document through jsonschema; the JSON Schema stays the published
contract, so both must agree on every row and report the same problems for every document.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpolicy.read.policyfile import shipped_root
from kvpolicy.read.schema import _validator, compiled_document_validator, compiled_row_validator, schema, schema_problems
from kvpolicy.read.source import parse_document

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Strings that pass and fail each row field's pattern and length; values of every JSON type.
STRINGS = st.sampled_from(("LlamaForCausalLM", "_x9", "9Llama", "a-b", "", " ", "PYTHON", "CPP", "V2", "é", "x\n"))
VALUES = st.one_of(STRINGS, st.integers(-2, 2), st.booleans(), st.floats(allow_nan=False), st.just([]), st.just({}))
KEYS = st.sampled_from(("architecture", "model_type", "value", "reason", "source", "extra", "Architecture"))
ROWS = st.one_of(st.dictionaries(KEYS, VALUES, max_size=6), VALUES)


def row_validator() -> jsonschema.Draft202012Validator:
    spec = schema()
    return jsonschema.Draft202012Validator({"$defs": spec["$defs"], "$ref": "#/$defs/row"})


def test_the_shipped_schema_compiles():
    assert compiled_row_validator() is not None


@SETTINGS
@given(row=ROWS)
def test_compiled_row_check_agrees_with_the_schema(row: Any):
    check, _ = compiled_row_validator()
    assert check(row) == row_validator().is_valid(row)


def test_known_rows():
    check, most = compiled_row_validator()
    assert check({"architecture": "LlamaForCausalLM", "value": "PYTHON"})
    assert check({"architecture": "A", "model_type": "t", "value": "V2", "reason": "r", "source": "s"})
    assert not check({"architecture": "A"})  # value missing
    assert not check({"architecture": "9A", "value": "PYTHON"})  # pattern
    assert not check({"architecture": "A", "value": "PYTHON", "reason": ""})  # minLength
    assert not check({"architecture": "A", "value": "PYTHON", "extra": 1})  # additionalProperties
    assert not check(["A", "PYTHON"])
    assert most == 100_000


def document_with_rows(rows_text: str) -> bytes:
    text = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")
    header = text.index("[decisions.transceiver_runtime.preference]")
    anchor = text.index("rows = [\n", header) + len("rows = [\n")
    return (text[:anchor] + rows_text + text[anchor:]).encode()


ROW_TEXTS = st.sampled_from(
    (
        '  { architecture = "Synth1ForCausalLM", value = "PYTHON" },\n',
        '  { architecture = "Synth2ForCausalLM", value = "CPP", reason = "r", source = "s" },\n',
        '  { architecture = "9Bad", value = "PYTHON" },\n',
        '  { architecture = "Synth3ForCausalLM" },\n',
        '  { architecture = "Synth4ForCausalLM", value = "PYTHON", colour = "red" },\n',
        '  { architecture = "Synth5ForCausalLM", value = "PY THON" },\n',
        '  { architecture = "Synth6ForCausalLM", value = 3 },\n',
        '  { architecture = "Synth7ForCausalLM", value = "CPP", model_type = "" },\n',
        '  "Synth8ForCausalLM",\n',
    )
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(ROW_TEXTS, max_size=4))
def test_documents_get_the_same_problems_either_way(rows: list[str]):
    document = parse_document(document_with_rows("".join(rows)), "p.toml")
    fast = schema_problems(document)
    whole = schema_problems(document, compiled_rows=False)
    assert [(p.location, p.check, p.message) for p in fast] == [(p.location, p.check, p.message) for p in whole]


def test_too_many_rows_are_reported_by_the_schema():
    document = parse_document(document_with_rows(""), "p.toml")
    rows = document.data["decisions"]["transceiver_runtime"]["preference"]["rows"]
    rows.extend([{"architecture": "A", "value": "PYTHON"}] * (100_001 - len(rows)))
    fast = [p.message for p in schema_problems(document)]
    assert fast == [p.message for p in schema_problems(document, compiled_rows=False)]
    assert any("at most 100000" in m for m in fast)


# -- the whole document ------------------------------------------------------------------------------
SHIPPED_DATA = [
    parse_document(path.read_bytes(), path.name).data
    for path in sorted(shipped_root().glob("*.toml"))
    if not path.name.endswith(".cases.toml")
]
ANY = st.one_of(VALUES, st.lists(STRINGS, max_size=3), st.lists(VALUES, max_size=2), st.dictionaries(KEYS, STRINGS, max_size=2))


def test_the_whole_schema_compiles_and_accepts_every_shipped_policy():
    accept = compiled_document_validator()
    assert accept is not None
    assert all(accept(data) for data in SHIPPED_DATA)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node[:3]):
            found += _paths(value, prefix + (index,))
    return found


def _mutate(data: Any, path: tuple, how: str, value: Any) -> Any:
    if not path:
        return value if how == "replace" else data
    head, rest = path[0], path[1:]
    copy = dict(data) if isinstance(data, dict) else list(data)
    if rest:
        copy[head] = _mutate(copy[head], rest, how, value)
    elif how == "replace":
        copy[head] = value
    elif how == "delete":
        del copy[head]
    elif how == "add" and isinstance(copy, dict):
        copy[f"{head}_extra" if isinstance(head, str) else "extra"] = value
    elif how == "add":
        copy.append(value)
    return copy


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), which=st.integers(0, 10**6), how=st.sampled_from(("replace", "delete", "add")), value=ANY)
def test_the_compiled_document_check_never_accepts_what_the_schema_refuses(data, which, how, value):
    # A "no" sends the document to jsonschema (verdict and messages); a "yes" must be right.
    document = SHIPPED_DATA[which % len(SHIPPED_DATA)]
    paths = _paths(document)
    path = paths[data.draw(st.integers(0, len(paths) - 1))]
    mutated = _mutate(document, path, how, value)
    accepted = compiled_document_validator()(mutated)
    valid = _validator().is_valid(mutated)
    if accepted:
        assert valid
    if valid and not accepted:
        # The only misses allowed (they cost a jsonschema run, never a wrong verdict): uniqueItems
        # over values that are not all strings, ``schema = 1.0``. Over the shipped documents'
        # own strings, deletions and string values, the compiled check is exact.
        assert how != "delete" and not isinstance(value, str)
