"""The transfer layer holds only the transfer layer: what a serving process imports.

The demo's models and runner live in ``kvpolicy.demo``, the two-host / etcd test bed in
``tests.testbed``; nothing in ``transports/`` may reach back to either (or to transformers), and every
module there stays small enough to read in one sitting.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRANSPORTS = Path(__file__).resolve().parents[2] / "transports"
MODULES = sorted(TRANSPORTS.glob("*.py"))
FORBIDDEN = ("kvpolicy.demo", "tests", "transformers", "rich")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against kvpolicy.transports
                parts = ["kvpolicy", "transports"][: 2 - (node.level - 1)] if node.level <= 2 else []
                base = ".".join(parts + ([base] if base else []))
            names.append(base)
    return names


def test_the_demo_and_the_test_bed_are_not_in_transports():
    assert MODULES, f"no modules found under {TRANSPORTS}"
    present = {p.stem for p in MODULES}
    assert not present & {"models", "disagg", "testbed", "etcd_testbed"}, present


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_transports_imports_neither_the_demo_nor_the_test_bed(path):
    bad = [n for n in _imports(path) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)]
    assert not bad, f"{path.name} imports {bad}: the transfer layer must not depend on the demo or the test bed"


def test_the_demo_package_imports_without_torch():
    import subprocess
    import sys

    code = "import sys, kvpolicy.demo; print([m for m in ('torch', 'transformers', 'zmq') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"


def test_a_serving_process_never_imports_the_probes_child_program():
    """The metadata probe's helpers run ``python -m`` :data:`.probe.CHILD_PROGRAM`; the probe itself
    only names it (its code stays out of a serving process's imports)."""
    import subprocess
    import sys

    code = (
        "import importlib.util, sys, kvpolicy.transports.probe as p;"
        "print(p.CHILD_PROGRAM in sys.modules, importlib.util.find_spec(p.CHILD_PROGRAM) is not None)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["False", "True"]
