"""Running kvpolicy in a serving process: hot reload, decision logs, size limits."""

from __future__ import annotations

import json
import os
import time

import pytest

import kvpolicy
from kvpolicy import DecisionLog, PolicyError, PolicyWatcher
from kvpolicy.read.loader import MAX_POLICY_BYTES

from tests.support.constants import NEWEST_AUTO
from tests.support.policies import write


def _bump(path, text, version):
    path.write_text(text.replace(f'version = "{NEWEST_AUTO}"', f'version = "{version}"'), encoding="utf-8")
    # mtime resolution can be coarse; make the change visible to the watcher regardless
    stamp = time.time() + 1
    os.utime(path, (stamp, stamp))


def test_watcher_swaps_to_a_new_valid_version(tmp_path, policy_text):
    write(tmp_path, policy_text, "a.toml")
    changes = []
    watcher = PolicyWatcher(tmp_path, on_change=lambda new, old: changes.append((old.version, new.version)))
    assert watcher.current.version == NEWEST_AUTO
    assert watcher.poll() is False
    edited = policy_text.replace('{ architecture = "LlamaForCausalLM", value = "PYTHON"', '{ architecture = "LlamaForCausalLM", value = "CPP"')
    _bump(tmp_path / "b.toml", edited, "2027.01.01")
    assert watcher.poll() is True
    assert changes == [(NEWEST_AUTO, "2027.01.01")]
    assert watcher.resolve(architecture="LlamaForCausalLM", backend="NIXL").runtime == "CPP"


def test_watcher_rejects_an_invalid_version_and_keeps_serving(tmp_path, policy_text):
    write(tmp_path, policy_text, "a.toml")
    errors = []
    watcher = PolicyWatcher(tmp_path, on_error=errors.append)
    broken = policy_text.replace('values = ["CPP", "PYTHON"]', 'values = ["CPP", "PYTHON", 7]')
    _bump(tmp_path / "b.toml", broken, "2027.01.01")
    assert watcher.poll() is False
    assert watcher.current.version == NEWEST_AUTO
    assert watcher.resolve(architecture="LlamaForCausalLM", backend="NIXL").runtime == "PYTHON"
    assert errors and isinstance(watcher.last_error, PolicyError)
    assert "b.toml" in str(watcher.last_error)
    # Fixing the file recovers.
    _bump(tmp_path / "b.toml", policy_text, "2027.01.02")
    assert watcher.poll() is True and watcher.current.version == "2027.01.02" and watcher.last_error is None


def test_watcher_thread_polls(tmp_path, policy_text):
    write(tmp_path, policy_text, "a.toml")
    with PolicyWatcher(tmp_path, interval_s=0.05) as watcher:
        _bump(tmp_path / "b.toml", policy_text, "2027.01.03")
        deadline = time.monotonic() + 10
        while watcher.current.version != "2027.01.03" and time.monotonic() < deadline:
            time.sleep(0.02)
    assert watcher.current.version == "2027.01.03"


def test_decision_log_lines_and_rotation(tmp_path, newest):
    log_path = tmp_path / "logs" / "decisions.jsonl"
    with DecisionLog(log_path, max_bytes=4000, backups=2) as log:
        ids = [log.record(newest.resolve(architecture="LlamaForCausalLM", backend=b), server="ctx-0") for b in ("NIXL", "UCX") * 10]
    assert len(set(ids)) == len(ids)
    files = sorted(tmp_path.joinpath("logs").iterdir())
    assert [f.name for f in files] == ["decisions.jsonl", "decisions.jsonl.1", "decisions.jsonl.2"]
    assert all(f.stat().st_size <= 4000 for f in files)
    entry = json.loads(log_path.read_text().splitlines()[-1])
    assert entry["decision_id"] == ids[-1]
    assert entry["policy_version"] == NEWEST_AUTO and entry["policy_digest"] == newest.digest
    assert entry["values"]["transceiver_runtime"] == "PYTHON"
    assert entry["decided_by"]["transceiver_runtime"] == "runtime-preference[LlamaForCausalLM]"
    errors = [d for d in entry["diagnostics"] if d["severity"] == "error"]
    assert errors == [{"id": "python-requires-nixl", "severity": "error", "decision": "transceiver_runtime"}]
    assert entry["context"]["architecture"] == "LlamaForCausalLM" and entry["labels"] == {"server": "ctx-0"}
    assert entry["timestamp"].endswith("Z")


def test_oversized_policy_is_refused(tmp_path):
    path = tmp_path / "huge.toml"
    path.write_bytes(b"#" * (MAX_POLICY_BYTES + 1))
    with pytest.raises(PolicyError, match="limited to"):
        kvpolicy.load(path)


def test_table_sizes_are_bounded(tmp_path, policy_text):
    # Every table of the format is bounded in the schema (rows, rules, constraints, features).
    features = "".join(f'[features.f{i}]\ndescription = "x"\n' for i in range(1001))
    text = policy_text.replace("[features.serialized_state]", features + "[features.serialized_state]", 1)
    # Refused before parsing (the header count), with the same bound as the schema.
    with pytest.raises(PolicyError, match=r"more than 1,000 \[features\.\*\] tables; the schema allows at most 1,000"):
        kvpolicy.load(write(tmp_path, text))
