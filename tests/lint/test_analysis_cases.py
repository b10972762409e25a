"""Small hand-written policies for cases of the constraints stage of the exact analysis that the
shipped policies and the generated ones may not reach, each compared with the frozen oracle
(``tests/lint/analysis_oracle.py``, the enumeration of every context) and checked directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpolicy.lint import precedence
from kvpolicy.read.loader import parse_policy

from tests.lint.analysis_oracle import oracle_analyse
from tests.support.analysis import compare
from tests.support.policies import three_decisions

#: Three decisions with nothing but a default: every input a constraint reads stays free at the
#: constraints stage (no decision reads it), and the requests give a few final states.
DECISIONS = three_decisions(summary="analysis cases", features={"f1": None, "f2": None}, runtime_default="PYTHON")


def _policy(tmp_path: Path, constraints: str) -> Any:
    path = tmp_path / "policy.toml"
    path.write_text(DECISIONS + constraints)
    return parse_policy(path.read_bytes(), str(path))


def _items(witness: dict[str, Any]) -> list[tuple[str, Any]]:
    return list(witness.items())  # key order included


#: The error constraint reads two free inputs (f1 and f2: one group of two blocks), with a free
#: input before them (the variable A, read by a warning) and one after (the timeout).
TWO_FREE_INPUTS = """
[[constraints]]
id = "a-variable"
severity = "warning"
when = { env = { A = "1" } }
message = "no"
fix = "no"

[[constraints]]
id = "b-features"
severity = "error"
when = { features = { f1 = true, f2 = false }, backend = "NIXL" }
message = "no"
fix = "no"

[[constraints]]
id = "c-timeout"
severity = "warning"
when = { kv_transfer_timeout_ms = "null" }
message = "no"
fix = "no"
"""


def test_every_witness_of_a_family_over_two_free_inputs_in_enumeration_order(tmp_path: Path) -> None:
    """Reading a KVP030 family's witnesses in full (iteration, indexing, equality) walks the
    product of the firing assignments of the constraint's group (two inputs, read together) with
    the inputs before and after it: every witness, in the order the enumeration met them."""
    policy = _policy(tmp_path, TWO_FREE_INPUTS)
    family = ("b-features", "backend", "backend-default", ())
    witnesses = precedence.analyse(policy).rejected[family]
    expected = oracle_analyse(policy).rejected[family]
    assert len(witnesses) == len(expected) == 16
    assert [_items(w) for w in witnesses] == [_items(w) for w in expected]
    assert witnesses == expected and witnesses[5] == expected[5] and witnesses[-1] == expected[-1]
    # In each state: A, then the timeout, vary around f1 on and f2 off; sizes follow.
    first = [(w["env:A"], w["feature:f1"], w["feature:f2"], w["kv_transfer_timeout_ms"], w["#size"]) for w in list(witnesses)[:4]]
    assert first == [("", True, False, 60000, 1), ("", True, False, None, 2), ("1", True, False, 60000, 3), ("1", True, False, None, 4)]


#: The variable E: "", "x", then any other value (named "" by a-set): a-set fires on "x" and on
#: any other value, of equal weight, and any other value sorts before "x" as a string.
OTHER_VALUE = """
[[constraints]]
id = "a-set"
severity = "warning"
when = { env = { E = { not = "" } } }
message = "no"
fix = "no"

[[constraints]]
id = "b-x"
severity = "warning"
when = { env = { E = "x" } }
message = "no"
fix = "no"
"""


def test_constraint_witness_is_the_first_of_its_lightest_firing_values_not_the_least_value(tmp_path: Path) -> None:
    """A constraint's witness is the first smallest context where it fires, in enumeration order
    (E = "x" before any other value), whatever order the values themselves sort in."""
    policy = _policy(tmp_path, OTHER_VALUE)
    result = precedence.analyse(policy)
    expected = oracle_analyse(policy)
    assert [(k, _items(w)) for k, w in result.constraints.items()] == [(k, _items(w)) for k, w in expected.constraints.items()]
    assert result.constraints["a-set"]["env:E"] == "x"
    assert result.constraints["a-set"]["#size"] == 2


def _same_as_oracle(policy: Any) -> Any:
    """The analysis's constraint witnesses and families agree with the oracle's, entries in order."""
    result = precedence.analyse(policy)
    expected = oracle_analyse(policy)
    assert [(k, _items(w)) for k, w in result.constraints.items()] == [(k, _items(w)) for k, w in expected.constraints.items()]
    assert list(result.rejected) == list(expected.rejected)
    for family, witnesses in result.rejected.items():
        assert len(witnesses) == len(expected.rejected[family])
        assert [_items(w) for w in witnesses] == [_items(w) for w in expected.rejected[family]]
    return result


#: ArchA and ArchB prefer V1 alike but for the model type m: ArchA's second row (V2) decides there.
PREFERENCE_BY_MODEL_TYPE = """
[decisions.kv_cache_manager.preference]
id = "manager-preference"
rows = [
  { architecture = "ArchA", value = "V1" },
  { architecture = "ArchA", model_type = "m", value = "V2" },
  { architecture = "ArchB", value = "V1" },
  { architecture = "ArchB", model_type = "m", value = "V1" },
]

