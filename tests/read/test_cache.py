"""The compiled-policy and document caches: keyed by content, safe to delete, JSON only, never
trusted beyond their digests and shape checks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvpolicy
from kvpolicy import PolicyError
from kvpolicy.read import cache
from kvpolicy.read.loader import shipped_root

PROBE = (
    "import sys, kvpolicy, kvpolicy.read.loader as loader\n"
    "parsed = []\n"
    "parse = loader.parse_document\n"
    "loader.parse_document = lambda *a: parsed.append(1) or parse(*a)\n"
    "try:\n"
    "    kvpolicy.load(sys.argv[1])\n"
    "    print('ok', bool(parsed))\n"
    "except kvpolicy.PolicyError as exc:\n"
    "    print('error', bool(parsed), exc.problems[0].check)\n"
)


def probe(path: Path, cache_dir: str, *, keep_index: bool = False, **env: str) -> list[str]:
    """Load ``path`` in a fresh interpreter: (ok|error, whether the file was parsed, ...).

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


DOCUMENTS = "documents-2"
INDEX = "indexes-1"


def entries(folder: Path, kind: str = DOCUMENTS) -> list[Path]:
    """The files of one cache (documents or compiled indexes) under ``folder``."""
    return sorted(p for p in (folder / kind).rglob("*") if p.is_file())


def test_second_load_of_an_unchanged_file_skips_parsing_and_the_schema(policy, tmp_path):
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


def test_a_row_key_is_located_alike_from_the_cache(policy):
    """Rows' keys are stored unlocated, as the parser leaves them, and located when an error asks:
    the same file:line:col from the cache as after parsing."""
    old = '{ architecture = "Gemma3ForCausalLM", value = "PYTHON"'
    text = policy.read_text()
    assert old in text
    text = text.replace(old, old.replace('"PYTHON"', '"PYTHN"'), 1)
    policy.write_text(text)
    line_number, line = next((i, row) for i, row in enumerate(text.splitlines(), start=1) if '"PYTHN"' in row)
    where = f"{policy.name}:{line_number}:{line.index('value = ') + 1}:"
    found = []
    for _ in range(2):  # parsed and stored, then from the cache
        with pytest.raises(PolicyError) as info:
            kvpolicy.load(policy)
        found.append([str(p) for p in info.value.problems])
    assert found[0] == found[1]
    assert [m for m in found[0] if "PYTHN" in m and where in m], found[0]
    assert entries(Path(os.environ["KVPOLICY_CACHE_DIR"])), "the document passed the schema and was stored"


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


# -- the compiled-policy cache (decision index) -----------------------------------------------------

CLI = ("resolve", "--arch", "MistralForCausalLM", "--backend", "UCX", "--format", "json")


def cold_cli(cache_dir: Path, *argv: str, policy: Path | None = None) -> tuple[str, set[str]]:
    """Run ``python -X importtime -m kvpolicy ARGV`` in a fresh process: its stdout and every
    module it imported (read from the import-time log, so nothing in the CLI is changed)."""
    environment = {**os.environ, "KVPOLICY_CACHE_DIR": str(cache_dir)}
    command = [sys.executable, "-X", "importtime", "-m", "kvpolicy", *argv]
    if policy is not None:
        command += ["--policy", str(policy)]
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    modules = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return done.stdout, modules


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in ("pydantic", "pydantic_core", "jsonschema")}


def test_a_cold_resolve_from_a_warm_cache_imports_neither_pydantic_nor_jsonschema(tmp_path):
    first, modules = cold_cli(tmp_path / "cache", *CLI)
    assert "kvpolicy.read.loader" in modules and heavy(modules) == set()  # parsed, checked, compiled
    assert entries(tmp_path / "cache", INDEX)
    again, modules = cold_cli(tmp_path / "cache", *CLI)
    assert heavy(modules) == set() and "kvpolicy.read.loader" not in modules  # from the compiled index alone
    assert again == first  # the same resolution, diagnostics and notes


