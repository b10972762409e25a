"""Hostile policy files: every one ends in a located PolicyError from ``load`` and the same
refusal as a lint finding (every output format, non-zero exit), without a traceback.

The files are generated here; the costly ones (a 27 MB, 300,000-row file) are measured by hand
(see the README), since tests never assert wall-clock times."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import kvpolicy
from kvpolicy.cli import main
from kvpolicy.lint import lint_paths

from tests.support.constants import CLEAN as CLEAN_PATH

CLEAN = CLEAN_PATH.read_text(encoding="utf-8")


def _write(folder: Path, text: str) -> Path:
    path = folder / "p.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _deep_array(folder: Path) -> str:
    _write(folder, CLEAN + "x = " + "[" * 400 + "]" * 400 + "\n")
    return "nested more than 16 deep"


def _deep_inline(folder: Path) -> str:
    _write(folder, CLEAN + "x = " + "{a=" * 400 + "1" + "}" * 400 + "\n")
    return "nested more than 16 deep"


def _huge_integer(folder: Path) -> str:
    _write(folder, CLEAN.replace("schema = 1", "schema = " + "1" * 5000, 1))
    return "a value of 5,000 characters"


def _dotted_header(folder: Path) -> str:
    _write(folder, CLEAN + "[" + ".".join(["a"] * 20_000) + "]\n")
    return "a dotted key or table header of more than 16 parts"


def _dotted_key(folder: Path) -> str:
    _write(folder, CLEAN.replace('summary = "Lint fixture."', ".".join(['"k"'] * 40) + " = 1", 1))
    return "a dotted key or table header of more than 16 parts"


def _oversize(folder: Path) -> str:
    with open(folder / "p.toml", "wb") as handle:  # sparse: refused by stat before a byte is read
        handle.truncate(kvpolicy.read.policyfile.MAX_POLICY_BYTES + 1)
    return "policy files are limited to 33,554,432 bytes"


def _dev_zero(folder: Path) -> str:
    os.symlink("/dev/zero", folder / "p.toml")
    return "the symlink points outside the policy folder"


def _fifo(folder: Path) -> str:
    os.mkfifo(folder / "p.toml")
    return "not a regular file (a FIFO)"


def _loop(folder: Path) -> str:
    os.symlink("q.toml", folder / "p.toml")
    os.symlink("p.toml", folder / "q.toml")
    return "the symlink points to itself through a loop"


def _outside(folder: Path) -> str:
    outside = folder.parent / "elsewhere.toml"
    outside.write_text(CLEAN, encoding="utf-8")
    os.symlink(outside, folder / "p.toml")
    return "the symlink points outside the policy folder"


def _folder_named_toml(folder: Path) -> str:
    (folder / "p.toml").mkdir()
    _write(folder / "p.toml", CLEAN)
    return "not a regular file (a folder)"


def _format_spec(folder: Path) -> str:
    _write(folder, CLEAN.replace("the backend is {backend}.", "the backend is {backend:>99999999}.", 1))
    return "placeholder '{backend:>99999999}' is not a plain {name}"


def _format_spec_20_digits(folder: Path) -> str:
    _write(folder, CLEAN.replace("the backend is {backend}.", "the backend is {backend:>99999999999999999999}.", 1))
    return "is not a plain {name}"


def _attribute(folder: Path) -> str:
    _write(folder, CLEAN.replace("the backend is {backend}.", "the backend is {backend.__class__}.", 1))
    return "is not a plain {name}"


def _bad_date(folder: Path) -> str:
    _write(folder, CLEAN.replace('version = "2030.01.01"', 'version = "2026.13.45"'))
    return "version 2026.13.45 is not a date"


def _too_many_constraints(folder: Path) -> str:
    block = CLEAN[CLEAN.index("[[constraints]]") :]
    many = "".join(block.replace('"python-requires-nixl"', f'"c{i}"') + "\n" for i in range(10_001))
    _write(folder, CLEAN + many)
    return "more than 10,000 [[constraints]] tables"


def _too_many_inline_constraints(folder: Path) -> str:
    head = CLEAN[: CLEAN.index("[[constraints]]")]
    item = (
        '{{ id = "c{i}", decision = "transceiver_runtime", severity = "error", when = {{ transceiver_runtime = "PYTHON", '
        'backend = {{ not = ["NIXL"] }} }}, message = "m {{backend}}", fix = "f", reason = "r", source = "s" }}'
    )
    items = ",\n".join(item.format(i=i) for i in range(10_001))
    _write(folder, head.replace('source = "kvpolicy tests"\n', f'source = "kvpolicy tests"\nconstraints = [\n{items}\n]\n', 1))
    return "more than 10,000 entries in `constraints = [...]`"


def _too_many_features(folder: Path) -> str:
    features = "".join(f'[features.f{i}]\ndescription = "feature {i}"\n\n' for i in range(1_001))
    _write(folder, CLEAN.replace("[decisions.backend]", features + "[decisions.backend]", 1))
    return "more than 1,000 [features.*] tables"


def _too_many_rows(folder: Path) -> str:
    rows = "".join(f'  {{ architecture = "A{i}ForCausalLM", value = "CPP" }},\n' for i in range(100_001))
    _write(folder, CLEAN.replace("rows = [\n", "rows = [\n" + rows, 1))
    return "more than 100,000 entries in `rows = [...]`; the schema allows at most 100,000"


def _many_keys_in_a_table(folder: Path) -> str:
    # Unknown keys of one table: each used to cost the parser, jsonschema and a suggestion.
    keys = "".join(f'k{i} = "v"\n' for i in range(10_001))
    _write(folder, CLEAN.replace("[decisions.backend]\n", "[decisions.backend]\n" + keys, 1))
    return "more than 10,000 keys in one table"


def _many_keys_in_an_inline_table(folder: Path) -> str:
    _write(folder, CLEAN + "x = {" + ", ".join(f"k{i} = {i}" for i in range(10_001)) + "}\n")
    return "more than 10,000 keys in one table"


def _many_keys_in_a_row(folder: Path) -> str:
    row = "{ " + ", ".join(f'k{i} = "v"' for i in range(10_001)) + " },\n"
    _write(folder, CLEAN.replace("rows = [\n", "rows = [\n" + row, 1))
    return "more than 10,000 keys in one table"


CASES = {f.__name__.lstrip("_"): f for f in (
    _deep_array, _deep_inline, _huge_integer, _dotted_header, _dotted_key, _oversize, _dev_zero, _fifo, _loop,
    _outside, _folder_named_toml, _format_spec, _format_spec_20_digits, _attribute, _bad_date,
    _too_many_constraints, _too_many_inline_constraints, _too_many_features, _too_many_rows,
    _many_keys_in_a_table, _many_keys_in_an_inline_table, _many_keys_in_a_row,
)}


@pytest.fixture(params=sorted(CASES))
def hostile(request, tmp_path) -> tuple[Path, str]:
    if request.param in ("fifo",) and not hasattr(os, "mkfifo"):
        pytest.skip("needs FIFOs")
    if request.param == "dev_zero" and not os.path.exists("/dev/zero"):
        pytest.skip("needs /dev/zero")
    folder = tmp_path / "policies"
    folder.mkdir()
    return folder, CASES[request.param](folder)


def test_load_refuses_with_a_location(hostile):
    folder, message = hostile
    with pytest.raises(kvpolicy.PolicyError) as exc:
        kvpolicy.load(folder)
    problems = exc.value.problems
    assert any(message in p.message for p in problems), problems
    for problem in problems:
        assert problem.location.path.endswith(".toml") and problem.location.line >= 1 and problem.location.column >= 1


def test_lint_verdict_equals_load(hostile):
    folder, message = hostile
    result = lint_paths([str(folder)])
    assert result.failed(), "lint must not pass a folder that load refuses"
    assert any(message in f.message and f.severity == "error" for f in result.findings), result.findings


@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif", "junit"])
def test_every_format_reports_the_refusal(hostile, capsys, fmt):
    folder, message = hostile
    code = main(["lint", str(folder), "--format", fmt])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    if fmt == "json":
        messages = [f["message"] for f in json.loads(out)["findings"]]
    elif fmt == "sarif":
        messages = [r["message"]["text"] for r in json.loads(out)["runs"][0]["results"]]
    elif fmt == "junit":
        from xml.etree import ElementTree

        messages = [f.get("message") for f in ElementTree.fromstring(out.split("\n", 1)[1]).iter("failure")]
    else:
        messages = out.splitlines()
    assert any(message in m for m in messages), messages


def test_resolve_cli_exits_2_with_the_location(hostile, capsys):
    folder, message = hostile
    code = main(["resolve", "--policy", str(folder), "--arch", "LlamaForCausalLM"])
    out, err = capsys.readouterr()
    assert code == 2 and message in err and "p.toml:" in err and "Traceback" not in err


def test_symlinks_inside_the_folder_and_allowed_folders_are_followed(tmp_path):
    folder = tmp_path / "policies"
    (folder / "real").mkdir(parents=True)
    (folder / "real" / "x.toml").write_text(CLEAN, encoding="utf-8")
    os.symlink(folder / "real" / "x.toml", folder / "p.toml")
    assert kvpolicy.load(folder).version == "2030.01.01"
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "y.toml").write_text(CLEAN.replace("2030.01.01", "2030.01.02"), encoding="utf-8")
    os.symlink(shared / "y.toml", folder / "q.toml")
    with pytest.raises(kvpolicy.PolicyError, match="outside the policy folder"):
        kvpolicy.load(folder)
    (tmp_path / "pyproject.toml").write_text('[tool.kvpolicy]\nallow-symlinks = ["shared"]\n', encoding="utf-8")
    assert kvpolicy.load(folder).version == "2030.01.02"
    from kvpolicy.lint.runner import find_config

    assert not [f for f in lint_paths([str(folder)]).findings if f.code == "KVP003"]
    config = find_config(explicit=str(tmp_path / "pyproject.toml"))
    assert not [f for f in lint_paths([str(folder)], config).findings if f.code == "KVP003"]


def test_load_refuses_a_path_of_the_wrong_type():
    with pytest.raises(kvpolicy.PolicyError, match="path must be a str or pathlib.Path"):
        kvpolicy.load(123)  # type: ignore[arg-type]


def test_a_cases_file_is_not_a_policy(capsys):
    code = main(["diff", "policies/2026.08.11.cases.toml", "policies/2026.08.24.toml"])
    err = capsys.readouterr().err
    assert code == 2 and "this is a test file" in err and err.count("problem") == 1


def test_a_whole_serving_config_gets_the_right_hint():
    with pytest.raises(kvpolicy.ContextError, match=r"pass config\['cache_transceiver_config'\]"):
        kvpolicy.load().resolve({"cache_transceiver_config": {"backend": "UCX"}})


def test_a_near_miss_architecture_is_refused_and_ignored_env_values_get_notes(capsys):
    # A typo of a named architecture would resolve as "any other model": on UCX, "can start",
    # where the real LlamaForCausalLM cannot. The CLI refuses it (exit 2) with did-you-mean.
    code = main(["resolve", "--arch", "LlamaForCausalLm", "--backend", "UCX"])
    captured = capsys.readouterr()
    assert code == 2
    assert "--arch 'LlamaForCausalLm'" in captured.err and "did you mean 'LlamaForCausalLM'?" in captured.err
    assert "can start" not in captured.out
    code = main(["resolve", "--arch", "LlamaForCausalLM", "--runtime", "auto", "--kv-cache-manager", "auto", "--env", "TRTLLM_USE_UCX_KVCACHE=true"])
    out = capsys.readouterr().out
    assert code == 0
    assert "note: TRTLLM_USE_UCX_KVCACHE='true' is ignored" in out
    code = main(
        ["resolve", "--arch", "LlamaForCausalLM", "--runtime", "auto", "--kv-cache-manager", "auto", "--env", "TRTLLM_USE_UCX_KVCACHE=1", "--format", "json"]
    )
    assert "notes" not in json.loads(capsys.readouterr().out)


def test_a_real_architecture_one_letter_from_a_named_one_is_not_a_typo(capsys):
    # Gemma3n is a real model (transformers names it), not a misspelt Gemma3.
    code = main(["resolve", "--arch", "Gemma3nForConditionalGeneration", "--backend", "NIXL"])
    assert code == 0, capsys.readouterr().err
    assert "did you mean" not in capsys.readouterr().out


def test_the_api_refuses_a_near_miss_architecture_by_default_and_strict_false_keeps_it_a_warning():
    """Issue 35: the API and the CLI agree. A near miss of a name the policy knows is an error by
    default (the CLI refuses it too); strict=False keeps today's lenient warning."""
    import kvpolicy

    auto = {"transceiver_runtime": "auto", "kv_cache_manager": "auto"}  # 1.4's field defaults are not auto
    refused = kvpolicy.resolve(architecture="LlamaForCausalLm", backend="UCX", **auto)
    assert not refused.ok and [d.id for d in refused.errors] == ["architecture-near-miss"]
    assert "did you mean 'LlamaForCausalLM'?" in refused.errors[0].message
    lenient = kvpolicy.resolve(architecture="LlamaForCausalLm", backend="UCX", strict=False, **auto)
    assert lenient.ok and [d.id for d in lenient.warnings] == ["architecture-near-miss"]
    assert kvpolicy.resolve(architecture="LlamaForCausalLM", backend="NIXL").ok
    assert kvpolicy.resolve(architecture="SomeNewModelForCausalLM", backend="NIXL").ok  # not a near miss of anything
    with pytest.raises(kvpolicy.ContextError):
        kvpolicy.resolve(architecture="LlamaForCausalLM", strict="yes")


