"""Behaviours of the decision core that mutation testing (``make mutate``) found unchecked.

Each test kills mutants that survived the module's tests (tests/mutation/survivors.md lists what is
left): diagnostics could sort out of their order; ``outcome()`` (the lean evaluator) could report
other severities or messages than ``resolve()``; an error could list a null the decision does not take, or leave it out; the model classes could miss a
model_type a condition reads; a message could fill a placeholder with the wrong value; explain could
name another row than the one that decided.
"""

from __future__ import annotations

import pytest

import kvpolicy
from kvpolicy import ContextError

from tests.support.constants import CLEAN, VERSIONS
from tests.support.policies import write

# -- diagnostics: order, and the lean evaluator agrees with resolve() ------------------------------

SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}

CONTEXTS = [
    dict(architecture=architecture, backend=backend, transceiver_runtime=runtime, env=env, features=features)
    for architecture in ("LlamaForCausalLM", "MistralForCausalLM", None)
    for backend in ("DEFAULT", "NIXL", "UCX", "MPI")
    for runtime in ("auto", "CPP", "PYTHON")
    for env in ({}, {"TRTLLM_DISAGG_ENABLE_INFLIGHT_CANCEL": "1"}, {"TRTLLM_USE_MPI_KVCACHE": "1"})
    for features in ((), ("serialized_state",), ("serialized_state", "sync_timing_output"), ("pipelined_transfer",))
]


def test_diagnostics_come_errors_first_then_warnings_then_notes_then_by_decision_then_by_id():
    mixed = ties = 0
    for version in VERSIONS:
        policy = kvpolicy.load(version=version)
        order = {name: number for number, name in enumerate(policy.decisions)}
        for fields in CONTEXTS:
            keys = [(SEVERITY_RANK[d.severity], order.get(d.decision, 99), d.id) for d in policy.resolve(**fields).diagnostics]
            assert keys == sorted(keys), (version, fields)
            mixed += len({k[0] for k in keys}) > 1
            ties += len({k[:2] for k in keys}) < len(keys)
    assert mixed and ties, "some context has diagnostics of two severities, and some two of one severity and decision"


def test_the_lean_outcome_reports_the_diagnostics_resolve_reports_without_their_messages():
    for version in VERSIONS:
        policy = kvpolicy.load(version=version)
        for fields in CONTEXTS:
            resolution = policy.resolve(**fields)
            values, decided_by, lean = policy.outcome(policy.normalise(**fields))
            assert (values, decided_by) == (dict(resolution.values), dict(resolution.decided_by)), (version, fields)
            assert sorted((d.id, d.severity, d.decision) for d in lean) == sorted(
                (d.id, d.severity, d.decision) for d in resolution.diagnostics
            ), (version, fields)
            assert all(d.message == "" for d in lean)


# -- context errors name exactly the values a decision takes ---------------------------------------


@pytest.mark.parametrize("architectures", [7, {"LlamaForCausalLM": 1}, "LlamaForCausalLM"])
def test_a_checkpoint_whose_architectures_are_not_a_list_of_names_is_a_context_error(architectures):
    with pytest.raises(ContextError, match="architectures must be a list of names"):
        kvpolicy.resolve(pretrained_config={"architectures": architectures}, backend="NIXL")



def test_a_value_no_decision_takes_is_refused_with_the_accepted_values_and_no_null_when_there_is_none():
    with pytest.raises(ContextError) as raised:
        kvpolicy.resolve(architecture="LlamaForCausalLM", backend="NIXLL")
    assert str(raised.value).endswith("(one of DEFAULT, NIXL, UCX, MPI, MOONCAKE)")
    assert "null" not in str(raised.value)




def test_a_value_a_decision_does_not_take_is_refused_with_its_null_when_it_has_one(tmp_path):
    policy = kvpolicy.load(write(tmp_path, CLEAN.read_text(encoding="utf-8")))
    with pytest.raises(ContextError) as raised:
        policy.resolve(architecture="LlamaForCausalLM", transceiver_runtime="CPPP")
    assert str(raised.value).endswith("(one of auto, CPP, PYTHON, or null for CPP)")