def test_explain_from_a_warm_cache_builds_the_model_on_demand(tmp_path):
    argv = ("explain", "--arch", "KimiK3ForCausalLM", "--backend", "NIXL", "--runtime", "CPP")
    first, _ = cold_cli(tmp_path / "cache", *argv)
    again, modules = cold_cli(tmp_path / "cache", *argv)
    assert again == first and "trace:" in again
    assert "jsonschema" not in modules  # the model comes from the document cache


def test_a_cached_set_resolves_as_a_parsed_one(policy, tmp_path, monkeypatch):
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(tmp_path / "cache"))
    parsed = kvpolicy.load(policy)  # parsed and stored
    cached = kvpolicy.load(policy)
    assert parsed._policy is not None and cached._policy is None  # from the index alone
    contexts = [
        dict(architecture=arch, backend=backend, transceiver_runtime=runtime, kv_transfer_timeout_ms=timeout)
        for arch in (None, "LlamaForCausalLM", "MistralForCausalLM", "KimiK3ForCausalLM", "GptOssForCausalLM")
        for backend in ("DEFAULT", "NIXL", "UCX", None)
        for runtime in ("auto", "PYTHON", "CPP")
        for timeout in (None, 30000)
    ]
    contexts += [dict(backend="NIXL", features={"serialized_state"}), dict(backend="DEFAULT", env={"TRTLLM_USE_UCX_KVCACHE": "1"})]
    for fields in contexts:
        want, got = parsed.resolve(**fields), cached.resolve(**fields)
        assert got == want and got.diagnostics == want.diagnostics and dict(got.context) == dict(want.context)
        assert got.trace == want.trace
    assert (cached.version, cached.digest, cached.decisions, cached.features, cached.versions()) == (
        parsed.version, parsed.digest, parsed.decisions, parsed.features, parsed.versions()
    )
    assert cached.policy == parsed.policy  # built on demand, from the same bytes


def test_the_index_is_plain_json_data(newest):
    from kvpolicy.evaluate.index import build_index
    from kvpolicy.evaluate.indexcheck import check_index

    data = build_index(newest.policy)
    assert json.loads(json.dumps(data)) == data
    check_index(data)


def _rewrite(entry: Path, change) -> None:
    """Change an index entry's data and give it a matching header (a forger who knows the format)."""
    head, _, payload = entry.read_bytes().partition(b"\n")
    data = change(json.loads(payload))
    payload = json.dumps(data).encode()
    magic, key, _ = head.split(b" ")
    entry.write_bytes(b" ".join((magic, key, hashlib.sha256(payload).hexdigest().encode())) + b"\n" + payload)


def _set_message(data):
    data["constraints"][0]["message"] = "{backend:>999999999}"  # the loader refuses format specs
    return data


def _wrong_type(data):
    data["decisions"][0]["default"]["value"] = 7
    return data


def _other_file(data):
    data["digest"] = "0" * 64
    return data


def _code(data):
    data["decisions"][0]["conditionals"].append({"id": "__import__('os').system('true')"})
    return data


