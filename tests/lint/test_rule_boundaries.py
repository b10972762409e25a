"""Rule behaviours that mutation testing of lint's rules (``engine/lint/rules/``) found unchecked: KVP024's
implication index, implication test and budget, KVP011's comparison bound, KVP022 on
requirements, KVP030's message for one constraint in several contexts, the version rules over
more than one pair of files, and near-miss hints at exactly the similarity cutoff."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
from kvpolicy.lint import RULES, lint_paths
from kvpolicy.lint.rules import precedence as precedence_rules
from kvpolicy.lint.rules import reference as reference_rules

from tests.support.lint import claim_holds, git, two_versions, with_source

from .conftest import FIXTURES

CLEAN = (FIXTURES / "clean.toml").read_text()

#: The clean fixture's only requirement, which the KVP024 policies below replace.
CLEAN_REQUIREMENT = """[[decisions.transceiver_runtime.requirement]]
id = "pipelined-transfer-requires-python"
when = { features.pipelined_transfer = true }
value = "PYTHON"
reason = "Only PYTHON pipelines."
source = "fixture"
"""

PIPELINED = "features.pipelined_transfer = true"
UCX_ENV = "env.TRTLLM_USE_UCX_KVCACHE"


def _write(tmp_path: Path, text: str, name: str = "policy.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _requirements(tmp_path: Path, *requirements: tuple[str, str] | tuple[str, str, str]) -> str:
    """The clean fixture with its transceiver_runtime requirements replaced by ``requirements``,
    in this order: (id, the inside of its ``when``[, value]); the value is PYTHON unless given."""
    assert CLEAN_REQUIREMENT in CLEAN
    blocks = []
    for rule_id, when, *value in requirements:
        blocks.append(
            f'[[decisions.transceiver_runtime.requirement]]\nid = "{rule_id}"\nwhen = {{ {when} }}\n'
            f'value = "{value[0] if value else "PYTHON"}"\nreason = "A reason."\nsource = "fixture"\n'
        )
    return _write(tmp_path, CLEAN.replace(CLEAN_REQUIREMENT, "\n".join(blocks)))


def _kvp024(path: str) -> list[tuple[str, ...]]:
    """KVP024's findings, in order: (narrow, broad) for a redundant requirement, ("unchecked", id)
    where the rule stopped at its budget."""
    found: list[tuple[str, ...]] = []
    for finding in lint_paths([path], cache=False).findings:
        if finding.code != "KVP024":
            continue
        stopped = re.match(r"redundancy not checked from requirement (\S+) on", finding.message)
        if stopped:
            found.append(("unchecked", stopped.group(1)))
            continue
        redundant = re.match(r"requirement (\S+) is redundant: wherever it holds, requirement (\S+) also holds", finding.message)
        assert redundant, finding.message
        assert finding.related[0][1] == f"requirement {redundant.group(2)}"
        found.append(redundant.groups())
    return found


# -- KVP024 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "narrow, broad",
    [
        (f'backend = "NIXL", {PIPELINED}', 'backend = "NIXL"'),
        (f'backend = "NIXL", {PIPELINED}', 'backend = ["NIXL", "UCX"]'),
        (f'{UCX_ENV} = "1", {PIPELINED}', f'{UCX_ENV} = ["0", "1"]'),
        (f'requested.backend = "DEFAULT", {PIPELINED}', 'requested.backend = "DEFAULT"'),
    ],
    ids=["subject", "subject-values", "env", "requested"],
)
def test_redundant_requirement_is_found_through_a_shared_matcher_and_the_narrower_one_is_reported(tmp_path, narrow, broad):
    """A broader requirement whose only test is a (subject, env or requested) matcher is found
    from the narrower one's matcher; the narrower one is reported, wherever it stands."""
    assert _kvp024(_requirements(tmp_path, ("narrow", narrow), ("broad", broad))) == [("narrow", "broad")]
    assert _kvp024(_requirements(tmp_path, ("broad", broad), ("narrow", narrow))) == [("narrow", "broad")]