# -- the model classes a policy tells apart ----------------------------------------------------------


def test_a_model_type_a_condition_reads_is_a_class_of_its_own_for_every_architecture(tmp_path):
    text = CLEAN.read_text(encoding="utf-8") + (
        '\n[[constraints]]\nid = "glm-warns"\ndecision = "backend"\nseverity = "warning"\n'
        'when = { model_type = "glm_moe_dsa" }\nmessage = "GLM checkpoints are new."\nfix = "check the transfer"\n'
        'reason = "A fixture."\nsource = "fixture"\n'
    )
    policy = kvpolicy.load(write(tmp_path, text))
    assert set(policy.models()) == {
        ("GptOssForCausalLM", None), ("GptOssForCausalLM", "glm_moe_dsa"), (None, None), (None, "glm_moe_dsa")
    }
    assert [d.id for d in policy.resolve(pretrained_config={"architectures": ["GptOssForCausalLM"], "model_type": "glm_moe_dsa"}).diagnostics] == ["glm-warns"]


# -- messages name what the context holds ------------------------------------------------------------


def test_a_preference_not_adopted_names_the_architecture_and_the_backend():
    resolution = kvpolicy.load(version="2026.08.11").resolve(architecture="LlamaForCausalLM", backend="UCX")
    assert [d.message for d in resolution.diagnostics] == [
        "LlamaForCausalLM prefers the Python transceiver, but backend UCX does not support it; falling back to the C++ transceiver."
    ]


