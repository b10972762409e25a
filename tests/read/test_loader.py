"""Broken policies raise PolicyError naming file:line:col and what to change, every problem at once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kvpolicy
from kvpolicy import PolicyError

from tests.support.constants import NEWEST_AUTO, VERSIONS
from tests.support.policies import write


def problems(tmp_path: Path, text: str) -> list[kvpolicy.PolicyProblem]:
    with pytest.raises(PolicyError) as info:
        kvpolicy.load(write(tmp_path, text))
    return list(info.value.problems)


def line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def test_shipped_versions_load_and_are_ordered(shipped):
    assert [s.version for s in shipped.values()] == list(VERSIONS)
    assert kvpolicy.load().version == VERSIONS[-1]
    assert kvpolicy.load().versions() == list(VERSIONS)
    for policy_set in shipped.values():
        assert re.fullmatch(r"[0-9a-f]{64}", policy_set.digest)


def test_every_shipped_rule_and_row_has_reason_and_source(shipped):
    for policy_set in shipped.values():
        policy = policy_set.policy
        parts = [*policy.rules(), *policy.rows(), *policy.constraints]
        parts += [d.preference for d in policy.decisions.values() if d.preference]
        for part in parts:
            assert part.reason and part.source, f"{policy.version}: {part.id} lacks a reason or source"
            # Provenance: the upstream PR and its date, on every rule, row and constraint.
            assert re.search(r"#\d{4,6}\b", part.source), f"{policy.version}: {part.id}'s source names no upstream PR"
            assert re.search(r"\b2026-\d\d-\d\d\b", part.source), f"{policy.version}: {part.id}'s source has no date"
        assert re.search(r"#\d{4,6}\b", policy.source), f"{policy.version}: the version's source names no PR"


def test_bad_toml_is_located(tmp_path):
    (problem,) = problems(tmp_path, 'schema = 1\nversion = "2026.01.01"\nsummary = [\n')
    assert problem.check == "toml"
    assert problem.location.path.endswith("policy.toml")
    assert problem.location.line >= 3


def test_every_schema_problem_in_a_file_is_reported(tmp_path, policy_text):
    text = policy_text.replace('values = ["CPP", "PYTHON"]', 'values = ["CPP", "PYTHON"]\nvalus = 3', 1)
    text = text.replace('severity = "error"', 'severity = "fatal"', 1)
    kimi_when = 'when = { architecture = ["KimiK3ForConditionalGeneration", "KimiLinearForCausalLM"], transceiver_runtime = "CPP" }'
    text = text.replace(kimi_when, kimi_when.replace("architecture", "archtecture"))
    found = problems(tmp_path, text)
    assert [p.check for p in found] == ["schema"] * 3
    messages = " | ".join(p.message for p in found)
    assert "unknown key 'valus'" in messages
    assert "did you mean 'architecture'?" in messages
    assert "'fatal' is not one of" in messages
    assert found[0].location.line == line_of(text, "valus = 3")
    (misspelt,) = [p for p in found if "archtecture" in p.message]
    assert misspelt.location.line == line_of(text, "archtecture")
    assert misspelt.location.column > 1


def test_many_unknown_keys_name_the_first_ten_and_count_the_rest(tmp_path, policy_text):
    extra = "".join(f"valus{i:02d} = 3\n" for i in range(25))
    text = policy_text.replace('values = ["CPP", "PYTHON"]', 'values = ["CPP", "PYTHON"]\n' + extra.rstrip("\n"), 1)
    (problem,) = problems(tmp_path, text)
    assert problem.message.count("unknown key 'valus") == 10
    assert "unknown key 'valus09'" in problem.message and "'valus10'" not in problem.message
    assert "and 15 more unknown keys in " in problem.message
    assert problem.location.line == line_of(text, "valus00 = 3")


def test_semantic_problems_all_reported_with_fix(tmp_path, policy_text):
    text = policy_text.replace('inputs = ["backend"]', 'inputs = ["backnd"]', 1)
    text = text.replace('when = { features = { serialized_state = true }', 'when = { features = { serialised_state = true }')
    text = text.replace('id = "inflight-cancel-requires-cpp"', 'id = "serialized-state-needs-cpp"')
    text = text.replace('message = "the MPI backend is deprecated."', 'message = "the {backnd} backend is deprecated."')
    found = problems(tmp_path, text)
    by_check = {p.check: p for p in found}
    assert set(by_check) >= {"unknown-name", "duplicate-id", "placeholder"}
    text_all = "\n".join(str(p) for p in found)
    assert "input 'backnd' is not a decision; did you mean 'backend'?" in text_all
    assert "feature 'serialised_state' is not declared in [features]; did you mean 'serialized_state'?" in text_all
    assert "rule id 'serialized-state-needs-cpp' is already used at" in text_all
    assert "unknown placeholder {backnd}; did you mean 'backend'?" in text_all
    # The rule reading `backend` without the input is reported too.
    assert "add it to the decision's inputs" in text_all
    for problem in found:
        assert problem.location.line > 1


def test_unknown_values_suggest_the_right_spelling(tmp_path, policy_text):
    text = policy_text.replace(
        'when = { requested = { transceiver_runtime = "null" } }\nvalue = "CPP"',
        'when = { requested = { transceiver_runtime = "null" } }\nvalue = "CPX"',
    )
    (problem,) = problems(tmp_path, text)
    assert "'CPX' is not a value of transceiver_runtime; did you mean 'CPP'?" in problem.message
    assert problem.location.line == line_of(text, '"CPX"')


def test_cycle_between_decisions_is_a_load_error(tmp_path, policy_text):
    text = policy_text.replace(
        'auto = "DEFAULT"\n', 'auto = "DEFAULT"\ninputs = ["kv_cache_manager"]\n', 1
    )
    found = problems(tmp_path, text)
    cycles = [p for p in found if p.check == "cycle"]
    assert cycles, found
    assert "cycle" in cycles[0].message and "kv_cache_manager" in cycles[0].message


def test_conflicting_preference_rows(tmp_path, policy_text):
    row = '  { architecture = "GptOssForCausalLM", value = "CPP", reason = "r", source = "s" },\n'
    text = policy_text.replace("rows = [\n", "rows = [\n" + row, 1)
    (problem,) = problems(tmp_path, text)
    assert problem.check == "conflicting-rows"
    assert "GptOssForCausalLM is listed twice with different values" in problem.message


def test_equal_duplicate_rows_load(tmp_path, policy_text):
    row = '  { architecture = "GptOssForCausalLM", value = "PYTHON", reason = "r", source = "s" },\n'
    policy_set = kvpolicy.load(write(tmp_path, policy_text.replace("rows = [\n", "rows = [\n" + row, 1)))
    assert policy_set.resolve(architecture="GptOssForCausalLM", backend="NIXL").runtime == "PYTHON"


def test_folder_with_two_files_of_one_version(tmp_path, policy_text):
    write(tmp_path, policy_text, "a.toml")
    write(tmp_path, policy_text, "b.toml")
    with pytest.raises(PolicyError) as info:
        kvpolicy.load(tmp_path)
    assert f"version {NEWEST_AUTO} is also declared by" in str(info.value)


def test_folder_picks_newest_and_named_versions(tmp_path, policy_text):
    write(tmp_path, policy_text, "new.toml")
    write(tmp_path, policy_text.replace(f'version = "{NEWEST_AUTO}"', 'version = "2026.01.02"'), "old.toml")
    write(tmp_path, "[[case]]\n", "new.cases.toml")  # test cases are not policies
    assert kvpolicy.load(tmp_path).version == NEWEST_AUTO
    assert kvpolicy.load(tmp_path, version="2026.01.02").version == "2026.01.02"
    assert kvpolicy.load(tmp_path).versions() == ["2026.01.02", NEWEST_AUTO]
    with pytest.raises(PolicyError, match=f"no policy version 2027.01.01; available: 2026.01.02, {NEWEST_AUTO}"):
        kvpolicy.load(tmp_path, version="2027.01.01")


def test_missing_path(tmp_path):
    with pytest.raises(PolicyError, match="no such policy file or folder"):
        kvpolicy.load(tmp_path / "nope")


def test_policy_error_is_a_value_error():
    assert issubclass(PolicyError, ValueError)
    assert issubclass(kvpolicy.ContextError, ValueError)
