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

from kvpolicy.loader import _schema_problems, compiled_row_validator, schema, shipped_root
from kvpolicy.source import parse_document

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
    fast = _schema_problems(document)
    whole = _schema_problems(document, compiled_rows=False)
    assert [(p.location, p.check, p.message) for p in fast] == [(p.location, p.check, p.message) for p in whole]


def test_too_many_rows_are_reported_by_the_schema():
    document = parse_document(document_with_rows(""), "p.toml")
    rows = document.data["decisions"]["transceiver_runtime"]["preference"]["rows"]
    rows.extend([{"architecture": "A", "value": "PYTHON"}] * (100_001 - len(rows)))
    fast = [p.message for p in _schema_problems(document)]
    assert fast == [p.message for p in _schema_problems(document, compiled_rows=False)]
    assert any("at most 100000" in m for m in fast)
