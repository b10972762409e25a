"""Fixtures for the report tests: run the CLI in-process, parse what it wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpolicy.cli import main
from tests.report.page import Node, parse

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    # Policy locations and config paths print relative to the working directory.
    monkeypatch.chdir(REPO)


@pytest.fixture
def report(tmp_path, capsys):
    """``report(*argv) -> (exit code, page text, parsed page)``; ``-o`` is added."""

    def run(*argv: str) -> tuple[int, str, Node | None]:
        out = tmp_path / "report.html"
        if out.exists():
            out.unlink()
        code = main(["report", *argv, "-o", str(out)])
        capsys.readouterr()
        if not out.exists():
            return code, "", None
        text = out.read_text(encoding="utf-8")
        return code, text, parse(text)

    return run


@pytest.fixture
def cli_json(capsys):
    """``cli_json(*argv)``: the JSON another kvpolicy command prints."""

    def run(*argv: str):
        main(list(argv))
        return json.loads(capsys.readouterr().out)

    return run
