"""Constants every suite may read: the repository, the shipped versions, the shared fixture files."""

from __future__ import annotations

from pathlib import Path

import kvpolicy

#: The repository root.
REPO = Path(__file__).resolve().parents[2]
#: Every shipped version, oldest first.
VERSIONS = tuple(kvpolicy.load().versions())
#: The newest version in which a field left out of a context asks the policy to decide (``auto``):
#: the engine's semantics (explicit, requirement, preference, conditional, default) are tested on it.
#: From 2026.10.22 (#17495, TensorRT-LLM 1.4) a left-out transceiver_runtime is PYTHON and a left-out
#: kv_cache_manager V2, so there a test of auto resolution writes ``auto``.
NEWEST_AUTO = max((v for v in VERSIONS if not kvpolicy.load(version=v).left_out()), key=VERSIONS.index)
#: The lint suite's policy files (one per rule, and clean.toml), which other suites read too.
FIXTURES = REPO / "tests" / "lint" / "fixtures"
#: A small clean policy (null = "CPP"; PYTHON needs NIXL, an error).
CLEAN = FIXTURES / "clean.toml"
