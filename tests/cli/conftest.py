"""Fixtures of the command tests: running ``kvpolicy ARGV...`` in-process."""

from __future__ import annotations

import pytest

from kvpolicy.cli import main

from tests.support.constants import REPO


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run ``kvpolicy ARGV...`` in the repository root (findings print paths relative to it);
    returns (exit code, stdout, stderr)."""
    monkeypatch.chdir(REPO)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run
