"""Fixtures of the ``kvpolicy upstream`` tests: the shipped version they compare with, a tree that
states it, and the same version with an ``[upstream]`` baseline recording that tree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from . import trees


@pytest.fixture(scope="session")
def shipped_policy(shipped):
    """The typed model of the shipped version these tests compare with (:data:`trees.SHIPPED`,
    2026.10.22, no [upstream] baseline), from the suite's ``shipped`` policy sets."""
    return shipped[trees.SHIPPED].policy


@pytest.fixture
def matching(tmp_path, shipped_policy) -> Path:
    """A tree stating exactly 2026.10.22's facts."""
    return trees.tree_matching(shipped_policy, tmp_path / "tree")


@dataclass
class Baselined:
    root: Path
    folder: Path
    policy: object
    facts: object


@pytest.fixture
def baselined(tmp_path, shipped_policy) -> Baselined:
    """The matching tree, and a copy of 2026.10.22 whose [upstream] records it exactly."""
    root = trees.tree_matching(shipped_policy, tmp_path / "tree")
    facts = trees.facts_of(root)
    folder = trees.policy_folder(tmp_path / "policies", upstream=trees.baseline_of(facts))
    return Baselined(root, folder, trees.load_policy(folder), facts)
