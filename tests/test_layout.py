"""The package's layout keeps its promises: every documented import works, no module reaches into
another's private names, and no two modules import each other (type-only and lazy imports count)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest



ROOT = Path(__file__).resolve().parents[1]
#: Where each package's modules live in the repository (pyproject.toml's package-dir).
FOLDERS = {"kvpolicy": ROOT / "engine", "kvpolicy.transports": ROOT / "transports"}

#: The names design.md, the README and the documentation site tell users to import.
DOCUMENTED = [
    ("kvpolicy", "load"),
    ("kvpolicy", "resolve"),
    ("kvpolicy", "PolicySet"),
    ("kvpolicy", "Resolution"),
    ("kvpolicy", "Diagnostic"),
    ("kvpolicy", "PolicyError"),
    ("kvpolicy", "ContextError"),
    ("kvpolicy", "ResolutionError"),
    ("kvpolicy", "DecisionLog"),
    ("kvpolicy", "PolicyWatcher"),
    ("kvpolicy.watch", "PolicyWatcher"),
    ("kvpolicy.decisionlog", "DecisionLog"),
    ("kvpolicy.lint", "lint_paths"),
    ("kvpolicy.lint", "RULES"),
    ("kvpolicy.lint", "LintConfig"),
    ("kvpolicy.transports", "open_transceiver"),
    ("kvpolicy.transports", "KVLayout"),
    ("kvpolicy.transports", "BlockPool"),
    ("kvpolicy.transports.discovery", "EtcdRegistry"),
    ("kvpolicy.transports.discovery", "EtcdSecurity"),
    ("kvpolicy.policies", None),
]


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if package == "kvpolicy" and name.startswith("kvpolicy.transports"):
                continue
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import in a module, wherever it is."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [alias.name for alias in node.names]
            # `from package import module` imports the module
            for alias in names:
                if f"{module}.{alias}" in MODULES:
                    out.append((f"{module}.{alias}", [], node.lineno))
            out.append((module, names, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out.append((alias.name, [], node.lineno))
    return [(m, n, line) for m, n, line in out if m in MODULES]


@pytest.mark.parametrize(("module", "name"), DOCUMENTED, ids=lambda v: str(v))
def test_every_documented_import_works(module, name):
    imported = importlib.import_module(module)
    if name is not None:
        assert getattr(imported, name) is not None


def test_no_module_imports_another_modules_private_names():
    reaching = []
    for name, path in MODULES.items():
        for module, names, line in _imports(name, path):
            if module == name:
                continue
            for taken in names:
                if taken.startswith("_") and not taken.startswith("__"):
                    reaching.append(f"{path.relative_to(ROOT)}:{line}: {module}.{taken}")
    assert reaching == [], "make the helper public in the module that owns it"


def test_no_import_circles_type_only_and_lazy_imports_included():
    graph = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for module, _, _ in _imports(name, path):
            if module != name and not name.startswith(module + ".") and module in graph:
                # importing a package runs its __init__; a package's own __init__ importing its
                # submodules is how packages work, and is not a circle
                graph[name].add(module)
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert circles == [], "\n".join(" <-> ".join(c) for c in circles)


def test_the_tree_shows_the_phases():
    engine = FOLDERS["kvpolicy"]
    packages = sorted(p.parent.name for p in engine.glob("*/__init__.py"))
    assert packages == ["analyse", "cli", "demo", "evaluate", "lint", "read", "report", "serving", "upstream"]
    top = sorted(p.stem for p in engine.glob("*.py"))
    assert top == ["__init__", "__main__", "decisionlog", "errors", "fuzzing", "records", "version", "watch", "wording"]


# -- tests/ mirrors the source ---------------------------------------------------------------------

TESTS = ROOT / "tests"
#: Where each source package's tests live: a test sits beside the package it tests.
TEST_FOLDERS = {
    "kvpolicy": "tests/api",  # the top-level API: resolve(), load(), PolicySet, watch, decisionlog
    "kvpolicy.read": "tests/read",
    "kvpolicy.evaluate": "tests/evaluate",
    "kvpolicy.analyse": "tests/analyse",
    "kvpolicy.lint": "tests/lint",
    "kvpolicy.serving": "tests/serving",
    "kvpolicy.report": "tests/report",
    "kvpolicy.cli": "tests/cli",
    "kvpolicy.upstream": "tests/upstream",
    "kvpolicy.demo": "tests/demo",
    "kvpolicy.transports": "tests/transports",
}
#: The folders of tests/ that test no one package: the helpers the suites share, two hosts and etcd
#: (tests.testbed), mutation testing.
SHARED_FOLDERS = {"tests/support", "tests/testbed", "tests/mutation"}


def test_every_source_package_has_its_tests_folder():
    engine = FOLDERS["kvpolicy"]
    packages = {"kvpolicy", "kvpolicy.transports"} | {f"kvpolicy.{p.parent.name}" for p in engine.glob("*/__init__.py")}
    assert sorted(TEST_FOLDERS) == sorted(packages), "name the tests folder of every package here"
    for package, folder in TEST_FOLDERS.items():
        assert sorted((ROOT / folder).glob("test_*.py")), f"{package}: no test module in {folder}"
    folders = {str(p.relative_to(ROOT)) for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(TEST_FOLDERS.values()) | SHARED_FOLDERS, "a tests folder per package, helpers in tests/support"


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _imported_modules(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names taken from it, line) for every import in a file under tests/ (or bench/),
    wherever it is; relative imports resolved against the file's package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((module, [alias.name for alias in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out.extend((alias.name, [], node.lineno) for alias in node.names)
    return out


def test_no_test_module_imports_another_test_modules_names():
    taken = []
    for path in _test_files():
        for module, names, line in _imported_modules(path):
            last = module.rpartition(".")[2]
            modules = [last] + [name for name in names if (ROOT / module.replace(".", "/") / f"{name}.py").exists()]
            for imported in modules:
                if imported.startswith("test_"):
                    taken.append(f"{path.relative_to(ROOT)}:{line}: {module} {names}")
    assert taken == [], "move what more than one test module uses into tests/support"


def test_every_tests_folder_is_a_package_and_imported_by_its_package_path():
    """Each folder of tests/ is a package (``tests.transports``, ...): its modules import one another
    relatively or as ``tests.<folder>.<module>``, and so do the benchmarks and the worker processes
    multiprocessing starts (they unpickle their target by that name). A bare-name import of a sibling
    works only where someone put that folder on sys.path."""
    folders = sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert [str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists()] == [], "give it an __init__.py"
    workers = {p.stem for p in (TESTS / "transports").glob("*.py")}
    bare = []
    for path in [*_test_files(), *sorted((ROOT / "bench").glob("*.py"))]:
        for module, _, line in _imported_modules(path):
            top = module.partition(".")[0]
            sibling = path.parent != ROOT / "bench" and (path.parent / f"{top}.py").exists()
            if sibling or (path.parent == ROOT / "bench" and top in workers):
                bare.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert bare == [], "import it as tests.<folder>.<module> (or relatively from its own folder)"


def _comments(path: Path) -> list[tuple[int, str]]:
    import tokenize

    with path.open(encoding="utf-8") as handle:
        return [(t.start[0], t.string) for t in tokenize.generate_tokens(handle.readline) if t.type == tokenize.COMMENT]


def test_every_type_ignore_and_noqa_names_its_codes_and_says_why():
    """A silenced checker finding is a decision: it names the codes it silences and says why after
    them (``# type: ignore[union-attr]  # a result exists only with data.old``)."""
    import re

    ignore = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]+\])?(?P<rest>.*)")
    noqa = re.compile(r"#\s*noqa(?P<codes>:\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(?P<rest>.*)")
    found = []
    # tests/ is linted (`make lint`) but not type-checked: its noqa comments only.
    checked = [(folder, (ignore, noqa)) for folder in FOLDERS.values()] + [(ROOT / "tests", (noqa,))]
    for folder, patterns in checked:
        for path in sorted(folder.rglob("*.py")):
            for line, comment in _comments(path):
                for pattern in patterns:
                    match = pattern.search(comment)
                    if match is None:
                        continue
                    reason = match.group("rest").strip(" -#:")
                    if not match.group("codes") or not reason:
                        found.append(f"{path.relative_to(ROOT)}:{line}: {comment.strip()}")
    assert not found, "name the codes and say why after them:\n" + "\n".join(found)
