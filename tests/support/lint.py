"""Helpers of the lint tests: git in a scratch repository, two versions of the clean fixture, and
checking a KVP030 finding's claim on its own counterexample."""

from __future__ import annotations

import re
import subprocess

import kvpolicy

from tests.support.constants import FIXTURES


def git(*args, cwd):
    """Run ``git ARGS`` in ``cwd`` (quietly; fails the test on an error)."""
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def resolve_fields(context: dict) -> dict:
    """A finding's counterexample as ``resolve`` takes it."""
    fields = dict(context)
    if "model_type" in fields:
        fields["pretrained_config"] = {"architectures": [fields.pop("architecture")], "model_type": fields.pop("model_type")}
    if "features" in fields:
        fields["features"] = set(fields["features"])
    return fields


def claim_holds(finding) -> None:
    """A KVP030 finding's own words, checked on its counterexample: under auto the context fails,
    and with the value it names instead every check passes (the other decisions' errors included)."""
    policy_set = kvpolicy.load(finding.location.path)
    claim = re.search(r"(backend|transceiver_runtime|kv_cache_manager) = (\w+) would pass", finding.message)
    assert claim and finding.context is not None, finding.message
    decision, working = claim.groups()
    fields = resolve_fields(finding.context)
    assert not policy_set.resolve(**fields).ok, f"{finding.location}: the counterexample starts under auto"
    explicit = policy_set.resolve(**{**fields, decision: working})
    assert explicit.ok, f"{finding.location}: {decision} = {working} fails: {[d.id for d in explicit.errors]}"


def two_versions(tmp_path, first: str, second: str, folder: str = "policies") -> str:
    """A folder holding two versions of the clean fixture, 2030.01.01 and 2030.01.02, edited by
    ``first`` and ``second`` (text -> text)."""
    root = tmp_path / folder
    root.mkdir(parents=True, exist_ok=True)
    clean = (FIXTURES / "clean.toml").read_text()
    (root / "a.toml").write_text(first(clean))
    (root / "b.toml").write_text(second(clean.replace('version = "2030.01.01"', 'version = "2030.01.02"')))
    return str(root)


def with_source(text: str, source: str) -> str:
    """The clean fixture's text with its top-level ``source`` replaced."""
    return text.replace('source = "kvpolicy tests"', f'source = "{source}"', 1)
