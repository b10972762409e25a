"""Location, PolicyProblem and the typed model behave as the frozen dataclasses and pydantic
models they replaced: equal by value, hashable, immutable, picklable, with the same repr."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from kvpolicy import Location, PolicyProblem
from kvpolicy.read.model import Condition, Matcher, Row, as_data, as_json


def test_location_is_a_value():
    here = Location("p.toml", 3, 7)
    assert here == Location("p.toml", line=3, column=7) and hash(here) == hash(Location("p.toml", 3, 7))
    assert here != Location("p.toml", 3, 8) and here != ("p.toml", 3, 7)
    assert Location("p.toml") == Location("p.toml", 1, 1)
    assert str(here) == "p.toml:3:7" and repr(here) == "Location(path='p.toml', line=3, column=7)"
    with pytest.raises(AttributeError):
        here.line = 4  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(here)) == here and copy.deepcopy(here) == here
    match here:
        case Location(path, line, column):
            assert (path, line, column) == ("p.toml", 3, 7)


def test_policy_problem_is_a_value():
    problem = PolicyProblem(Location("p.toml", 2), "schema", "bad")
    assert str(problem) == "p.toml:2:1: schema: bad"
    assert problem == PolicyProblem(location=Location("p.toml", 2), check="schema", message="bad")
    assert len({problem, PolicyProblem(Location("p.toml", 2), "schema", "bad")}) == 1
    with pytest.raises(TypeError):
        PolicyProblem(Location("p.toml"), "schema")  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        problem.check = "toml"  # type: ignore[misc]


def test_models_are_plain_frozen_dataclasses_given_as_data(newest):
    row = Row(id="p[A]", architecture="A", value="PYTHON", location=Location("p.toml"), path=("rows", 0))
    assert row == Row(id="p[A]", architecture="A", value="PYTHON", location=Location("p.toml"), path=("rows", 0))
    assert not any(name.startswith("model_") and name != "model_type" for name in dir(row)), "no borrowed pydantic names"
    assert row.model_type is None and hash(row) == hash(copy.copy(row))
    with pytest.raises(AttributeError):
        row.value = "CPP"  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(Condition)] == ["subjects", "timeout", "features", "env", "requested"]
    assert Condition().empty and Condition().subjects == {} and Condition().subjects is not Condition().subjects
    assert as_data(Condition(subjects={"architecture": Matcher(values=frozenset({"A"}))})) == {
        "subjects": {"architecture": {"values": ["A"], "negate": False}},
        "timeout": None,
        "features": {},
        "env": {},
        "requested": {},
    }
    assert '"version": "' in as_json(newest.policy)