@pytest.mark.parametrize(
    "corruption",
    ["garbage", "truncated", "flipped", "fifo", "symlink", "format-spec", "wrong-type", "other-file", "not-a-rule",
     "group-writable", "other-owner"],
)
def test_a_corrupt_or_forged_index_entry_is_a_miss(policy, tmp_path, corruption):
    folder = tmp_path / "cache"
    want, _ = cold_cli(folder, *CLI, policy=policy)
    (entry,) = entries(folder, INDEX)
    raw = entry.read_bytes()
    assert entry.stat().st_mode & 0o777 == 0o600  # as written
    if corruption == "group-writable":  # intact, but someone else could have written it
        entry.chmod(0o664)
    elif corruption == "other-owner":
        if os.getuid() != 0:
            pytest.skip("giving the entry to another user needs root")
        os.chown(entry, 65534, -1)
    elif corruption == "garbage":
        entry.write_bytes(b"\x00not an entry" * 100)
    elif corruption == "truncated":
        entry.write_bytes(raw[: len(raw) // 2])
    elif corruption == "flipped":  # one byte of the data changed, the header kept
        at = len(raw) - 50
        entry.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :])
    elif corruption == "fifo":
        entry.unlink()
        os.mkfifo(entry)
    elif corruption == "symlink":
        entry.unlink()
        target = tmp_path / "elsewhere"
        target.write_bytes(raw)
        entry.symlink_to(target)
    else:
        _rewrite(entry, {"format-spec": _set_message, "wrong-type": _wrong_type, "other-file": _other_file, "not-a-rule": _code}[corruption])
    got, modules = cold_cli(folder, *CLI, policy=policy)
    assert got == want
    assert "kvpolicy.read.loader" in modules  # not used: the policy was parsed and compiled again


def test_the_index_key_depends_on_kvpolicy_version_and_bytes(monkeypatch):
    from kvpolicy import version
    from kvpolicy.evaluate.index import FORMAT

    raw = b"schema = 1\n"
    key = cache.index_key(raw, FORMAT)
    assert key != cache.index_key(raw + b" ", FORMAT)
    assert key != cache.index_key(raw, FORMAT + 1)
    assert key != cache.document_key(raw, b"", "")
    monkeypatch.setattr(version, "__version__", "9.9.9")
    assert cache.index_key(raw, FORMAT) != key


def test_check_index_refuses_what_build_index_never_gives(newest):
    from kvpolicy.evaluate.index import build_index
    from kvpolicy.evaluate.indexcheck import check_index

    for change in (_set_message, _wrong_type, _code, lambda d: {**d, "format": 0}, lambda d: {**d, "decisions": []}):
        data = json.loads(json.dumps(build_index(newest.policy)))
        with pytest.raises(ValueError):
            check_index(change(data))


def test_a_forged_entry_of_the_right_shape_is_data_never_code(policy, tmp_path, monkeypatch):
    # Whoever can write the cache folder can change answers (as they could edit the policy file
    # or the installed package), but nothing in an entry is ever run: strings stay strings.
    folder = tmp_path / "cache"
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(folder))
    kvpolicy.load(policy)
    (entry,) = entries(folder, INDEX)
    payload = "x'); import os; os._exit(3) #"

    def forge(data):
        for decision in data["decisions"]:
            decision["default"]["id"] = payload
            decision["rows"] = None
            decision["adopt"] = decision["on_not_adopted"] = None
            decision["requirements"] = decision["conditionals"] = decision["adjustments"] = []
        return data

    _rewrite(entry, forge)
    forged = kvpolicy.load(policy)
    assert forged._policy is None  # the forged entry was used
    assert set(forged.resolve(architecture="LlamaForCausalLM", backend="DEFAULT").decided_by.values()) >= {payload}


def test_locations_name_the_file_as_this_run_does(policy, tmp_path, monkeypatch):
    # The index stores line:col only: a file loaded from another working directory (so named by
    # another relative path) gets its own path in every diagnostic, as a fresh parse gives it.
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(tmp_path / "cache"))
    fields = dict(architecture="GptOssForCausalLM", backend="UCX")
    monkeypatch.chdir(policy.parent)
    kvpolicy.load(policy.name).resolve(**fields)  # stored, the file named "2026.09.10.toml"
    monkeypatch.chdir(tmp_path)
    cached = kvpolicy.load(policy)
    assert cached._policy is None
    got = cached.resolve(**fields)
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", "")
    want = kvpolicy.load(policy).resolve(**fields)  # parsed in this working directory
    assert got == want and got.diagnostics[0].location.startswith("policies/2026.09.10.toml:")
