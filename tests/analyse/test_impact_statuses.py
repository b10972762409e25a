"""What `kvpolicy impact` says of a config: each status for the reason its name gives, the shape
problems of a file, every server of a deployment checked, and the models of an unknown
architecture listed in a fixed order. Small policies written here make each case happen."""

from __future__ import annotations

from pathlib import Path

import kvpolicy
from kvpolicy.analyse.impact import impact_of

from tests.support.constants import CLEAN  # PYTHON needs NIXL (an error)

BROKEN = "cache_transceiver_config: {backend: UCX, transceiver_runtime: PYTHON}\n"


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def policy(tmp_path: Path, name: str, text: str | None = None) -> kvpolicy.PolicySet:
    return kvpolicy.load(write(tmp_path / "policies" / name, "policy.toml", text or CLEAN.read_text(encoding="utf-8")))


def test_a_config_failing_for_the_same_error_in_both_versions_is_still_failing(tmp_path: Path) -> None:
    old, new = policy(tmp_path, "old"), policy(tmp_path, "new")
    (result,) = impact_of([write(tmp_path, "c.yaml", BROKEN)], old, new)
    (section,) = result.sections
    assert section.old.error_ids == section.new.error_ids == ("python-requires-nixl",)
    assert section.known_status == "still failing" and result.status == "still failing"


def test_a_config_failing_for_another_error_in_the_new_version_fails_differently(tmp_path: Path) -> None:
    renamed = CLEAN.read_text(encoding="utf-8").replace('id = "python-requires-nixl"', 'id = "python-runs-on-nixl-only"')
    old, new = policy(tmp_path, "old"), policy(tmp_path, "new", renamed)
    (result,) = impact_of([write(tmp_path, "c.yaml", BROKEN)], old, new)
    (section,) = result.sections
    assert (section.old.error_ids, section.new.error_ids) == (("python-requires-nixl",), ("python-runs-on-nixl-only",))
    assert section.known_status == "fails differently" and result.status == "fails differently"


def test_a_config_invalid_in_one_version_and_refused_in_the_other_fails_differently(tmp_path: Path) -> None:
    # The old version knows no MPI (the config is invalid there); the new one knows it and refuses
    # PYTHON on it (an error of the resolution).
    with_mpi = CLEAN.read_text(encoding="utf-8").replace('values = ["NIXL", "UCX"]', 'values = ["NIXL", "UCX", "MPI"]')
    old, new = policy(tmp_path, "old"), policy(tmp_path, "new", with_mpi)
    config = write(tmp_path, "c.yaml", "cache_transceiver_config: {backend: MPI, transceiver_runtime: PYTHON}\n")
    (result,) = impact_of([config], old, new)
    (section,) = result.sections
    assert section.old.error_ids == ("invalid-config",) and section.new.error_ids == ("python-requires-nixl",)
    assert result.status == "fails differently"


def test_an_empty_file_is_a_problem_and_a_list_is_not_a_config(tmp_path: Path) -> None:
    old = new = policy(tmp_path, "p")
    empty = write(tmp_path, "empty.yaml", "")
    listed = write(tmp_path, "list.yaml", "- cache_transceiver_config: {backend: NIXL}\n")
    results = {Path(r.path).name: r for r in impact_of([empty, listed], old, new)}
    assert [p.message for p in results["empty.yaml"].problems] == ["the file is empty: a serving config is a mapping of LLM arguments"]
    assert [p.message for p in results["list.yaml"].problems] == ["expected a mapping at the top, got a list"]
    assert results["empty.yaml"].status == results["list.yaml"].status == "malformed"


def test_a_generation_server_is_checked_when_the_context_servers_have_no_transceiver_config(tmp_path: Path) -> None:
    # The context servers say nothing of the transceiver (they never resolve); the generation
    # servers still do, and a runtime change of theirs is reported.
    old = policy(tmp_path, "old")
    new = policy(tmp_path, "new", CLEAN.read_text(encoding="utf-8").replace('value = "CPP", reason = "CPP works', 'value = "PYTHON", reason = "CPP works'))
    config = write(
        tmp_path,
        "c.yaml",
        "backend: pytorch\ncontext_servers:\n  num_instances: 1\ngeneration_servers:\n  num_instances: 1\n"
        "  cache_transceiver_config:\n    backend: NIXL\n",
    )
    (result,) = impact_of([config], old, new)
    assert [s.name for s in result.sections] == ["generation_servers"]
    (section,) = result.sections
    assert (section.old.runtime, section.new.runtime) == ("CPP", "PYTHON")


