"""Every file of a tree is hostile input: limits, links, nesting, encodings, cycles and paths that
are not trees end in a problem, an unknown value or a clear TreeError, never in a traceback."""

from __future__ import annotations

import os

import pytest

from kvpolicy.upstream import source as upstream_source
from kvpolicy.upstream.drift import compare
from kvpolicy.upstream.extract import extract
from kvpolicy.upstream.source import TreeError, open_tree

from .trees import ARGS, IMPORTS, MODELS, TRANSCEIVER, Code, facts_of, model_class, module, simple_tree, write

RT = "transceiver_runtime"


def _foo(arch: str = "FooForCausalLM", name: str = "Foo") -> str:
    return module(IMPORTS, model_class(name, [arch], runtime="PYTHON"))


# -- limits --


def test_a_file_over_the_size_limit_is_skipped_and_reported(tmp_path, monkeypatch, shipped_policy):
    big = _foo("BigForCausalLM", "Big") + "\n# padding\n" * 400
    root = simple_tree(tmp_path, {"modeling_foo.py": _foo(), "modeling_big.py": big})
    monkeypatch.setattr(upstream_source, "MAX_FILE_BYTES", 2000)
    tree = open_tree(root)
    rel = f"{MODELS}/modeling_big.py"
    assert rel not in tree.files
    assert [(r, why) for r, why in tree.skipped] == [(rel, f"{len(big.encode())} bytes, over the 2000-byte limit")]
    facts = extract(tree)
    assert "BigForCausalLM" not in facts.architectures and "FooForCausalLM" in facts.architectures
    unread = [d for d in compare(facts, shipped_policy) if d.kind == "unread"]
    assert [(d.where.file, d.where.line) for d in unread] == [(rel, 1)] and "over the 2000-byte limit" in unread[0].message


def test_a_tree_with_too_many_files_is_refused(tmp_path, monkeypatch):
    root = simple_tree(tmp_path, {f"modeling_{i}.py": "" for i in range(6)})
    monkeypatch.setattr(upstream_source, "MAX_FILES", 5)
    with pytest.raises(TreeError, match="more than 5 Python files"):
        open_tree(root)


# -- links --


def test_a_symlinked_file_is_not_followed_and_is_reported(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "modeling_evil.py").write_text(_foo("EvilForCausalLM", "Evil"))
    root = simple_tree(tmp_path / "tree", {"modeling_foo.py": _foo()})
    link = root / MODELS / "modeling_evil.py"
    link.symlink_to(outside / "modeling_evil.py")
    tree = open_tree(root)
    assert (f"{MODELS}/modeling_evil.py", "a symbolic link (never followed)") in tree.skipped
    facts = extract(tree)
    assert "EvilForCausalLM" not in facts.architectures
    assert any(w.file == f"{MODELS}/modeling_evil.py" and "symbolic link" in p for w, p in facts.problems)


def test_a_symlinked_folder_is_not_descended_into(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "modeling_evil.py").write_text(_foo("EvilForCausalLM", "Evil"))
    root = simple_tree(tmp_path / "tree", {"modeling_foo.py": _foo()})
    (root / MODELS / "linked").symlink_to(outside, target_is_directory=True)
    tree = open_tree(root)
    assert not any("linked" in rel for rel in tree.files)
    assert "EvilForCausalLM" not in extract(tree).architectures


def test_a_symlinked_single_file_of_the_scope_is_not_read(tmp_path, shipped_policy):
    root = simple_tree(tmp_path / "tree")
    real = tmp_path / "elsewhere_llm_args.py"
    real.write_text((root / ARGS).read_text())
    (root / ARGS).unlink()
    (root / ARGS).symlink_to(real)
    tree = open_tree(root)
    assert (ARGS, "a symbolic link (never followed)") in tree.skipped
    drift = compare(extract(tree), shipped_policy)
    assert {d.subject for d in drift if d.kind == "unread"} >= {ARGS, "CacheTransceiverConfig"}


