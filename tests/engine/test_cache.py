"""The compiled-policy and document caches: keyed by content, safe to delete, JSON only, never
trusted beyond their digests and shape checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvpolicy
from kvpolicy import PolicyError, cache
from kvpolicy.loader import shipped_root

PROBE = (
    "import sys, kvpolicy\n"
    "try:\n"
    "    kvpolicy.load(sys.argv[1])\n"
    "    print('ok', 'jsonschema' in sys.modules)\n"
    "except kvpolicy.PolicyError as exc:\n"
    "    print('error', 'jsonschema' in sys.modules, exc.problems[0].check)\n"
)


def probe(path: Path, cache_dir: str, *, keep_index: bool = False, **env: str) -> list[str]:
    """Load ``path`` in a fresh interpreter: (ok|error, whether jsonschema was imported, ...).

    The compiled-policy entries are removed first unless ``keep_index``: these probes are about
    the document cache behind them."""
    if not keep_index:
        for entry in entries(Path(cache_dir), INDEX):
            entry.unlink()
    environment = {**os.environ, "KVPOLICY_CACHE_DIR": cache_dir, **env}
    done = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policies" / "2026.09.10.toml"
    path.parent.mkdir()
    path.write_bytes((shipped_root() / "2026.09.10.toml").read_bytes())
    return path


DOCUMENTS = "documents-1"
INDEX = "indexes-1"


def entries(folder: Path, kind: str = DOCUMENTS) -> list[Path]:
    """The files of one cache (documents or compiled indexes) under ``folder``."""
    return sorted(p for p in (folder / kind).rglob("*") if p.is_file())


def test_second_load_of_an_unchanged_file_skips_jsonschema(policy, tmp_path):
    folder = tmp_path / "cache"
    assert probe(policy, str(folder)) == ["ok", "True"]
    assert len(entries(folder)) == 1
    assert probe(policy, str(folder)) == ["ok", "False"]


def test_a_changed_file_is_validated_again(policy, tmp_path):
    folder = tmp_path / "cache"
    probe(policy, str(folder))
    policy.write_text(policy.read_text().replace('summary = "', 'summary = "changed: ', 1))
    assert probe(policy, str(folder)) == ["ok", "True"]
    assert len(entries(folder)) == 2


def test_a_file_that_fails_the_schema_is_never_cached(policy, tmp_path):
    folder = tmp_path / "cache"
    policy.write_text(policy.read_text().replace("schema = 1", "schema = 1\ncolour = 1", 1))
    assert probe(policy, str(folder)) == ["error", "True", "schema"]
    assert probe(policy, str(folder)) == ["error", "True", "schema"]
    assert entries(folder) == []


@pytest.mark.parametrize("corruption", ["garbage", "empty", "directory", "fifo", "symlink"])
def test_a_corrupt_entry_is_a_miss(policy, tmp_path, corruption):
    folder = tmp_path / "cache"
    probe(policy, str(folder))
    (entry,) = entries(folder)
    entry.unlink()
    if corruption == "garbage":
        entry.write_bytes(b"\x00not the key" * 100)
    elif corruption == "empty":
        entry.write_bytes(b"")
    elif corruption == "directory":
        entry.mkdir()
    elif corruption == "fifo":
        os.mkfifo(entry)  # a read would block: the cache must never open it for a blocking read
    else:
        target = tmp_path / "elsewhere"
        target.write_text(entry.name)
        entry.symlink_to(target)
    assert probe(policy, str(folder)) == ["ok", "True"]


def test_the_key_depends_on_version_schema_and_bytes():
    raw = b"schema = 1\n"
    key = cache.document_key(raw, b"{}", "0.1.0")
    assert key != cache.document_key(raw, b"{}", "0.1.1")
    assert key != cache.document_key(raw, b"{ }", "0.1.0")
    assert key != cache.document_key(raw + b" ", b"{}", "0.1.0")


def test_a_cached_document_builds_the_same_policy(policy):
    first = kvpolicy.load(policy).policy  # parsed, validated, stored
    second = kvpolicy.load(policy).policy  # from the cache
    assert first == second
    assert [r.location for r in first.rows()] == [r.location for r in second.rows()]


def test_semantic_problems_are_the_same_from_the_cache(policy):
    # Passes the schema (so it is stored) but names an undeclared feature: a semantic error.
    policy.write_text(policy.read_text().replace("features = { pipelined_transfer = true }", "features = { pipelined_transfr = true }", 1))
    messages = []
    for _ in range(2):
        with pytest.raises(PolicyError) as info:
            kvpolicy.load(policy)
        messages.append([str(p) for p in info.value.problems])
    assert messages[0] == messages[1] and "pipelined_transfr" in messages[0][0]


def test_an_entry_under_another_key_is_a_miss(policy, tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(folder))
    kvpolicy.load(policy)
    (entry,) = entries(folder)
    text = entry.read_text()
    entry.write_text(text.replace(entry.name, "0" * 64, 1))  # a valid entry, claiming another digest
    assert probe(policy, str(folder)) == ["ok", "True"]


def test_an_empty_setting_turns_the_cache_off(policy, monkeypatch):
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", "")
    assert cache.cache_dir() is None
    kvpolicy.load(policy)  # still loads


def test_default_folder_follows_xdg_and_never_the_package(monkeypatch, tmp_path):
    monkeypatch.delenv("KVPOLICY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "kvpolicy"
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(Path(cache.__file__).parent / "sub"))
    assert cache.cache_dir() is None


def test_hostile_bytes_are_refused_before_the_cache_is_read(tmp_path):
    # A file over the nesting bound fails in the reader, with a cache or without one.
    path = tmp_path / "p" / "2026.09.10.toml"
    path.parent.mkdir()
    path.write_text("x = " + "[" * 400 + "]" * 400 + "\n")
    with pytest.raises(PolicyError) as info:
        kvpolicy.load(path)
    assert info.value.problems[0].check in ("size", "toml")