AGREEING = """
[[decisions.transceiver_runtime.requirement]]
id = "{first}"
when = {{ features.pipelined_transfer = true }}
value = "PYTHON"
notice = {{ severity = "warning", message = "first note" }}
reason = "r"
source = "s"

[[decisions.transceiver_runtime.requirement]]
id = "{second}"
when = {{ features.pipelined_transfer = true, backend = "NIXL" }}
value = "PYTHON"
notice = {{ severity = "warning", message = "second note" }}
reason = "r"
source = "s"
"""


@pytest.mark.parametrize("first,second", [("a-req", "b-req"), ("z-req", "b-req")])
def test_agreeing_requirements_decide_together_whatever_their_names(tmp_path, first, second):
    """Every agreeing requirement's note is reported, and decided_by names all of them (ids
    sorted), so renaming one never changes which rule is said to decide; lint flags the narrower
    one as redundant."""
    text = CLEAN.replace(
        '[[decisions.transceiver_runtime.requirement]]\nid = "pipelined-transfer-requires-python"\n'
        'when = { features.pipelined_transfer = true }\nvalue = "PYTHON"\nreason = "Only PYTHON pipelines."\nsource = "fixture"\n',
        AGREEING.format(first=first, second=second),
    )
    path = _write(tmp_path, text)
    resolution = kvpolicy.load(path).resolve(features={"pipelined_transfer"}, backend="NIXL")
    assert resolution.decided_by["transceiver_runtime"] == "+".join(sorted((first, second)))
    assert {"first note", "second note"} <= {d.message for d in resolution.warnings}
    findings = lint_paths([str(path)]).findings
    assert [(f.code, second in f.message.split(" is redundant")[0]) for f in findings if f.code == "KVP024"] == [("KVP024", True)]
