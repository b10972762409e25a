"""``kvpolicy.analyse.edit``: what changed in the files, part by part, on shipped and edited versions."""

from __future__ import annotations

import dataclasses

from kvpolicy.analyse.edit import edit_between


def by_id(edit):
    return {(c.kind, c.id): c for c in edit.changes}


def test_equal_versions_have_no_edit(shipped) -> None:
    edit = edit_between(shipped["2026.09.10"], shipped["2026.09.10"])
    assert not edit and edit.changes == () and edit.summary() == "nothing changed in the rules"


def test_rows_rules_and_the_default_of_the_python_by_default_flip(shipped) -> None:
    edit = edit_between(shipped["2026.08.18"], shipped["2026.08.24"])
    # The hybrids' PYTHON rows are in both (#16598, 07-28); their V2 rows are new with this version.
    assert edit.summary() == "1 preference changed, 6 rows added, 2 conditional rules added, 1 default changed"
    changes = by_id(edit)
    # The default is matched by its decision: its id changes with its value.
    default = changes[("default", "runtime-default-python")]
    assert default.sign == "~" and ("value", "CPP", "PYTHON") in default.fields
    assert ("id", "runtime-default-cpp", "runtime-default-python") in default.fields
    assert {"runtime-default-cpp", "runtime-default-python"} <= default.names
    assert ("row", "runtime-preference[NemotronHForCausalLM]") not in changes
    row = changes[("row", "kv-cache-manager-preference[NemotronHForCausalLM]")]
    assert row.sign == "+" and row.fields == (("value", None, "V2"),) and row.location.endswith("2026.08.24.toml:150")
    assert row.text() == "+ row kv-cache-manager-preference[NemotronHForCausalLM]: value V2"
    assert row.reason and row.source
    conditional = changes[("conditional", "auto-cpp-off-nixl")]
    assert conditional.sign == "+" and ("when", None, "backend is not NIXL") in conditional.fields
    # A preference now adopted everywhere may change any of its rows' contexts.
    preference = changes[("preference", "runtime-preference")]
    assert ("adopt when", "backend is NIXL", "always") in preference.fields
    assert "runtime-preference[LlamaForCausalLM]" in preference.names


def test_constraints_and_adjustments(shipped) -> None:
    edit = edit_between(shipped["2026.08.24"], shipped["2026.09.02"])
    assert edit.summary() == "1 adjustment added, 3 constraints added, 1 constraint removed"
    signs = {(c.kind, c.sign) for c in edit.changes}
    assert signs == {("adjustment", "+"), ("constraint", "+"), ("constraint", "-")}
    assert all(c.names for c in edit.changes)


def test_checkpoint_rules_are_part_of_the_edit(shipped) -> None:
    edit = edit_between(shipped["2026.08.03"], shipped["2026.08.07"])
    rule = by_id(edit)[("checkpoint rule", "kimi-k3-text-checkpoint")]
    assert rule.text() == "+ checkpoint rule kimi-k3-text-checkpoint: model_type kimi_k3 or kimi_linear loads as KimiLinearForCausalLM"


def test_a_reworded_reason_is_a_change_that_causes_nothing(shipped) -> None:
    old = shipped["2026.09.10"].policy
    decision = old.decisions["transceiver_runtime"]
    rows = list(decision.preference.rows)
    rows[0] = dataclasses.replace(rows[0], reason="reworded")
    preference = dataclasses.replace(decision.preference, rows=tuple(rows))
    new = dataclasses.replace(old, decisions={**old.decisions, "transceiver_runtime": dataclasses.replace(decision, preference=preference)})
    (change,) = edit_between(old, new).changes
    assert change.sign == "~" and change.kind == "row" and change.fields == (("reason", decision.preference.rows[0].reason, "reworded"),)
    assert change.names == frozenset()
    assert change.detail_lines()[0] == f"reason: reworded (was: {decision.preference.rows[0].reason})"


def test_a_new_order_of_conditional_rules_is_a_change(shipped) -> None:
    old = shipped["2026.09.10"].policy
    decision = old.decisions["transceiver_runtime"]
    assert len(decision.conditionals) >= 2
    swapped = dataclasses.replace(decision, conditionals=tuple(reversed(decision.conditionals)))
    new = dataclasses.replace(old, decisions={**old.decisions, "transceiver_runtime": swapped})
    (change,) = edit_between(old, new).changes
    assert (change.sign, change.kind, change.id) == ("~", "conditional", "order")
    assert change.names >= {r.id for r in decision.conditionals}


def test_ten_thousand_rows_with_one_percent_changed_give_one_change_per_row() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from resolve import generated_policy

    from kvpolicy.read.loader import parse_policy

    old = parse_policy(generated_policy(10_000)[0], "old.toml")
    new = parse_policy(generated_policy(10_000, changed_every=100)[0], "new.toml")
    edit = edit_between(old, new)
    assert edit.summary() == "100 rows changed"
    assert all(c.kind == "row" and c.fields[0][0] == "value" for c in edit.changes)
    lines = [c.location for c in edit.changes]
    assert lines == sorted(lines, key=lambda where: int(where.rsplit(":", 1)[1]))  # file order
