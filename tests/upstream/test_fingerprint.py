"""A function's logic fingerprint: blind to how the code is written, moved by what it does."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvpolicy.upstream.fingerprint import fingerprint

from .trees import REPO

BASE = '''
def resolve(backend, timeout_ms):
    """Pick the transceiver runtime."""
    if backend != "NIXL" or timeout_ms < 1000:
        return fallback(backend, "CPP")
    return "PYTHON"
'''


def fp(source: str) -> str:
    node = next(n for n in ast.parse(textwrap.dedent(source)).body if isinstance(n, ast.FunctionDef))
    return fingerprint(node)


def test_a_fingerprint_is_sixteen_hex_digits_and_stable():
    assert len(fp(BASE)) == 16 and set(fp(BASE)) <= set("0123456789abcdef")
    assert fp(BASE) == fp(BASE)


@pytest.mark.parametrize(
    "variant",
    [
        # comments
        BASE.replace("    if backend", "    # the fallback comes first\n    if backend").replace('"CPP")', '"CPP")  # C++'),
        # blank lines
        BASE.replace('\n    return "PYTHON"', '\n\n\n    return "PYTHON"').replace('"""\n', '"""\n\n'),
        # reformatting: line breaks inside brackets, spacing, indentation width
        '''
def resolve( backend ,timeout_ms ):
  """Pick the transceiver runtime."""
  if (backend != "NIXL"
          or timeout_ms<1000):
      return fallback(
          backend,
          "CPP",
      )
  return "PYTHON"
''',
        # docstrings: removed, changed, and a bare string statement elsewhere
        BASE.replace('    """Pick the transceiver runtime."""\n', ""),
        BASE.replace("Pick the transceiver runtime.", "Something else entirely, over\n    two lines."),
        BASE.replace('    return "PYTHON"', '    "a note as a bare string"\n    return "PYTHON"'),
        # quote style
        BASE.replace('"NIXL"', "'NIXL'").replace('"CPP"', "'''CPP'''").replace('"""Pick the transceiver runtime."""', "'Pick.'"),
        # position in its file
        "\n" * 200 + BASE,
    ],
    ids=["comments", "blank-lines", "reformatted", "no-docstring", "other-docstring", "bare-string", "quote-style", "moved-down"],
)
def test_the_fingerprint_ignores_how_the_code_is_written(variant):
    assert fp(variant) == fp(BASE)


@pytest.mark.parametrize(
    "variant",
    [
        BASE.replace("timeout_ms < 1000", "timeout_ms <= 1000"),
        BASE.replace('backend != "NIXL"', 'backend == "NIXL"'),
        BASE.replace(" or ", " and "),
        BASE.replace("1000", "2000"),
        BASE.replace('return "PYTHON"', 'return "CPP"'),
        BASE.replace("fallback(", "other_fallback("),
        BASE.replace('fallback(backend, "CPP")', 'fallback("CPP", backend)'),
        BASE.replace('fallback(backend, "CPP")', 'fallback(backend, "CPP", strict=True)'),
    ],
    ids=["lt-to-le", "ne-to-eq", "or-to-and", "constant-number", "constant-string", "called-function", "argument-order", "extra-keyword"],
)
def test_the_fingerprint_moves_when_what_the_code_does_changes(variant):
    assert fp(variant) != fp(BASE)


def test_fingerprinting_leaves_the_node_untouched():
    node = ast.parse(textwrap.dedent(BASE)).body[0]
    before = ast.dump(node, include_attributes=True)
    fingerprint(node)
    assert ast.dump(node, include_attributes=True) == before


def _family(version: tuple[int, int]) -> str:
    # ast.dump's format: 3.10 and 3.11 alike; 3.12 adds type_params; 3.13 leaves empty fields out.
    return "3.10-3.11" if version < (3, 12) else f"{version[0]}.{version[1]}"


_HERE = sys.version_info[:2]
_PROBE = """
import ast, importlib.util, sys
spec = importlib.util.spec_from_file_location("fingerprint", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(module.fingerprint(ast.parse(sys.stdin.read()).body[0]))
"""


@pytest.mark.parametrize(
    "version",
    [v for v in ((3, 10), (3, 11), (3, 12), (3, 13)) if v != _HERE],
    ids=lambda v: f"python{v[0]}.{v[1]}",
)
def test_the_fingerprint_is_the_same_under_every_supported_python(version):
    """requires-python is >=3.10: a baseline must mean the same under each."""
    for exe in _interpreters(version):
        probe = subprocess.run(
            [exe, "-c", _PROBE, str(REPO / "engine/upstream/fingerprint.py")], input=textwrap.dedent(BASE), capture_output=True, text=True, timeout=60
        )
        if probe.returncode == 0:
            assert probe.stdout.strip() == fp(BASE)
            return
    pytest.skip(f"no working python{version[0]}.{version[1]} on this machine")


def _interpreters(version: tuple[int, int]) -> list[str]:
    """Candidate interpreters of ``version``: on PATH, then pyenv's installs (whose shims may refuse)."""
    name = f"python{version[0]}.{version[1]}"
    found = [exe for exe in (shutil.which(name),) if exe]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if pyenv.is_dir():
        found += [str(p / "bin" / name) for p in sorted(pyenv.glob(f"{version[0]}.{version[1]}.*")) if (p / "bin" / name).is_file()]
    return found
