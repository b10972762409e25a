"""Shared fixtures for the engine tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvpolicy
from kvpolicy.read.loader import shipped_root

#: Every shipped version, oldest first.
VERSIONS = tuple(kvpolicy.load().versions())


@pytest.fixture(scope="session")
def shipped() -> dict[str, kvpolicy.PolicySet]:
    """Every shipped policy version, loaded once."""
    return {v: kvpolicy.load(version=v) for v in VERSIONS}


@pytest.fixture(scope="session")
def newest(shipped: dict[str, kvpolicy.PolicySet]) -> kvpolicy.PolicySet:
    return shipped[VERSIONS[-1]]


@pytest.fixture
def policy_text() -> str:
    """The newest shipped policy's text, for tests that edit a copy."""
    return (shipped_root() / f"{VERSIONS[-1]}.toml").read_text(encoding="utf-8")


def write(tmp_path: Path, text: str, name: str = "policy.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path
