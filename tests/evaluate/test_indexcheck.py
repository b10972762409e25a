"""The check of a decision index read back from the cache (:mod:`kvpolicy.evaluate.indexcheck`):
it trusts nothing it reads. Found unchecked by mutation testing (``make mutate``): a cached index of
the wrong shape, with a field missing or a value outside its domain, was trusted."""

from __future__ import annotations

import json

import pytest

import kvpolicy
from kvpolicy.evaluate.index import build_index
from kvpolicy.evaluate.indexcheck import check_index

from tests.support.constants import VERSIONS

# -- the compiled-policy cache trusts nothing it reads back ----------------------------------------


def _fresh(version: str) -> dict:
    return json.loads(json.dumps(build_index(kvpolicy.load(version=version).policy)))


def _paths(value, path=()):
    """Every position in index data: (path, value), containers and leaves alike."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for number, item in enumerate(value):
            yield from _paths(item, (*path, number))


def _wrong_type(value):
    """A JSON value of a type ``value`` never has where it stands."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, str):
        return 7
    if isinstance(value, int):
        return "7"
    if isinstance(value, list):
        return {}
    if isinstance(value, dict):
        return []
    return 7  # in place of None: no optional position takes a number


def _replaced(data: dict, path: tuple, value) -> dict:
    copy = json.loads(json.dumps(data))
    parent = copy
    for step in path[:-1]:
        parent = parent[step]
    if value is _DROP:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return copy


_DROP = object()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_shipped_versions_index_passes_the_check_its_cache_entry_gets(version):
    # A check stricter than build_index would make every load of that version a cache miss.
    check_index(_fresh(version))


@pytest.mark.parametrize("version", [VERSIONS[0], "2026.07.23", VERSIONS[-1]])
def test_a_cached_index_with_any_value_of_the_wrong_type_is_refused(version):
    data = _fresh(version)
    trusted = [path for path, value in _paths(data) if path and _try(_replaced(data, path, _wrong_type(value)))]
    assert trusted == []


@pytest.mark.parametrize("version", [VERSIONS[0], "2026.07.23", VERSIONS[-1]])
def test_a_cached_index_missing_any_field_is_refused(version):
    data = _fresh(version)
    fields = [path for path, _ in _paths(data) if path and isinstance(path[-1], str) and "plain" not in path]
    assert fields, "the index has fields"
    assert [path for path in fields if _try(_replaced(data, path, _DROP))] == []


def _try(data: dict) -> bool:
    """Whether ``check_index`` accepts ``data``."""
    try:
        check_index(data)
    except ValueError:
        return False
    return True


def _first(data: dict, name: str) -> dict:
    return next(d for d in data["decisions"] if d["name"] == name)


def _with_rows(data: dict) -> dict:
    return next(d for d in data["decisions"] if d["rows"] and d["rows"]["qualified"])


OUT_OF_DOMAIN = {
    "an unknown subject": lambda d: _first(d, "backend")["default"]["when"]["subjects"].append(["gpu", ["H200"], False]),
    "a condition with a test of another kind": lambda d: _first(d, "backend")["default"]["when"].update(gpu=[]),
    "a subject matching no value": lambda d: _first(d, "backend")["default"]["when"]["subjects"].append(["backend", [], False]),
    "a timeout test of another kind": lambda d: _first(d, "backend")["default"]["when"].update(timeout="soon"),
    "a constraint of another severity": lambda d: d["constraints"][0].update(severity="fatal"),
    "a constraint on no decision the index has": lambda d: d["constraints"][0].update(decision="scheduler"),
    "a decision of another name": lambda d: _first(d, "kv_cache_manager").update(name="scheduler"),
    "the same decision twice": lambda d: d["decisions"].append(d["decisions"][0]),
    "no decision at all": lambda d: d.update(decisions=[]),
    "no decision and nothing that names one": lambda d: d.update(decisions=[], constraints=[]),
    "a notice of another severity": lambda d: _first(d, "transceiver_runtime")["default"].update(notice=["n", "loud", "x", "text"]),
    "a message reading an attribute": lambda d: d["constraints"][0].update(message="{backend.__class__}"),
    "a message with a format spec": lambda d: d["constraints"][0].update(fix="{backend:>999999999}"),
    "a message naming an unknown placeholder": lambda d: d["constraints"][0].update(message="{os}"),
    "a qualified row of three fields": lambda d: _with_rows(d)["rows"]["qualified"].append(["A", "b", "C"]),
    "a plain row of three fields": lambda d: _with_rows(d)["rows"]["plain"].update(A=["CPP", "rule", "x"]),
    "a checkpoint rule of four fields": lambda d: d["checkpoint_rules"].append(["LlamaForCausalLM", ["llama"], None, "x"]),
    "another format": lambda d: d.update(format=d["format"] + 1),
    "a rule with a field build_index never writes": lambda d: _first(d, "backend")["default"].update(origin="cache"),
}


@pytest.mark.parametrize("change", OUT_OF_DOMAIN, ids=list(OUT_OF_DOMAIN))
def test_a_cached_index_with_a_value_outside_its_domain_is_refused(change):
    data = _fresh("2026.07.23")  # a version with model_type (qualified) rows
    OUT_OF_DOMAIN[change](data)
    assert not _try(data)
