"""Small hand-written policies for cases of the constraints stage of the exact analysis that the
shipped policies and the generated ones may not reach, each compared with the frozen oracle
(``tests/lint/analysis_oracle.py``, the enumeration of every context) and checked directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpolicy.lint import analysis
from kvpolicy.read.loader import parse_policy

from tests.lint.analysis_oracle import oracle_analyse

#: Three decisions with nothing but a default: every input a constraint reads stays free at the
#: constraints stage (no decision reads it), and the requests give a few final states.
DECISIONS = """
schema = 1
version = "2026.01.01"
summary = "analysis cases"
source = "test"

[features.f1]
description = "one"

[features.f2]
description = "two"

[decisions.backend]
description = "backend"
values = ["NIXL", "UCX"]
auto = "auto"
default = { id = "backend-default", value = "NIXL" }

[decisions.transceiver_runtime]
description = "transceiver_runtime"
values = ["CPP", "PYTHON"]
auto = "auto"
default = { id = "runtime-default", value = "PYTHON" }

[decisions.kv_cache_manager]
description = "kv_cache_manager"
values = ["V1", "V2"]
auto = "auto"
default = { id = "manager-default", value = "V1" }
"""


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
    witnesses = analysis.analyse(policy).rejected[family]
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
    result = analysis.analyse(policy)
    expected = oracle_analyse(policy)
    assert [(k, _items(w)) for k, w in result.constraints.items()] == [(k, _items(w)) for k, w in expected.constraints.items()]
    assert result.constraints["a-set"]["env:E"] == "x"
    assert result.constraints["a-set"]["#size"] == 2
