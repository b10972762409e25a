"""Shared helpers for the diff and impact tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvpolicy
from tests import golden

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[2]
VERSIONS = tuple(kvpolicy.load().versions())


def check_golden(name: str, text: str) -> None:
    """Compare with tests/diff/golden/NAME; ``KVPOLICY_UPDATE_GOLDEN=1`` rewrites it."""
    golden.check_golden(GOLDEN / name, text)


@pytest.fixture(scope="session")
def shipped() -> dict[str, kvpolicy.PolicySet]:
    """Every shipped policy version, loaded once."""
    return {v: kvpolicy.load(version=v) for v in VERSIONS}
