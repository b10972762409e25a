"""Shared fixtures for the engine tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvpolicy
from kvpolicy.read.loader import shipped_root

#: Every shipped version, oldest first.
VERSIONS = tuple(kvpolicy.load().versions())
#: The newest version in which a field left out of a context asks the policy to decide (``auto``):
#: the engine's semantics (explicit, requirement, preference, conditional, default) are tested on it.
#: From 2026.10.22 (#17495, TensorRT-LLM 1.4) a left-out transceiver_runtime is PYTHON and a left-out
#: kv_cache_manager V2, so there a test of auto resolution writes ``auto``.
NEWEST_AUTO = max((v for v in VERSIONS if not kvpolicy.load(version=v).left_out()), key=VERSIONS.index)


@pytest.fixture(scope="session")
def shipped() -> dict[str, kvpolicy.PolicySet]:
    """Every shipped policy version, loaded once."""
    return {v: kvpolicy.load(version=v) for v in VERSIONS}


@pytest.fixture(scope="session")
def newest(shipped: dict[str, kvpolicy.PolicySet]) -> kvpolicy.PolicySet:
    """The newest version whose left-out fields request auto (:data:`NEWEST_AUTO`)."""
    return shipped[NEWEST_AUTO]


@pytest.fixture
def policy_text() -> str:
    """The text of :data:`NEWEST_AUTO`, for tests that edit a copy."""
    return (shipped_root() / f"{NEWEST_AUTO}.toml").read_text(encoding="utf-8")


def write(tmp_path: Path, text: str, name: str = "policy.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path
