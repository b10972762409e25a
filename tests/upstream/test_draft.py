"""``kvpolicy upstream draft``: the next version from a tree, its rows' provenance from git, and the
round trip draft -> (a person reads the TODOs) -> ``kvpolicy upstream check`` exits 0."""

from __future__ import annotations

import json
import re
import shutil

import pytest

import kvpolicy

from . import trees
from .trees import IMPORTS, MODELS, cli, commit_all, git, model_class, module, policy_folder, tree_matching

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

FIRST = "2026-12-01T10:00:00+00:00"
SECOND = "2027-01-05T12:00:00+00:00"
NOVEL = {f"{MODELS}/modeling_novel.py": module(IMPORTS, model_class("Novel", ["NovelForCausalLM"], runtime="PYTHON"))}
TODO_COMMENT = re.compile(r"[ \t]*# TODO\(kvpolicy new\)[^\n]*")


def _checkout(path, shipped_policy, subject="Add the model zoo (#11111)"):
    root = tree_matching(shipped_policy, path)
    git(root, "init", "-q")
    commit_all(root, subject, FIRST)
    return root


def _row(text: str, arch: str) -> str:
    rows = [line for line in text.splitlines() if f'architecture = "{arch}"' in line]
    assert len(rows) == 1, rows
    return rows[0]


def test_a_draft_from_a_stating_tree_passes_check_once_its_todo_comments_are_removed(tmp_path, shipped_policy, capsys):
    root = _checkout(tmp_path / "tree", shipped_policy)
    folder = policy_folder(tmp_path / "policies", cases=True)
    code, out, err = cli(capsys, "upstream", "draft", root, "--dir", folder, "--as", "2027.01.01")
    assert code == 0, err
    assert "warning" not in err
    drafted = folder / "2027.01.01.toml"
    text = drafted.read_text()
    assert (folder / "2027.01.01.cases.toml").is_file()
    facts = trees.facts_of(root)
    # every env name and fingerprint is recorded, each marked for a person to read
    assert text.count("TODO(kvpolicy new)") >= len(facts.env) + len(facts.logic)
    policy = kvpolicy.load(str(folder), version="2027.01.01").policy
    assert set(policy.upstream.env) == set(facts.env)
    assert policy.upstream.fingerprints == {name: fact.fingerprint for name, fact in facts.logic.items()}
    assert policy.upstream.read.startswith("TensorRT-LLM checkout tree at ")
    assert [r.architecture for r in policy.rows()] == [r.architecture for r in shipped_policy.rows()]  # nothing to draft

    drafted.write_text(TODO_COMMENT.sub("", text))
    code, out, err = cli(capsys, "upstream", "check", root, "--policy", folder, "--version", "2027.01.01")
    assert code == 0, out
    assert "no drift" in out


def test_a_drafted_row_cites_the_pr_and_date_of_the_commit_that_added_its_hook(tmp_path, shipped_policy, capsys):
    root = _checkout(tmp_path / "tree", shipped_policy)
    trees.write(root, NOVEL)
    commit_all(root, "[None][feat] Prefer the Python transceiver for Novel (#12345)", SECOND)
    head = git(root, "rev-parse", "HEAD").strip()
    folder = policy_folder(tmp_path / "policies", cases=True)
    code, out, err = cli(capsys, "upstream", "draft", root, "--dir", folder, "--as", "2027.02.01")
    assert code == 0, err
    assert "added transceiver_runtime row NovelForCausalLM = PYTHON" in out
    text = (folder / "2027.02.01.toml").read_text()
    row = _row(text, "NovelForCausalLM")
    assert f"NVIDIA/TensorRT-LLM #12345 (merged 2027-01-05, commit {head[:8]})" in row
    assert f"{MODELS}/modeling_novel.py" in row and "TODO" not in row
    policy = kvpolicy.load(str(folder), version="2027.02.01").policy
    assert [(r.architecture, r.value) for r in policy.decisions["transceiver_runtime"].preference.rows if r.architecture == "NovelForCausalLM"] == [
        ("NovelForCausalLM", "PYTHON")
    ]
    cases = (folder / "2027.02.01.cases.toml").read_text()
    assert 'name = "NovelForCausalLM prefers PYTHON (transceiver_runtime; drafted by kvpolicy upstream)"' in cases