def test_every_placeholder_of_a_message_is_filled_from_the_context(tmp_path):
    text = CLEAN.read_text(encoding="utf-8") + (
        '\n[[constraints]]\nid = "ucx-says-everything"\ndecision = "backend"\nseverity = "warning"\n'
        'when = { backend = "UCX" }\n'
        'message = "{architecture}|{model_type}|{kv_transfer_timeout_ms}|{backend}|{transceiver_runtime}|{kv_cache_manager}"\n'
        'fix = "{backend}"\nreason = "A fixture."\nsource = "fixture"\n'
    )
    policy = kvpolicy.load(write(tmp_path, text))
    env = {"TRTLLM_USE_UCX_KVCACHE": "1"}
    named = policy.resolve(pretrained_config={"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, env=env, kv_transfer_timeout_ms=5000)
    anonymous = policy.resolve(env=env, kv_transfer_timeout_ms=None)
    assert [d.message for d in named.diagnostics] == ["LlamaForCausalLM|llama|5000|UCX|CPP|V1 To fix: UCX."]
    assert [d.message for d in anonymous.diagnostics] == ["this architecture|none|null|UCX|CPP|V1 To fix: UCX."]
    for resolution in (named, anonymous):  # explain formats the message again, with the interpreter's formatter
        (step,) = [s for s in resolution.trace if s.rule == "ucx-says-everything"]
        assert f"{step.detail} To fix: UCX." == resolution.diagnostics[0].message


def test_a_constant_message_with_a_fix_that_names_a_value_gets_that_value(tmp_path):
    text = CLEAN.read_text(encoding="utf-8") + (
        '\n[[constraints]]\nid = "ucx-is-slow"\ndecision = "backend"\nseverity = "warning"\n'
        'when = { backend = "UCX" }\nmessage = "UCX is slow here."\nfix = "keep {backend} only for tests"\n'
        'reason = "A fixture."\nsource = "fixture"\n'
    )
    policy = kvpolicy.load(write(tmp_path, text))
    (diagnostic,) = policy.resolve(env={"TRTLLM_USE_UCX_KVCACHE": "1"}).diagnostics
    assert (diagnostic.message, diagnostic.fix) == ("UCX is slow here. To fix: keep UCX only for tests.", "keep UCX only for tests")


def test_a_preference_not_adopted_can_name_the_value_it_preferred(tmp_path):
    text = CLEAN.read_text(encoding="utf-8").replace(
        'adopt_when = { backend = "NIXL" }\n',
        'adopt_when = { backend = "NIXL" }\n'
        'on_not_adopted = { severity = "info", message = "{architecture} prefers {preferred}, not on {backend}." }\n',
    )
    policy = kvpolicy.load(write(tmp_path, text))
    resolution = policy.resolve(architecture="GptOssForCausalLM", env={"TRTLLM_USE_UCX_KVCACHE": "1"})
    assert [d.message for d in resolution.diagnostics] == ["GptOssForCausalLM prefers PYTHON, not on UCX."]


# -- explain (the interpreter's trace) agrees with the decision ---------------------------------------


def test_explain_names_the_model_type_row_that_decided():
    glm = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "glm_moe_dsa"}
    resolution = kvpolicy.load(version="2026.07.23").resolve(pretrained_config=glm, backend="NIXL")
    decided = [s for s in resolution.trace if s.decision == "transceiver_runtime" and s.outcome == "decided"]
    assert [(s.stage, s.rule) for s in decided] == [("preference", resolution.decided_by["transceiver_runtime"])]
    assert resolution.decided_by["transceiver_runtime"] == "runtime-preference[DeepseekV3ForCausalLM,model_type=glm_moe_dsa]"


# -- unknown features --------------------------------------------------------------------------------


def test_an_unknown_feature_is_refused_naming_the_first_unknown_one_in_sorted_order():
    with pytest.raises(ContextError) as raised:
        kvpolicy.load(version=VERSIONS[-1]).resolve(backend="NIXL", features={"zz_unknown", "aa_unknown"})
    assert "unknown feature 'aa_unknown'" in str(raised.value)
    assert "zz_unknown" not in str(raised.value)


# -- diagnostics of a policy with a warning and a note of an earlier decision, and a notice and a --------
# -- constraint of one decision and severity whose ids sort against the order they are made in ---------

ORDERED = CLEAN.read_text(encoding="utf-8").replace(
    'value = "UCX"\nreason = "The UCX variable picks UCX."\n',
    'value = "UCX"\nnotice = { severity = "info", message = "the environment picked {backend}." }\nreason = "The UCX variable picks UCX."\n',
).replace(
    'value = "CPP", reason = "CPP works everywhere."',
    'value = "CPP", notice = { severity = "warning", message = "transceiver_runtime fell back to {transceiver_runtime}." }, '
    'reason = "CPP works everywhere."',
) + (
    '\n[[constraints]]\nid = "a-slow-on-ucx"\ndecision = "transceiver_runtime"\nseverity = "warning"\n'
    'when = { backend = "UCX" }\nmessage = "the transceiver is slow on {backend}."\nfix = "use NIXL"\n'
    'reason = "A fixture."\nsource = "fixture"\n'
)
UCX_ENV = {"TRTLLM_USE_UCX_KVCACHE": "1"}


def test_warnings_sort_before_a_note_of_an_earlier_decision_and_by_id_within_one_decision(tmp_path):
    policy = kvpolicy.load(write(tmp_path, ORDERED))
    resolution = policy.resolve(env=UCX_ENV)
    assert [(d.id, d.severity, d.decision) for d in resolution.diagnostics] == [
        ("a-slow-on-ucx", "warning", "transceiver_runtime"),  # a constraint: made after the notice below
        ("runtime-default-cpp", "warning", "transceiver_runtime"),
        ("backend-env-ucx", "info", "backend"),
    ]
    assert [d.message for d in resolution.diagnostics[1:]] == ["transceiver_runtime fell back to CPP.", "the environment picked UCX."]


def _interpreted(policy, **fields):
    """What the reference interpreter (the code that writes explain's trace) answers for a context: its
    diagnostics are reachable only here (``trace`` keeps its steps), as in test_properties."""
    return policy._program.interpret(policy.normalise(**fields), None)


def test_the_reference_interpreter_orders_and_words_diagnostics_as_resolve_does(tmp_path):
    policy = kvpolicy.load(write(tmp_path, ORDERED))
    for fields in (dict(env=UCX_ENV), dict(env=UCX_ENV, transceiver_runtime="PYTHON"), dict(backend="NIXL")):
        resolution = policy.resolve(**fields)
        assert _interpreted(policy, **fields) == (dict(resolution.values), dict(resolution.decided_by), resolution.diagnostics), fields
    assert [d.id for d in _interpreted(policy, env=UCX_ENV)[2]] == ["a-slow-on-ucx", "runtime-default-cpp", "backend-env-ucx"]


# -- requirements: conflicts, agreement, explicit values against them, and their notices --------------

REQUIRING = CLEAN.read_text(encoding="utf-8").replace(
    "[decisions.backend]", '[features.serialized_state]\ndescription = "Serialized state."\n\n[decisions.backend]', 1
) + (
    '\n[[decisions.transceiver_runtime.requirement]]\nid = "serialized-state-requires-cpp"\n'
    "when = { features.serialized_state = true }\nvalue = \"CPP\"\n"
    'notice = { severity = "info", message = "transceiver_runtime is {transceiver_runtime} for the serialized state." }\n'
    'reason = "The serialized state needs CPP."\n'
    '\n[[decisions.transceiver_runtime.requirement]]\nid = "ucx-requires-cpp"\n'
    'when = { backend = "UCX" }\nvalue = "CPP"\n'  # no reason
)


def _line(text: str, start: str) -> int:
    """The line (1-based) of ``text`` that starts with ``start``; exactly one does."""
    (number,) = [number for number, line in enumerate(text.splitlines(), 1) if line.startswith(start)]
    return number


def test_a_requirements_conflict_names_each_requirement_with_its_value_and_points_at_the_first(tmp_path):
    path = write(tmp_path, REQUIRING)
    resolution = kvpolicy.load(path).resolve(features={"serialized_state", "pipelined_transfer"})
    (conflict,) = resolution.errors
    assert conflict.id == "requirements-conflict" and conflict.decision == "transceiver_runtime"
    assert conflict.message == (
        "transceiver_runtime cannot satisfy every requirement: "
        "pipelined-transfer-requires-python requires PYTHON (feature pipelined_transfer is on); "
        "serialized-state-requires-cpp requires CPP (feature serialized_state is on). "
        "To fix: turn off one of the features or settings that these rules name."
    )
    first = _line(REQUIRING, 'id = "pipelined-transfer-requires-python"') - 1  # its [[...requirement]] header
    assert conflict.location == f"{path}:{first}:1"


def test_agreeing_requirements_decide_together_and_a_notice_among_them_names_the_value_they_decided(tmp_path):
    resolution = kvpolicy.load(write(tmp_path, REQUIRING)).resolve(features={"serialized_state"}, env=UCX_ENV)
    assert resolution.values["transceiver_runtime"] == "CPP"
    assert resolution.decided_by["transceiver_runtime"] == "serialized-state-requires-cpp+ucx-requires-cpp"
    assert [(d.id, d.message) for d in resolution.diagnostics] == [
        ("serialized-state-requires-cpp", "transceiver_runtime is CPP for the serialized state.")
    ]


REQUIRING_CONTEXTS = [
    dict(features=features, env=env, transceiver_runtime=runtime)
    for features in ((), ("serialized_state",), ("pipelined_transfer",), ("serialized_state", "pipelined_transfer"))
    for env in ({}, UCX_ENV)
    for runtime in ("auto", "CPP", "PYTHON", None)
]


def test_the_lean_outcome_reports_what_resolve_reports_on_requirements_without_messages(tmp_path):
    policy = kvpolicy.load(write(tmp_path, REQUIRING))
    kinds = set()
    for fields in REQUIRING_CONTEXTS:
        resolution = policy.resolve(**fields)
        values, decided_by, lean = policy.outcome(policy.normalise(**fields))
        assert (values, decided_by) == (dict(resolution.values), dict(resolution.decided_by)), fields
        assert sorted((d.id, d.severity, d.decision) for d in lean) == sorted(
            (d.id, d.severity, d.decision) for d in resolution.diagnostics
        ), fields
        assert all(d.message == "" for d in lean), fields
        kinds.update(d.id for d in resolution.diagnostics)
    # an explicit value a requirement forbids, a conflict, and an agreeing requirement's notice
    assert {"ucx-requires-cpp", "requirements-conflict", "serialized-state-requires-cpp"} <= kinds


def test_the_reference_interpreter_reports_what_resolve_reports_on_requirements(tmp_path):
    policy = kvpolicy.load(write(tmp_path, REQUIRING))
    for fields in REQUIRING_CONTEXTS:
        resolution = policy.resolve(**fields)
        assert _interpreted(policy, **fields) == (dict(resolution.values), dict(resolution.decided_by), resolution.diagnostics), fields
    (reasoned,) = policy.resolve(features={"serialized_state"}, transceiver_runtime="PYTHON").errors
    assert reasoned.message.endswith("when feature serialized_state is on (The serialized state needs CPP). To fix: set transceiver_runtime to CPP or auto.")
    (bare,) = [d for d in policy.resolve(env=UCX_ENV, transceiver_runtime="PYTHON").errors if d.id == "ucx-requires-cpp"]
    assert "requires CPP when backend is UCX. To fix:" in bare.message


def test_the_reference_interpreter_names_the_preferred_value_in_a_notice(tmp_path):
    text = CLEAN.read_text(encoding="utf-8").replace(
        'adopt_when = { backend = "NIXL" }\n',
        'adopt_when = { backend = "NIXL" }\n'
        'on_not_adopted = { severity = "info", message = "{architecture} prefers {preferred}, not on {backend}." }\n',
    )
    policy = kvpolicy.load(write(tmp_path, text))
    fields = dict(architecture="GptOssForCausalLM", env=UCX_ENV)
    (notice,) = _interpreted(policy, **fields)[2]
    assert notice.message == "GptOssForCausalLM prefers PYTHON, not on UCX."
    assert _interpreted(policy, **fields)[2] == policy.resolve(**fields).diagnostics


# -- explain: adjustments ------------------------------------------------------------------------------

ADJUSTING = CLEAN.read_text(encoding="utf-8") + (
    '\n[[decisions.kv_cache_manager.adjustment]]\nid = "pipelined-selects-v2"\n'
    'when = { features.pipelined_transfer = true }\nvalue = "V2"\n'
    '\n[[decisions.kv_cache_manager.adjustment]]\nid = "env-selects-v2"\n'
    'when = { env.KV_V2 = "1" }\nvalue = "V2"\n'
    '\n[[decisions.kv_cache_manager.adjustment]]\nid = "cpp-selects-v1"\n'
    'when = { transceiver_runtime = "CPP" }\nvalue = "V1"\n'
)


def test_explain_shows_the_first_adjustment_that_holds_deciding_and_those_after_it_losing(tmp_path):
    resolution = kvpolicy.load(write(tmp_path, ADJUSTING)).resolve(env={"KV_V2": "1"})
    assert (resolution.values["kv_cache_manager"], resolution.decided_by["kv_cache_manager"]) == ("V2", "env-selects-v2")
    assert [(s.rule, s.outcome, s.detail) for s in resolution.trace if s.stage == "adjustment"] == [
        ("pipelined-selects-v2", "skipped", "not (feature pipelined_transfer is on)"),
        ("env-selects-v2", "decided", "env KV_V2 is 1: V1 -> V2"),
        ("cpp-selects-v1", "lost", "transceiver_runtime is CPP: V1"),  # it holds too: the first one wins
    ]


# -- the classes of models a policy tells apart, and features of the wrong shape --------------------


@pytest.mark.parametrize("kind", ["requirement", "conditional", "adjustment"])
def test_a_model_type_only_a_rules_condition_names_is_a_class_of_models(tmp_path, kind):
    # impact and the unknown-architecture verdict resolve one representative per class: a
    # model_type that only a rule's condition reads (no row names it) must still be one.
    extra = (
        f"\n[[decisions.kv_cache_manager.{kind}]]\n"
        'id = "glm-v2"\nwhen = { model_type = "glm_moe_dsa" }\nvalue = "V2"\nreason = "r"\nsource = "s"\n'
    )
    policy = kvpolicy.load(write(tmp_path, CLEAN.read_text(encoding="utf-8") + extra))
    models = policy.models()
    assert (None, "glm_moe_dsa") in models and ("GptOssForCausalLM", "glm_moe_dsa") in models, models
    plain = tmp_path / "plain"
    plain.mkdir()
    assert kvpolicy.load(write(plain, CLEAN.read_text(encoding="utf-8"))).models() == (("GptOssForCausalLM", None), (None, None))


@pytest.mark.parametrize("features", [[["pipelined_transfer"]], [{"a": 1}], [{"pipelined_transfer"}]])
def test_features_that_cannot_form_a_set_are_a_context_error_not_a_crash(features):
    with pytest.raises(ContextError, match="expected a set of feature names"):
        kvpolicy.resolve(architecture="LlamaForCausalLM", backend="NIXL", features=features)


# -- explain: requirements against an explicit value, agreeing, and in conflict -----------------------


def _requirement_steps(resolution) -> list[tuple[str, str, str]]:
    return [(s.rule, s.outcome, s.detail) for s in resolution.trace if s.stage == "requirement"]


def test_explain_shows_each_requirement_an_explicit_value_breaks_as_an_error_and_each_it_meets_as_lost(tmp_path):
    policy = kvpolicy.load(write(tmp_path, REQUIRING))
    resolution = policy.resolve(features={"serialized_state", "pipelined_transfer"}, env=UCX_ENV, transceiver_runtime="CPP")
    assert resolution.decided_by["transceiver_runtime"] == "explicit"
    assert _requirement_steps(resolution) == [
        ("pipelined-transfer-requires-python", "error", "requires PYTHON: Only PYTHON pipelines."),
        ("serialized-state-requires-cpp", "lost", "requires CPP: The serialized state needs CPP."),
        ("ucx-requires-cpp", "lost", "requires CPP: "),  # a requirement with no reason
    ]


def test_explain_shows_agreeing_requirements_all_deciding_each_with_its_reason(tmp_path):
    resolution = kvpolicy.load(write(tmp_path, REQUIRING)).resolve(features={"serialized_state"}, env=UCX_ENV)
    assert _requirement_steps(resolution) == [
        ("pipelined-transfer-requires-python", "skipped", "not (feature pipelined_transfer is on)"),
        ("serialized-state-requires-cpp", "decided", "requires CPP: The serialized state needs CPP."),
        ("ucx-requires-cpp", "decided", "requires CPP: "),
    ]


def test_explain_shows_every_requirement_of_a_conflict_as_an_error_and_the_default_deciding(tmp_path):
    resolution = kvpolicy.load(write(tmp_path, REQUIRING)).resolve(features={"serialized_state", "pipelined_transfer"})
    assert [(s.stage, s.rule, s.outcome) for s in resolution.trace if s.decision == "transceiver_runtime"] == [
        ("explicit", "explicit", "skipped"),
        ("requirement", "ucx-requires-cpp", "skipped"),
        ("requirement", "pipelined-transfer-requires-python", "error"),
        ("requirement", "serialized-state-requires-cpp", "error"),
        ("preference", "runtime-preference", "skipped"),
        ("default", "runtime-default-cpp", "decided"),
    ]
    assert resolution.decided_by["transceiver_runtime"] == "runtime-default-cpp"


def test_the_explain_command_prints_the_requirements_an_explicit_value_meets_and_breaks(tmp_path, capsys):
    from kvpolicy.cli import main

    path = write(tmp_path, REQUIRING)
    code = main(["explain", "--policy", str(path), "--arch", "LlamaForCausalLM", "--runtime", "CPP", "--feature", "serialized_state", "--pipelined"])
    out = capsys.readouterr().out
    assert code == 1  # the explicit CPP breaks pipelined-transfer-requires-python
    assert (
        "  requirement  error       pipelined-transfer-requires-python\n"
        "                             requires PYTHON: Only PYTHON pipelines.\n"
        "  requirement  lost        serialized-state-requires-cpp\n"
        "                             requires CPP: The serialized state needs CPP.\n"
    ) in out


def test_the_reference_interpreter_points_a_requirements_conflict_at_the_requirement_that_sorts_first(tmp_path):
    path = write(tmp_path, REQUIRING)
    policy = kvpolicy.load(path)
    (conflict,) = _interpreted(policy, features={"serialized_state", "pipelined_transfer"})[2]
    first = _line(REQUIRING, 'id = "pipelined-transfer-requires-python"') - 1  # its [[...requirement]] header
    assert conflict.id == "requirements-conflict"
    assert conflict.location == f"{path}:{first}:1"


def test_the_reference_interpreter_reports_every_requirement_an_explicit_value_breaks(tmp_path):
    policy = kvpolicy.load(write(tmp_path, REQUIRING))
    fields = dict(features={"serialized_state", "pipelined_transfer"}, env=UCX_ENV, transceiver_runtime="PYTHON")
    values, decided_by, diagnostics = _interpreted(policy, **fields)
    assert (values["transceiver_runtime"], decided_by["transceiver_runtime"]) == ("PYTHON", "explicit")
    assert [(d.id, d.severity) for d in diagnostics] == [  # one decision's errors: by id
        ("python-requires-nixl", "error"),
        ("serialized-state-requires-cpp", "error"),
        ("ucx-requires-cpp", "error"),
    ]


# -- a condition on a decision that accepts several of its values ---------------------------------------


def test_a_condition_accepting_several_values_of_a_decision_holds_for_each_of_them_and_no_other(tmp_path):
    text = CLEAN.read_text(encoding="utf-8").replace('values = ["NIXL", "UCX"]', 'values = ["NIXL", "UCX", "MPI"]') + (
        '\n[[constraints]]\nid = "ucx-or-mpi-is-slow"\ndecision = "backend"\nseverity = "warning"\n'
        'when = { backend = ["UCX", "MPI"] }\nmessage = "{backend} is slow here."\nfix = "use NIXL"\n'
        'reason = "A fixture."\nsource = "fixture"\n'
    )
    policy = kvpolicy.load(write(tmp_path, text))
    for backend, outcome in (("NIXL", "passed"), ("UCX", "warning"), ("MPI", "warning")):
        resolution = policy.resolve(backend=backend)
        (step,) = [s for s in resolution.trace if s.rule == "ucx-or-mpi-is-slow"]
        assert step.outcome == outcome, backend
        assert [d.id for d in resolution.warnings] == ([] if outcome == "passed" else ["ucx-or-mpi-is-slow"]), backend


def test_a_message_of_two_placeholders_with_nothing_after_the_second_names_both(tmp_path):
    # "{transceiver_runtime} on {backend}": two placeholders and no text after the last one. The
    # message is rendered whole by resolve(), by the reference interpreter and for notices alike.
    text = CLEAN.read_text(encoding="utf-8").replace(
        'message = "PYTHON supports only NIXL, but the backend is {backend}."', 'message = "{transceiver_runtime} on {backend}"'
    )
    assert "{transceiver_runtime} on {backend}" in text
    policy = kvpolicy.load(write(tmp_path, text))
    resolution = policy.resolve(architecture="LlamaForCausalLM", backend="UCX", transceiver_runtime="PYTHON")
    (error,) = resolution.errors
    assert error.message.startswith("PYTHON on UCX"), error.message
    from kvpolicy.evaluate.index import compile_message

    render = compile_message("{transceiver_runtime} on {backend}", frozenset({"backend", "transceiver_runtime"}))
    assert render({}, {"backend": "UCX", "transceiver_runtime": "PYTHON"}, None) == "PYTHON on UCX"
