"""Shared helpers for the diff and impact tests."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import kvpolicy

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[2]
VERSIONS = ("2026.07.09", "2026.08.11", "2026.08.24", "2026.09.10")


def check_golden(name: str, text: str) -> None:
    """Compare with tests/diff/golden/NAME; ``KVPOLICY_UPDATE_GOLDEN=1`` rewrites it."""
    text = re.sub(r"sha256 [0-9a-f]{12}", "sha256 <digest>", text)
    path = GOLDEN / name
    if os.environ.get("KVPOLICY_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden file {path}; run with KVPOLICY_UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def shipped() -> dict[str, kvpolicy.PolicySet]:
    """Every shipped policy version, loaded once."""
    return {v: kvpolicy.load(version=v) for v in VERSIONS}