def test_a_commit_subject_without_a_pr_number_is_cited_by_its_commit(tmp_path, shipped_policy, capsys):
    root = _checkout(tmp_path / "tree", shipped_policy)
    trees.write(root, NOVEL)
    commit_all(root, "Prefer Python for Novel", SECOND)
    folder = policy_folder(tmp_path / "policies")
    assert cli(capsys, "upstream", "draft", root, "--dir", folder, "--as", "2027.02.01")[0] == 0
    row = _row((folder / "2027.02.01.toml").read_text(), "NovelForCausalLM")
    assert "(2027-01-05, 'Prefer Python for Novel': its subject names no PR)" in row


def test_without_as_the_version_is_the_head_commit_date(tmp_path, shipped_policy, capsys):
    root = _checkout(tmp_path / "tree", shipped_policy)
    trees.write(root, NOVEL)
    commit_all(root, "Novel (#12345)", SECOND)
    folder = policy_folder(tmp_path / "policies")
    code, out, _ = cli(capsys, "upstream", "draft", root, "--dir", folder)
    assert code == 0 and (folder / "2027.01.05.toml").is_file()


def test_without_git_a_drafted_row_holds_a_placeholder_that_lint_refuses(tmp_path, shipped_policy, capsys):
    root = tree_matching(shipped_policy, tmp_path / "tree", extra=NOVEL)
    folder = policy_folder(tmp_path / "policies")
    code, out, err = cli(capsys, "upstream", "draft", root, "--dir", folder, "--as", "2027.02.01")
    assert code == 0, err
    text = (folder / "2027.02.01.toml").read_text()
    row = _row(text, "NovelForCausalLM")
    assert 'source = "TODO(kvpolicy new): the upstream PR, merge date and file behind NovelForCausalLM' in row
    row_line = text.splitlines().index(row) + 1
    code, out, err = cli(capsys, "lint", folder, "--format", "json")
    assert code == 1
    findings = json.loads(out)["findings"]
    assert any(f["code"] == "KVP042" and f["line"] == row_line and f["filename"].endswith("2027.02.01.toml") for f in findings), findings


def test_a_changed_hook_rewrites_the_row_in_place_with_its_new_source(tmp_path, shipped_policy, capsys):
    root = _checkout(tmp_path / "tree", shipped_policy)
    folder = policy_folder(tmp_path / "policies")
    later = tree_matching(shipped_policy, tmp_path / "later", edit={"LlamaForCausalLM": ("CPP", "V2")})
    for path in later.rglob("*.py"):
        target = root / path.relative_to(later)
        if not target.is_file() or target.read_bytes() != path.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    commit_all(root, "Llama goes back to C++ (#12399)", SECOND)
    code, out, err = cli(capsys, "upstream", "draft", root, "--dir", folder, "--as", "2027.02.01")
    assert code == 0, err
    assert "changed transceiver_runtime row LlamaForCausalLM: PYTHON -> CPP" in out
    text = (folder / "2027.02.01.toml").read_text()
    runtime_rows = text[text.index("[decisions.transceiver_runtime.preference]") : text.index("[decisions.kv_cache_manager]")]
    row = _row(runtime_rows, "LlamaForCausalLM")
    assert 'value = "CPP"' in row and "#12399 (merged 2027-01-05" in row


# -- refusals --


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--as", "2026.10.22"], "is not after the newest version 2026.10.22"),
        (["--as", "next-week"], "is not a version"),
        (["--as", "2027.01.01", "--from", "1999.01.01"], "1999.01.01"),
    ],
    ids=["not-after-newest", "not-a-version", "unknown-base"],
)
def test_draft_refuses_bad_arguments_with_exit_2(tmp_path, shipped_policy, capsys, args, message):
    root = tree_matching(shipped_policy, tmp_path / "tree")
    folder = policy_folder(tmp_path / "policies")
    code, out, err = cli(capsys, "upstream", "draft", root, "--dir", folder, *args)
    assert code == 2 and message in err
    assert sorted(p.name for p in folder.iterdir()) == ["2026.10.22.toml", "policy.schema.json"]


def test_draft_refuses_a_dir_that_is_not_a_folder_and_a_path_that_is_not_a_tree(tmp_path, shipped_policy, capsys):
    root = tree_matching(shipped_policy, tmp_path / "tree")
    code, _, err = cli(capsys, "upstream", "draft", root, "--dir", tmp_path / "nowhere")
    assert code == 2 and "not a folder" in err
    code, _, err = cli(capsys, "upstream", "draft", tmp_path / "nowhere", "--dir", policy_folder(tmp_path / "p"))
    assert code == 2 and "no such folder" in err