def test_an_unreadable_model_is_reported_on_the_line_of_the_section_that_names_it(tmp_path: Path) -> None:
    # The section's own `model` names a checkpoint whose config.json names no architecture; the top
    # level names another model on line 1. The problem is the section's, on its line (5).
    old = new = policy(tmp_path, "p")
    missing = tmp_path / "models" / "broken"
    write(missing, "config.json", '{"architectures": []}')
    config = write(
        tmp_path,
        "c.yaml",
        "model: Llama-3.1-8B\nbackend: pytorch\ncontext_servers:\n  num_instances: 1\n"
        f"  model: {missing}\n  cache_transceiver_config:\n    backend: NIXL\n",
    )
    (result,) = impact_of([config], old, new)
    located = [(p.line, p.message) for p in result.problems]
    assert located and all(line == 5 for line, _ in located), located
    assert any(str(missing) in message for _, message in located), located


def test_the_models_of_an_unknown_architecture_are_listed_by_architecture_then_model_type(tmp_path: Path) -> None:
    # The old version names model_type zeta, the new one alpha as well: both change runtime, and the
    # labels come sorted although the new version's model was met last.
    plain = '  { architecture = "GptOssForCausalLM", value = "PYTHON", reason = "GPT-OSS prefers PYTHON.", source = "fixture" },\n'
    row = '  {{ architecture = "GptOssForCausalLM", model_type = "{}", value = "{}", reason = "r.", source = "fixture" }},\n'
    base = CLEAN.read_text(encoding="utf-8")
    old = policy(tmp_path, "old", base.replace(plain, plain + row.format("zeta", "CPP")))
    new = policy(tmp_path, "new", base.replace(plain, plain + row.format("zeta", "PYTHON") + row.format("alpha", "CPP")))
    (result,) = impact_of([write(tmp_path, "c.yaml", "cache_transceiver_config: {backend: NIXL}\n")], old, new)
    changed = dict(result.possibilities)["runtime changes"]
    assert changed == ("GptOssForCausalLM (model_type alpha)", "GptOssForCausalLM (model_type zeta)"), result.possibilities


def test_a_section_whose_status_depends_on_which_of_two_models_it_runs_is_architecture_unknown(tmp_path: Path) -> None:
    # The new version drops GPT-OSS's PYTHON preference: its runtime changes, any other model's
    # does not. Two classes, two statuses: the section is not reported "unchanged".
    old = policy(tmp_path, "old")
    new = policy(tmp_path, "new", CLEAN.read_text(encoding="utf-8").replace('value = "PYTHON", reason = "GPT-OSS', 'value = "CPP", reason = "GPT-OSS'))
    (result,) = impact_of([write(tmp_path, "c.yaml", "cache_transceiver_config: {backend: NIXL}\n")], old, new)
    (section,) = result.sections
    assert section.possibilities == (("runtime changes", ("GptOssForCausalLM",)), ("unchanged", ("any other architecture",)))
    assert section.known_status == "unchanged"
    assert section.status == result.status == "architecture unknown"


def test_sides_that_disagree_under_both_versions_for_every_model_are_still_failing(tmp_path: Path) -> None:
    # Context on UCX, generation on NIXL, the model unknown: the sides cannot talk under either
    # version whatever the model, so the config neither starts nor stops failing.
    old = new = policy(tmp_path, "p")
    config = write(
        tmp_path,
        "c.yaml",
        "backend: pytorch\ncontext_servers:\n  cache_transceiver_config:\n    backend: UCX\n"
        "generation_servers:\n  cache_transceiver_config:\n    backend: NIXL\n",
    )
    (result,) = impact_of([config], old, new)
    assert not result.architecture_known
    assert result.mismatch_old is not None and result.mismatch_old == result.mismatch_new
    assert [status for status, _ in result.possibilities] == ["still failing"]
    assert result.status == "still failing"


def test_an_empty_file_is_located_at_line_1_column_1_and_a_top_level_scalar_at_line_1(tmp_path: Path) -> None:
    old = new = policy(tmp_path, "p")
    empty = write(tmp_path, "empty.yaml", "\n\n")
    listed = write(tmp_path, "list.yaml", "\n- cache_transceiver_config: {backend: NIXL}\n")
    results = {Path(r.path).name: r for r in impact_of([empty, listed], old, new)}
    (problem,) = results["empty.yaml"].problems
    assert (problem.line, problem.column) == (1, 1) and problem.location == f"{empty}:1:1"
    (problem,) = results["list.yaml"].problems
    assert (problem.line, problem.column) == (1, None) and problem.location == f"{listed}:1"