def test_requirement_with_a_test_the_other_lacks_or_another_value_is_not_redundant(tmp_path):
    # Same value, but neither condition implies the other.
    path = _requirements(tmp_path, ("on-nixl-pipelined", f'backend = "NIXL", {PIPELINED}'), ("on-nixl-ucx-env", f'backend = "NIXL", {UCX_ENV} = "1"'))
    assert _kvp024(path) == []
    # One condition implies the other, but they require different values (KVP023's, not KVP024's).
    path = _requirements(tmp_path, ("on-nixl-pipelined", f'backend = "NIXL", {PIPELINED}'), ("on-nixl-cpp", 'backend = "NIXL"', "CPP"))
    assert _kvp024(path) == []


def test_redundant_requirement_is_reported_once_against_the_first_requirement_that_implies_it(tmp_path):
    path = _requirements(
        tmp_path,
        ("narrow", f'backend = "NIXL", {PIPELINED}'),
        ("pipelined", PIPELINED),
        ("on-nixl", 'backend = "NIXL"'),
    )
    assert _kvp024(path) == [("narrow", "pipelined")]


def test_of_two_identical_requirements_the_earlier_is_still_compared_with_the_others(tmp_path):
    """Two requirements with one condition imply each other (only the later is reported against the
    earlier), and the earlier one is still reported when a third, broader one implies it."""
    same = f'backend = "NIXL", {PIPELINED}'
    path = _requirements(tmp_path, ("first", same), ("second", same), ("broad", PIPELINED))
    assert _kvp024(path) == [("first", "broad"), ("second", "first")]


def test_negated_matchers_imply_by_what_they_exclude(tmp_path):
    # A value a "not" excludes implies the "not" (a requirement with negated matchers only meets every other).
    path = _requirements(tmp_path, ("narrow", f'backend = "NIXL", {PIPELINED}'), ("off-ucx", 'backend = { not = "UCX" }'))
    assert _kvp024(path) == [("narrow", "off-ucx")]
    # The value the "not" names does not.
    path = _requirements(tmp_path, ("narrow", f'backend = "UCX", {PIPELINED}'), ("off-ucx", 'backend = { not = "UCX" }'))
    assert _kvp024(path) == []
    # "not X or Y" implies "not X"; "not X" never implies "X" (nor anything positive).
    path = _requirements(
        tmp_path,
        ("not-0-or-1", f'backend = "NIXL", {UCX_ENV} = {{ not = ["0", "1"] }}'),
        ("not-1", f'backend = "NIXL", {UCX_ENV} = {{ not = "1" }}'),
        ("is-1", f'backend = "NIXL", {UCX_ENV} = "1"'),
    )
    assert _kvp024(path) == [("not-0-or-1", "not-1")]


def test_different_timeouts_do_not_imply_each_other(tmp_path):
    path = _requirements(
        tmp_path,
        ("finite", f'{PIPELINED}, kv_transfer_timeout_ms = "finite"'),
        ("null", f'{PIPELINED}, kv_transfer_timeout_ms = "null"'),
        ("finite-on-nixl", f'backend = "NIXL", {PIPELINED}, kv_transfer_timeout_ms = "finite"'),
    )
    assert _kvp024(path) == [("finite-on-nixl", "finite")]


def test_a_requirement_that_can_never_hold_is_implied_by_one_on_the_same_variable(tmp_path):
    # An empty list of values never holds: it implies any other test of that variable.
    path = _requirements(tmp_path, ("is-1", f'{UCX_ENV} = "1"'), ("never", f"{UCX_ENV} = []"))
    assert _kvp024(path) == [("never", "is-1")]