# -- bugs --


def test_an_alias_registered_later_cites_the_commit_that_registered_it(tmp_path, shipped_policy, capsys):
    root = _checkout(tmp_path / "tree", shipped_policy)
    trees.write(root, NOVEL)
    commit_all(root, "Novel (#12345)", SECOND)
    text = (root / MODELS / "modeling_novel.py").read_text()
    trees.write(
        root,
        {
            f"{MODELS}/modeling_novel.py": text.replace(
                '@register_auto_model("NovelForCausalLM")', '@register_auto_model("NovelForCausalLM")\n@register_auto_model("NovelAliasForCausalLM")'
            )
        },
    )
    commit_all(root, "Register the Novel alias (#22222)", "2027-01-20T12:00:00+00:00")
    folder = policy_folder(tmp_path / "policies")
    assert cli(capsys, "upstream", "draft", root, "--dir", folder, "--as", "2027.02.01")[0] == 0
    row = _row((folder / "2027.02.01.toml").read_text(), "NovelAliasForCausalLM")
    assert "#22222 (merged 2027-01-20" in row


def test_drafting_from_a_version_without_a_preference_table_does_not_crash(tmp_path, capsys):
    root = trees.simple_tree(tmp_path / "tree", {"modeling_novel.py": module(IMPORTS, model_class("Novel", ["NovelForCausalLM"], runtime="PYTHON"))})
    folder = policy_folder(tmp_path / "policies", version="2026.07.09")  # no transceiver_runtime preference yet
    code, out, err = cli(capsys, "upstream", "draft", root, "--dir", folder, "--as", "2027.02.01")
    assert code == 0 and (folder / "2027.02.01.toml").is_file()


def test_removing_a_row_keeps_the_other_rows_comments(tmp_path, shipped_policy, capsys):
    root = tree_matching(shipped_policy, tmp_path / "tree", edit={"Gemma3ForCausalLM": None})
    folder = policy_folder(tmp_path / "policies")
    code, out, err = cli(capsys, "upstream", "draft", root, "--dir", folder, "--as", "2027.02.01")
    assert code == 0 and "removed transceiver_runtime row Gemma3ForCausalLM" in out
    base = (folder / "2026.10.22.toml").read_text()
    text = (folder / "2027.02.01.toml").read_text()
    assert text.count("# kvpolicy: ignore[KVP030]") == base.count("# kvpolicy: ignore[KVP030]") - 1  # only the removed row's


def test_a_draft_with_a_new_row_passes_kvpolicy_check_once_a_person_has_filled_every_todo(tmp_path, shipped_policy, capsys):
    """The whole round trip of the docs' workflow: a hook added upstream in a commit with a PR number
    is drafted as a row with its source from git and a case; a person fills the summary and source and
    deletes the TODO comments (having read what they name); then `kvpolicy check` (lint, fmt --check,
    cases at 100% coverage) passes on the folder."""
    root = _checkout(tmp_path / "tree", shipped_policy)
    trees.write(root, NOVEL)
    commit_all(root, "[None][feat] Prefer the Python transceiver for Novel (#12345)", SECOND)
    folder = policy_folder(tmp_path / "policies", cases=True)
    code, out, err = cli(capsys, "upstream", "draft", root, "--dir", folder, "--as", "2027.02.01")
    assert code == 0, err
    drafted = folder / "2027.02.01.toml"
    code, out, err = cli(capsys, "check", folder)
    assert code == 1 and "KVP042" in out  # refused while anything is TODO
    text = TODO_COMMENT.sub("", drafted.read_text())
    text = re.sub(r'^summary = "TODO[^"\n]*"', 'summary = "Novel prefers the Python transceiver."', text, count=1, flags=re.M)
    text = re.sub(r'^source = "TODO[^"\n]*"', 'source = "NVIDIA/TensorRT-LLM #12345 (merged 2027-01-05): NovelForCausalLM"', text, count=1, flags=re.M)
    assert "TODO" not in text
    drafted.write_text(text)
    code, out, err = cli(capsys, "check", folder)
    assert code == 0, out + err