def test_a_symlinked_package_folder_is_not_a_tree(tmp_path):
    real = simple_tree(tmp_path / "real")
    root = tmp_path / "linked"
    root.mkdir()
    (root / "tensorrt_llm").symlink_to(real / "tensorrt_llm", target_is_directory=True)
    with pytest.raises(TreeError, match="not a TensorRT-LLM tree"):
        open_tree(root)


# -- what does not parse --


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("x = " + "(" * 200_000 + ")" * 200_000 + "\n", "does not parse"),
        ("x = " + "-" * 200_000 + "1\n", "nests deeper than Python's parser allows"),
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "does not parse"),
    ],
    ids=["parentheses", "unary-chain", "brackets"],
)
def test_a_deeply_nested_file_is_a_problem_not_a_crash(tmp_path, text, problem):
    root = simple_tree(tmp_path, {"modeling_foo.py": _foo(), "modeling_deep.py": text})
    facts = facts_of(root)
    assert "FooForCausalLM" in facts.architectures
    assert [(w.file, p.split(":")[0]) for w, p in facts.problems] == [(f"{MODELS}/modeling_deep.py", problem)]


def test_a_parseable_but_deeply_nested_rule_function_is_fingerprinted_without_recursing(tmp_path):
    """The fingerprint walks with its own stack: 2,000 nested additions (Python parses them; a recursive
    walk would pass its recursion limit) cost time, not a crash."""
    root = simple_tree(tmp_path)
    write(root, {TRANSCEIVER: "def _validate_deep(config):\n    return " + "1 + " * 2000 + "1\n"})
    facts = facts_of(root)
    key = "tensorrt_llm._torch.disaggregation.kv_cache_transceiver._validate_deep"
    assert len(facts.logic[key].fingerprint) == 16
    assert not any(w.file == TRANSCEIVER for w, _ in facts.problems)


def test_a_file_that_is_not_utf8_is_a_problem(tmp_path):
    root = simple_tree(tmp_path, {"modeling_foo.py": _foo()})
    (root / MODELS / "modeling_latin1.py").write_bytes(b'x = "caf\xe9"\n')
    facts = facts_of(root)
    assert [(w.file, p) for w, p in facts.problems] == [(f"{MODELS}/modeling_latin1.py", "not UTF-8 text (byte 8)")]


def test_a_file_with_a_syntax_error_is_a_problem_at_its_line(tmp_path):
    root = simple_tree(tmp_path, {"modeling_foo.py": _foo(), "modeling_bad.py": "a = 1\nb = 2\nclass (:\n"})
    [(where, problem)] = facts_of(root).problems
    assert (where.file, where.line) == (f"{MODELS}/modeling_bad.py", 3) and problem.startswith("does not parse")


# -- paths that are not trees --


def test_a_path_that_does_not_exist_is_a_tree_error(tmp_path):
    with pytest.raises(TreeError, match="no such folder; pass the root of a TensorRT-LLM checkout"):
        open_tree(tmp_path / "missing")


def test_a_file_is_not_a_tree(tmp_path):
    (tmp_path / "file.py").write_text("x = 1\n")
    with pytest.raises(TreeError, match="not a folder"):
        open_tree(tmp_path / "file.py")


def test_a_folder_without_the_package_is_not_a_tree(tmp_path):
    with pytest.raises(TreeError, match=r"no tensorrt_llm/ package folder in it"):
        open_tree(tmp_path)


def test_a_package_without_model_files_is_not_a_tree(tmp_path):
    write(tmp_path, {"tensorrt_llm/__init__.py": "", ARGS: "x = 1\n"})
    with pytest.raises(TreeError, match=r"tensorrt_llm/_torch/models/ holds no Python files"):
        open_tree(tmp_path)


def test_the_package_folder_itself_is_read_as_its_tree(tmp_path):
    root = simple_tree(tmp_path, {"modeling_foo.py": _foo()})
    tree = open_tree(root / "tensorrt_llm")
    assert tree.root == root and tree.kind == "directory"
    assert "FooForCausalLM" in extract(tree).architectures


# -- cycles --


def _hook(root, arch):
    return facts_of(root).architectures[arch].hooks[RT]