def test_a_top_level_list_without_a_transceiver_config_is_skipped_unless_named(tmp_path: Path) -> None:
    # In a folder it is not a serving config (counted as skipped); named on its own, saying nothing
    # would read as "fine", so it is a problem.
    old = new = policy(tmp_path, "p")
    listed = write(tmp_path / "configs", "list.yaml", "- model: some/model\n- backend: pytorch\n")
    (in_folder,) = impact_of([listed.parent], old, new)
    assert in_folder.skipped and not in_folder.problems
    (named,) = impact_of([listed], old, new)
    assert not named.skipped and named.status == "malformed"
    assert "no cache_transceiver_config" in named.problems[0].message


def test_the_model_of_a_config_no_policy_resolves_is_reported_only_when_it_is_a_path(tmp_path: Path) -> None:
    # The TensorRT backend is never resolved (no server has an identity): the model reported is
    # the config's own `model`, when it is a string.
    old = new = policy(tmp_path, "p")
    named = write(tmp_path, "named.yaml", "model: some/model\nbackend: tensorrt\ncache_transceiver_config: {backend: NIXL}\n")
    numbered = write(tmp_path, "numbered.yaml", "model: 7\nbackend: tensorrt\ncache_transceiver_config: {backend: NIXL}\n")
    results = {Path(r.path).name: r for r in impact_of([named, numbered], old, new)}
    assert results["named.yaml"].model == "some/model" and results["named.yaml"].status == "unchanged"
    assert results["numbered.yaml"].model is None and results["numbered.yaml"].status == "malformed"


def test_a_checkpoint_naming_only_its_model_type_is_resolved_for_every_model_not_malformed(tmp_path: Path) -> None:
    # config.json without `architectures` but with a model_type is usable: the architecture stays
    # unknown (every class of models is resolved), and the file is no problem of the config's.
    old = new = policy(tmp_path, "p")
    checkpoint = tmp_path / "models" / "typed"
    write(checkpoint, "config.json", '{"model_type": "llama"}')
    config = write(tmp_path, "c.yaml", f"model: {checkpoint}\ncache_transceiver_config: {{backend: NIXL}}\n")
    (result,) = impact_of([config], old, new)
    assert not result.problems and result.model_type == "llama" and not result.architecture_known
    assert result.status == "unchanged"


def test_every_section_is_read_after_one_with_a_problem(tmp_path: Path) -> None:
    # Both sides misspell a field: each problem is reported, on its own line, not only the first.
    old = new = policy(tmp_path, "p")
    config = write(
        tmp_path,
        "c.yaml",
        "backend: pytorch\ncontext_servers:\n  num_instances: 1\n  cache_transceiver_config:\n    backend: NIXL\n"
        "    max_tokens_in_bufer: 1024\ngeneration_servers:\n  num_instances: 1\n  cache_transceiver_config:\n"
        "    backend: NIXL\n    max_tokens_in_bufer: 2048\n",
    )
    (result,) = impact_of([config], old, new)
    assert result.status == "malformed"
    assert sorted(p.line for p in result.problems) == [6, 11], [(p.line, p.message) for p in result.problems]


def test_every_section_is_read_after_one_whose_model_cannot_be_read(tmp_path: Path) -> None:
    # Each side names its own broken checkpoint: both are reported, each on its section's line.
    old = new = policy(tmp_path, "p")
    for name in ("ctx", "gen"):
        write(tmp_path / "models" / name, "config.json", '{"architectures": []}')
    config = write(
        tmp_path,
        "c.yaml",
        f"backend: pytorch\ncontext_servers:\n  num_instances: 1\n  model: {tmp_path / 'models' / 'ctx'}\n"
        "  cache_transceiver_config:\n    backend: NIXL\ngeneration_servers:\n  num_instances: 1\n"
        f"  model: {tmp_path / 'models' / 'gen'}\n  cache_transceiver_config:\n    backend: NIXL\n",
    )
    (result,) = impact_of([config], old, new)
    assert [p.line for p in result.problems] == [4, 9], [(p.line, p.message) for p in result.problems]