[[constraints]]
id = "v2-manager"
severity = "warning"
when = { kv_cache_manager = "V2" }
message = "no"
fix = "no"
"""


def test_architectures_that_differ_only_in_a_model_type_row_are_told_apart(tmp_path: Path) -> None:
    """Every row used (the first plain one and the first per model type) sets an architecture's
    class: two architectures whose tables differ in a model type's row alone do not share one."""
    policy = _policy(tmp_path, PREFERENCE_BY_MODEL_TYPE)
    assert precedence.preference_table(policy.decisions["kv_cache_manager"])["ArchA"] == [(None, "V1"), ("m", "V2")]
    compare(policy)
    result = _same_as_oracle(policy)
    assert result.constraints["v2-manager"]["architecture"] == "ArchA"


def test_witnesses_equal_a_list_only_of_the_same_length(tmp_path: Path) -> None:
    """A family's witnesses equal the list of the same witnesses, and no shorter or longer list
    (nor one that differs in a witness)."""
    policy = _policy(tmp_path, TWO_FREE_INPUTS)
    witnesses = precedence.analyse(policy).rejected[("b-features", "backend", "backend-default", ())]
    every = list(witnesses)
    assert witnesses == every and witnesses == tuple(every)
    assert witnesses != every[:-1] and witnesses != every[:1] and witnesses != [] and witnesses != every + every[:1]
    assert witnesses != every[1:] + every[:1]


#: The feature f3 turns on with the variable Z. The backend reads Y and Z (so each final state
#: fixes them); a-z-set fires wherever Y is set and Z is "1": first with Y = "a", then with any
#: other Y, of the same size, where f3 (free, read by b-f3) must be on in both.
FORCED_FEATURE = """
[features.f3]
description = "three"
env = "Z"

[[decisions.backend.requirement]]
id = "backend-y-z"
when = { env = { Y = "a", Z = "1" } }
value = "UCX"

[[constraints]]
id = "a-z-set"
severity = "warning"
when = { env = { Y = { not = "" }, Z = "1" } }
message = "no"
fix = "no"

[[constraints]]
id = "b-f3"
severity = "warning"
when = { features = { f3 = true } }
message = "no"
fix = "no"
"""


def test_constraint_witness_is_not_replaced_by_a_later_one_of_the_same_size(tmp_path: Path) -> None:
    """A later final state replaces a constraint's witness only with a smaller one, counting the
    least weight of the inputs the constraint does not read (here f3, on wherever Z is "1")."""
    policy = _policy(tmp_path, FORCED_FEATURE)
    result = _same_as_oracle(policy)
    assert result.constraints["a-z-set"]["env:Y"] == "a"
    assert result.constraints["a-z-set"]["feature:f3"] is True


#: Two adjustments of the manager, both firing where A and B are "1": the first (V2) wins, and the
#: error judges the manager (its KVP030 families name the rule that decided).
TWO_ADJUSTMENTS = """
[[decisions.kv_cache_manager.adjustment]]
id = "a-v2"
when = { env = { A = "1" } }
value = "V2"

[[decisions.kv_cache_manager.adjustment]]
id = "b-v1"
when = { env = { B = "1" } }
value = "V1"

[[constraints]]
id = "v2-with-b"
severity = "error"
when = { kv_cache_manager = "V2", env = { B = "1" } }
message = "no"
fix = "no"
"""


def test_the_first_adjustment_that_fires_decides(tmp_path: Path) -> None:
    """Adjustments of one decision are tried in order and the first that fires decides: V2 (from
    A) with B set, which a later adjustment would have turned back into V1."""
    policy = _policy(tmp_path, TWO_ADJUSTMENTS)
    compare(policy)
    result = _same_as_oracle(policy)
    family = next(f for f in result.rejected if f[2] == "a-v2")
    assert {(w["env:A"], w["env:B"]) for w in result.rejected[family]} == {("1", "1")}