def test_an_inheritance_cycle_is_an_unknown_hook_not_a_recursion_error(tmp_path):
    text = module(IMPORTS, model_class("A", ["AForCausalLM"], bases=("B",)), model_class("B", ["BForCausalLM"], bases=("A",)))
    root = simple_tree(tmp_path, {"modeling_cycle.py": text})
    for arch in ("AForCausalLM", "BForCausalLM"):
        hook = _hook(root, arch)
        assert not hook.known and "do not linearise" in hook.why


def test_an_inheritance_cycle_across_modules_is_an_unknown_hook(tmp_path):
    files = {
        "modeling_a.py": module("from .modeling_b import B\nfrom .modeling_utils import register_auto_model", model_class("A", ["AForCausalLM"], bases=("B",))),
        "modeling_b.py": module("from .modeling_a import A", model_class("B", bases=("A",))),
    }
    hook = _hook(simple_tree(tmp_path, files), "AForCausalLM")
    assert not hook.known and "do not linearise" in hook.why


def test_an_inconsistent_method_order_is_an_unknown_hook(tmp_path):
    text = module(IMPORTS, model_class("X"), model_class("Y", bases=("X",)), model_class("Bad", ["BadForCausalLM"], bases=("X", "Y")))
    hook = _hook(simple_tree(tmp_path, {"modeling_mro.py": text}), "BadForCausalLM")
    assert not hook.known and "do not linearise" in hook.why


def test_a_delegation_cycle_is_an_unknown_hook(tmp_path):
    text = module(
        IMPORTS,
        model_class("Ping", ["PingForCausalLM"], runtime=Code("return Pong.get_preferred_transceiver_runtime(pretrained_config)")),
        model_class("Pong", runtime=Code("return Ping.get_preferred_transceiver_runtime(pretrained_config)")),
        model_class("Narcissus", ["NarcissusForCausalLM"], runtime=Code("return Narcissus.get_preferred_transceiver_runtime(pretrained_config)")),
    )
    root = simple_tree(tmp_path, {"modeling_ping.py": text})
    for arch in ("PingForCausalLM", "NarcissusForCausalLM"):
        hook = _hook(root, arch)
        assert not hook.known and "deeper than kvpolicy follows" in hook.why


def test_an_import_cycle_is_an_unknown_base_not_a_recursion_error(tmp_path):
    files = {
        "modeling_a.py": module(
            "from .modeling_b import Base\nfrom .modeling_utils import register_auto_model", model_class("A", ["AForCausalLM"], bases=("Base",))
        ),
        "modeling_b.py": "from .modeling_a import Base\n",
    }
    hook = _hook(simple_tree(tmp_path, files), "AForCausalLM")
    assert not hook.known and "did not read" in hook.why


def test_a_file_of_many_classes_is_read_in_one_go(tmp_path):
    """A wide (not deep) file: a thousand registered classes chained by inheritance stay fast and known."""
    classes = [model_class("C0", ["C0ForCausalLM"], runtime="PYTHON")]
    classes += [model_class(f"C{i}", [f"C{i}ForCausalLM"], bases=(f"C{i - 1}",)) for i in range(1, 60)]
    facts = facts_of(simple_tree(tmp_path, {"modeling_chain.py": module(IMPORTS, *classes)}))
    assert facts.architectures["C59ForCausalLM"].hooks[RT].value == "PYTHON"


def test_nothing_is_read_outside_the_scope(tmp_path):
    root = simple_tree(tmp_path, {"modeling_foo.py": _foo()})
    write(
        root,
        {
            "tensorrt_llm/_torch/pyexecutor/py_executor.py": "x = (",
            "setup.py": "raise SystemExit(1)\n",
            "tensorrt_llm/llmapi/llm.py": "import os\nos.environ['TRTLLM_X'] = '1'\n",
        },
    )
    tree = open_tree(root)
    assert all(rel.startswith(("tensorrt_llm/_torch/models/", "tensorrt_llm/_torch/disaggregation/")) or rel in upstream_source.SCOPE for rel in tree.files)
    assert extract(tree).problems == []
    assert os.path.isfile(root / "setup.py")