def test_redundancy_budget_counts_the_pairs_the_index_offers_and_is_spent_exactly(tmp_path, monkeypatch):
    """The index offers ``narrow`` itself and ``pipelined`` (2 pairs), ``pipelined`` itself (1)
    and ``ucx-env`` itself (1): 4 pairs in all. A budget of 4 checks everything; one of 3 stops
    at the requirement that would exceed it."""
    path = _requirements(
        tmp_path,
        ("narrow", f'backend = "NIXL", {PIPELINED}'),
        ("pipelined", PIPELINED),
        ("ucx-env", f'{UCX_ENV} = "1"'),
    )
    monkeypatch.setattr(precedence_rules, "IMPLICATION_TESTS", 4)
    assert _kvp024(path) == [("narrow", "pipelined")]
    monkeypatch.setattr(precedence_rules, "IMPLICATION_TESTS", 3)
    assert _kvp024(path) == [("narrow", "pipelined"), ("unchecked", "ucx-env")]


# -- KVP022 on requirements ----------------------------------------------------------------------------


def test_unreachable_requirement_is_reported(tmp_path):
    path = _requirements(tmp_path, ("on-no-backend", 'backend = { not = ["NIXL", "UCX"] }'))
    found = [f for f in lint_paths([path], cache=False).findings if f.code == "KVP022"]
    assert [(f.location.line, f.message) for f in found] == [
        (33, "requirement on-no-backend can never hold: no context satisfies backend is not NIXL or UCX")
    ]


# -- KVP011 ----------------------------------------------------------------------------------------


def test_near_miss_check_compares_exactly_its_bound_and_counts_every_name_past_it(tmp_path, monkeypatch):
    """With room for 2 names: the misspelt Llama and Synth0 are compared, Synth1 and Synth2 are
    counted (the finding stands at the first), and the misspelt name is still reported where it
    appears again after them."""
    rows = "rows = [\n" + "".join(
        f'  {{ architecture = "{name}", value = "PYTHON", reason = "r", source = "fixture" }},\n'
        for name in ("LlamaForCausalLm", "Synth0ForCausalLM", "Synth1ForCausalLM", "Synth2ForCausalLM")
    ) + "]\n"
    text = re.sub(r"rows = \[\n.*?\n\]\n", lambda _: rows, CLEAN, count=1, flags=re.S)
    conditional = (
        '[[decisions.transceiver_runtime.conditional]]\nid = "llama-cpp"\nwhen = { architecture = "LlamaForCausalLm" }\n'
        'value = "CPP"\nreason = "r"\nsource = "fixture"\n\n'
    )
    text = text.replace("[decisions.transceiver_runtime.preference]", conditional + "[decisions.transceiver_runtime.preference]")
    path = _write(tmp_path, text)
    monkeypatch.setattr(reference_rules, "NEAR_MISS_CHECKS", 2)
    found = [(f.location.line, f.message) for f in lint_paths([path], cache=False).findings if f.code == "KVP011"]
    hint = "unknown architecture 'LlamaForCausalLm'; did you mean 'LlamaForCausalLM'?"
    assert found == [
        (40, hint),
        (52, hint),
        (54, "2 more architecture names were not compared with the known ones: this rule compares at most 2 unknown "
         "names per file (each comparison costs ~0.3 ms); split the policy or add its new names to engine/lint/catalogue.toml"),
    ]


# -- KVP012 ----------------------------------------------------------------------------------------


def test_near_miss_at_exactly_the_similarity_cutoff_is_reported(tmp_path):
    """'pipetransfer' is 'pipelined_transfer' less 6 letters: similarity 2 * 12 / 30 = 0.8, the
    feature cutoff itself, so difflib calls it close; the length filter before difflib must not
    drop it (12 >= 0.8 / 1.2 * 18 only in exact arithmetic)."""
    feature = '[features.pipetransfer]\ndescription = "Pipelined transfer."\n\n'
    path = _write(tmp_path, CLEAN.replace("[decisions.backend]", feature + "[decisions.backend]", 1))
    findings = lint_paths([path], cache=False).findings
    assert [(f.code, f.message) for f in findings] == [("KVP012", "unknown feature 'pipetransfer'; did you mean 'pipelined_transfer'?")]


