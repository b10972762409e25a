"""Every console and API example in README.md and docs/ runs, and says what the docs say it says.

Console blocks (```` ```console ````): each ``$ COMMAND`` runs in bash, in a scratch folder that holds
the repository's ``policies/`` and ``examples/`` (so an example may write files), and what it prints
must match the lines shown under it. A line that is only ``…`` stands for any number of lines; ``…``
inside a line for any text in it (a digest, a timing, a count that depends on the machine): outputs
that depend on the machine are normalised, never skipped.

Python blocks (```` ```python ````): run top to bottom from the repository root; an expression whose
comment is a Python literal (``r.runtime  # 'PYTHON'``) must evaluate to it. A block that needs what
a docs page cannot set up (key files, a NIXL peer, an etcd server, a serving process's objects) is
preceded by ``<!-- example not run: REASON -->`` naming where the tests exercise the same calls; a
block without it and without anything to check fails, so no example is silently left out.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!-- example not run: (.+?) -->")
ELLIPSIS = "…"


def _blocks(language: str) -> list[tuple[str, int, str, str | None]]:
    """(page, line, body, reason it is not run) for every fenced block of ``language``."""
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        index = 0
        while index < len(lines):
            if lines[index].strip() == f"```{language}":
                start = index
                body = []
                index += 1
                while lines[index].strip() != "```":
                    body.append(lines[index])
                    index += 1
                before = "\n".join(lines[max(0, start - 3):start])
                marker = NOT_RUN.search(before)
                found.append((page.relative_to(REPO).as_posix(), start + 1, "\n".join(body), marker.group(1) if marker else None))
            index += 1
    return found


CONSOLE = _blocks("console")
PYTHON = _blocks("python")


def _pattern(expected: str) -> re.Pattern[str]:
    """The expected output as a regular expression: ``…`` lines and ``…`` in lines are wildcards."""
    parts = []
    for line in expected.split("\n"):
        if line.strip() == ELLIPSIS:
            parts.append(None)
        else:
            parts.append(".*?".join(re.escape(piece) for piece in line.rstrip().split(ELLIPSIS)))
    # Every line ends with a newline (the printed text gets one too), so "…" may also end a block.
    text = "".join(r"(?:[^\n]*\n)*?" if part is None else part + r"\n" for part in parts)
    return re.compile(text)


def _commands(body: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block."""
    pairs: list[tuple[str, list[str]]] = []
    for line in body.split("\n"):
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        elif pairs:
            pairs[-1][1].append(line)
    return [(command, "\n".join(out).rstrip("\n")) for command, out in pairs]


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    for name in ("policies", "examples"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_every_page_has_its_examples_found():
    assert CONSOLE and PYTHON
    assert {page for page, *_ in CONSOLE} >= {"README.md", "docs/getting-started.md", "docs/diff-impact.md"}


@pytest.mark.parametrize(("page", "line", "body", "reason"), CONSOLE, ids=[f"{p}:{n}" for p, n, *_ in CONSOLE])
def test_console_example(scratch, page, line, body, reason):
    assert reason is None, f"{page}:{line}: console examples always run"
    if "kvpolicy demo" in body:
        pytest.importorskip("torch", reason="the demo needs kvpolicy[transfer,demo] (torch)")
        pytest.importorskip("nixl", reason="the demo needs kvpolicy[transfer] (nixl)")
        pytest.importorskip("transformers", reason="the demo needs kvpolicy[demo] (transformers)")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "NO_COLOR": "1", "COLUMNS": "140"}
    env.pop("FORCE_COLOR", None)
    commands = _commands(body)
    assert commands, f"{page}:{line}: a console block without a `$ ` command"
    for command, expected in commands:
        done = subprocess.run(["bash", "-c", command], cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
        shown = "\n".join(row.rstrip() for row in done.stdout.rstrip("\n").split("\n")) if done.stdout.strip() else ""
        assert done.returncode in (0, 1, 3), f"{page}:{line}: `{command}` exited {done.returncode}: {done.stderr[-2000:]}"
        assert _pattern(expected).fullmatch(shown + "\n"), (
            f"{page}:{line}: `{command}` printed something else than the page shows.\n--- shown on the page\n"
            f"{expected}\n--- printed\n{shown}"
        )


def _checks(body: str) -> list[tuple[int, str, object]]:
    """(line, expression, expected value) for every line ``EXPR  # LITERAL`` of a block."""
    checks = []
    for number, line in enumerate(body.split("\n"), 1):
        code, sep, comment = line.partition("  #")
        if not sep or not code.strip():
            continue
        try:
            expected = ast.literal_eval(comment.strip())
            tree = ast.parse(code.strip(), mode="eval")
        except (ValueError, SyntaxError):
            continue
        checks.append((number, ast.unparse(tree), expected))
    return checks


@pytest.mark.parametrize(("page", "line", "body", "reason"), PYTHON, ids=[f"{p}:{n}" for p, n, *_ in PYTHON])
def test_python_example(monkeypatch, page, line, body, reason):
    if reason is not None:
        assert len(reason) > 20 and "tests/" in reason, f"{page}:{line}: say why and where the tests run it instead"
        return
    checks = {number: (expression, expected) for number, expression, expected in _checks(body)}
    assert checks, f"{page}:{line}: nothing to check: show a result as `EXPR  # LITERAL`, or mark the block not run"
    monkeypatch.chdir(REPO)
    namespace: dict[str, object] = {}
    statements = ast.parse(body).body
    seen = set()
    for statement in statements:
        code = compile(ast.Module([statement], []), f"{page}:{line}", "exec")
        if isinstance(statement, ast.Expr) and statement.lineno in checks:
            expression, expected = checks[statement.lineno]
            value = eval(compile(ast.Expression(statement.value), f"{page}:{line}", "eval"), namespace)
            if isinstance(expected, str) and ELLIPSIS in expected and isinstance(value, str):  # a shortened text
                same = re.fullmatch(".*?".join(map(re.escape, expected.split(ELLIPSIS))), value, re.DOTALL) is not None
            else:
                same = value == expected
            assert same, f"{page}:{line + statement.lineno}: {expression} is {value!r}, the page says {expected!r}"
            seen.add(statement.lineno)
        else:
            exec(code, namespace)
    assert seen == set(checks), f"{page}:{line}: checked lines {sorted(set(checks) - seen)} are not expressions"
