"""Shared helpers of the lint tests: fixtures, golden files, running the CLI in the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpolicy.cli import main
from tests.support import golden

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
GOLDEN = HERE / "golden"
REPO = HERE.parents[1]


def check_golden(name: str, text: str) -> None:
    """Compare ``text`` with ``tests/lint/golden/name``.

    After an intended change of output, regenerate every golden file with
    ``KVPOLICY_UPDATE_GOLDEN=1 pytest tests/lint`` and review the diff.
    """
    golden.check_golden(GOLDEN / name, text)


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    # Findings print paths relative to the working directory; pin it so golden files are stable.
    monkeypatch.chdir(REPO)


@pytest.fixture
def cli(capsys):
    """Run ``kvpolicy ARGV...``; returns (exit code, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run