# -- KVP030 ----------------------------------------------------------------------------------------


def test_kvp030_lists_every_context_where_one_constraint_rejects_auto(tmp_path):
    """One constraint, two backends where it rejects auto's PYTHON: one finding that names both."""
    text = (FIXTURES / "KVP030.toml").read_text()
    text = text.replace('values = ["NIXL", "UCX"]', 'values = ["NIXL", "UCX", "MPI"]', 1)
    (finding,) = [f for f in lint_paths([_write(tmp_path, text, "2030.01.01.30.toml")], cache=False).findings if f.code == "KVP030"]
    assert finding.message.startswith(
        "auto resolves transceiver_runtime to PYTHON through runtime-preference[GptOssForCausalLM], which fails at "
        "start-up in 2 contexts where transceiver_runtime = CPP would pass: constraint python-requires-nixl rejects "
        "it with backend MPI; backend UCX (e.g. "
    ), finding.message
    claim_holds(finding)


# -- versioning --------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_unbumped_version_is_found_after_a_file_that_does_not_load(tmp_path, monkeypatch):
    git("init", "-q", cwd=tmp_path)
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "a.toml").write_text("this is not TOML\n")
    policy = folder / "p.toml"
    policy.write_text(CLEAN)
    git("add", ".", cwd=tmp_path)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "policy", cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    policy.write_text(CLEAN.replace('value = "V1", reason', 'value = "V2", reason'))
    findings = lint_paths(["policies"], base="HEAD", cache=False).findings
    assert [(f.code, Path(f.location.path).name, f.location.line) for f in findings] == [("KVP001", "a.toml", 1), ("KVP051", "p.toml", 3)]


def _changed(source: str):
    return lambda t: with_source(t.replace('value = "PYTHON", reason = "GPT-OSS', 'value = "CPP", reason = "GPT-OSS'), source)


def _kvp053(*paths: str) -> list[tuple[str, str]]:
    findings = lint_paths(list(paths), cache=False).findings
    return [(Path(f.location.path).parent.name, Path(f.location.path).name) for f in findings if f.code == "KVP053"]


def test_repeated_source_is_checked_in_every_folder_after_a_placeholder_source(tmp_path):
    def first(text):
        return with_source(text, "NVIDIA/TensorRT-LLM #1")

    placeholder = two_versions(tmp_path, first, _changed("TODO(kvpolicy new): the upstream change"), "x")
    repeated = two_versions(tmp_path, first, _changed("NVIDIA/TensorRT-LLM #1 (the rest of it)"), "y")
    assert _kvp053(placeholder, repeated) == [("y", "b.toml")]


def test_repeated_source_is_checked_for_every_version_after_one_that_cites_something_new(tmp_path):
    path = two_versions(tmp_path, lambda t: with_source(t, "NVIDIA/TensorRT-LLM #1"), _changed("NVIDIA/TensorRT-LLM #2"))
    third = CLEAN.replace('version = "2030.01.01"', 'version = "2030.01.03"').replace('value = "V1", reason', 'value = "V2", reason')
    (Path(path) / "c.toml").write_text(with_source(third, "NVIDIA/TensorRT-LLM #2 (the rest of it)"))
    assert _kvp053(path) == [("policies", "c.toml")]


# -- the catalogue -----------------------------------------------------------------------------------


def test_catalogue_rules_are_immutable_values():
    """``RULES`` is shared by every run: a rule cannot be changed in place, and rules can key a
    mapping or fill a set."""
    rule = RULES["KVP024"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.severity = "error"  # type: ignore[misc]
    assert {rule: rule.code}[rule] == "KVP024"
    assert len(set(RULES.values())) == len(RULES)
