"""Caches of compiled policies and of parsed, schema-checked policy documents, keyed by content
digest, in the user's cache folder.

**Compiled policies** (``indexes-N/``): the decision index of a policy file
(:func:`kvpolicy.evaluate.index.build_index`: plain data only), stored under the digest of kvpolicy's
version, the index format, the schema and the file's bytes. A cold ``kvpolicy resolve`` of an
unchanged file reads it back and resolves from it: no parse, no schema, no typed model, so neither
jsonschema nor pydantic is imported. An entry is a header line naming its key and the sha256 of
the JSON that follows; a read checks both (a truncated or altered entry is a miss), then
:func:`kvpolicy.evaluate.indexcheck.check_index` checks the data's shape and types and that it names the digest
of the file being loaded. Nothing in an entry is executed: the evaluator is generated again from
the data, and the generated code never contains a string from it.

**Documents** (``documents-N/``):

Validating a policy against the JSON Schema costs most of a cold ``kvpolicy resolve`` (importing
jsonschema and building its validator alone is ~0.2 s here), and parsing it (the bounds pass that
records the source map, then the TOML parser) most of the rest. Both depend only on the file's
bytes, the schema and kvpolicy's version, so a document that passed the schema is stored by the
digest of all three, as JSON (its data and its source map as recorded, the keys inside rows still
to locate): loading the same bytes again skips parsing and validation; the typed model and every
semantic check are still built from it.

**Results** (``lint-N/``, ``fmt-N/``, ...): what a command computed from a file's bytes (lint
findings, "already formatted"), stored under the digest of those bytes and of
:func:`code_fingerprint` (kvpolicy's version and its package files), so a run over unchanged files
is answered without parsing them, and an edited or upgraded kvpolicy never reads another's.

Where: ``$KVPOLICY_CACHE_DIR`` if set (empty: no cache at all), else ``$XDG_CACHE_HOME/kvpolicy``,
else ``~/.cache/kvpolicy``; never inside the installed package (a folder there is ignored). Safe
to delete at any time. An entry is JSON only (no pickle: nothing in it is executed), read with a
bounded, non-blocking, no-follow read of a regular file, and used only when it names the digest it
is stored under and has the expected shape; a corrupt, truncated, foreign or special entry is a
miss. The cache is consulted only after the file has been read through :mod:`kvpolicy.read.policyfile`
(file type, symlinks and size checked) and its digest computed, so it only ever stands in for
parsing bytes that passed every parse-time bound and the schema before.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "cache_dir",
    "cached_document",
    "cached_entry",
    "cached_index",
    "code_fingerprint",
    "digest",
    "document_key",
    "index_key",
    "remember_document",
    "remember_entry",
    "remember_index",
    "sha256",
]

try:  # CPython's own SHA-256: importing hashlib sets up every OpenSSL algorithm (~5 ms of a cold start)
    from _sha256 import sha256 as _sha256
except ImportError:  # pragma: no cover - another interpreter, or a build without it
    from hashlib import sha256 as _sha256

_ENTRY = "documents-2"  # 2: the source map as recorded (row keys located when read)
_INDEX = "indexes-1"
_INDEX_MAGIC = b"kvpolicy-index"
#: An entry larger than this is not read (a policy file is at most 32 MiB; its JSON a few times that).
_MAX_ENTRY_BYTES = 256 * 1024 * 1024


def cache_dir() -> Path | None:
    """The cache folder, or None when caching is off (``KVPOLICY_CACHE_DIR=""``) or the folder
    would lie inside the package."""
    configured = os.environ.get("KVPOLICY_CACHE_DIR")
    if configured is not None:
        if not configured:
            return None
        folder = Path(configured)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = Path(base) / "kvpolicy"
    package = Path(__file__).resolve().parents[1]  # the kvpolicy package (this is kvpolicy.read.cache)
    try:
        resolved = folder.resolve()
    except (OSError, RuntimeError):
        return None
    if resolved == package or package in resolved.parents:
        return None
    return folder


def document_key(raw: bytes, schema_raw: bytes, version: str) -> str:
    """The digest a document is stored under: kvpolicy's version, the schema and the file."""
    digest = _sha256()
    for part in (b"kvpolicy-document-1", version.encode(), _sha256(schema_raw).digest(), raw):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def _entry(folder: Path, key: str) -> Path:
    return folder / _ENTRY / key[:2] / key


def _read(path: Path) -> bytes | None:
    """The bytes of a regular file, read without following a symlink or blocking on a FIFO, or None."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_ENTRY_BYTES:
            return None
        if not _trusted(info):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _trusted(info: os.stat_result) -> bool:
    """An entry counts only if this user wrote it and nobody else can: owned by this user and not
    writable by group or others (entries are written 0600). Anyone else who can write the folder
    could otherwise plant a well-formed entry that changes answers."""
    getuid = getattr(os, "getuid", None)
    if getuid is not None and info.st_uid != getuid():
        return False
    return not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _write(path: Path, data: bytes) -> None:
    """Write an entry atomically (a reader sees no entry or a whole one); failures leave none."""
    import tempfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:
        pass


def sha256(data: bytes) -> str:
    """Hex sha256 of ``data`` (the digest a policy set reports)."""
    return _sha256(data).hexdigest()


def index_key(raw: bytes, index_format: int) -> str:
    """The digest a compiled policy is stored under: kvpolicy's version, the index format (the
    evaluator's ``kvpolicy.evaluate.index.FORMAT``), the shipped schema and the file's bytes."""
    from ..version import __version__
    from .policyfile import shipped_root

    try:
        schema_raw = (shipped_root() / "policy.schema.json").read_bytes()
    except OSError:
        schema_raw = b""
    return document_key(raw, schema_raw, f"{__version__}/index-{index_format}")


def cached_index(key: str) -> dict[str, Any] | None:
    """The decision index data stored under ``key`` (not yet checked for shape), or None."""
    entry = cached_entry(_INDEX, key)
    return entry if isinstance(entry, dict) else None


def remember_index(key: str, data: dict[str, Any]) -> None:
    """Store a compiled policy's index data (any failure just leaves no entry)."""
    remember_entry(_INDEX, key, data)


def cached_entry(kind: str, key: str) -> Any:
    """The JSON value stored under ``key`` in the ``kind`` folder (e.g. ``lint-1``), or None: a
    missing, untrusted, truncated or altered entry is a miss. An entry is a header line naming
    its key and the sha256 of the JSON that follows; the caller checks the value's shape."""
    folder = cache_dir()
    if folder is None:
        return None
    data = _read(folder / kind / key[:2] / key)
    if data is None:
        return None
    head, newline, payload = data.partition(b"\n")
    if not newline or head != b" ".join((_INDEX_MAGIC, key.encode(), _sha256(payload).hexdigest().encode())):
        return None
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):
        return None


def remember_entry(kind: str, key: str, value: Any) -> None:
    """Store a JSON value under ``key`` in the ``kind`` folder (any failure just leaves no entry)."""
    folder = cache_dir()
    if folder is None:
        return
    try:
        payload = json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError, RecursionError):
        return
    head = b" ".join((_INDEX_MAGIC, key.encode(), _sha256(payload).hexdigest().encode()))
    _write(folder / kind / key[:2] / key, head + b"\n" + payload)


def digest(*parts: bytes | str) -> str:
    """The sha256 of ``parts``, each prefixed with its length (so no two lists of parts collide)."""
    hashed = _sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        hashed.update(len(data).to_bytes(8, "big"))
        hashed.update(data)
    return hashed.hexdigest()


_FINGERPRINT: list[str] = []


def code_fingerprint() -> str:
    """kvpolicy's version and the name, size and modification time of every file of the
    installed package: results computed by this code (lint findings, formatting) are stored
    under it, so an edited or upgraded kvpolicy never reads another code's results (~0.3 ms)."""
    if _FINGERPRINT:
        return _FINGERPRINT[0]
    from ..version import __version__

    package = Path(__file__).resolve().parents[1]  # the kvpolicy package (this is kvpolicy.read.cache)
    found: list[str] = [__version__]
    folders = [package]
    while folders:
        folder = folders.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name == "__pycache__" or entry.name.startswith("."):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                elif entry.name.endswith((".py", ".toml", ".txt", ".json")):
                    info = entry.stat()
                    found.append(f"{os.path.relpath(entry.path, package)}:{info.st_size}:{info.st_mtime_ns}")
            except OSError:
                continue
    _FINGERPRINT.append(digest(*found))
    return _FINGERPRINT[0]


def cached_document(
    key: str,
) -> tuple[dict[str, Any], dict[tuple[Any, ...], tuple[int, int]], list[tuple[Any, ...]]] | None:
    """(data, positions, inline) of the document stored under ``key``, or None (a missing or bad
    entry); ``inline``: the inline tables whose keys are not located yet (see
    :class:`kvpolicy.read.scan.SourceMap`)."""
    folder = cache_dir()
    if folder is None:
        return None
    raw = _read(_entry(folder, key))
    if raw is None:
        return None
    try:
        entry = json.loads(raw)
        if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("data"), dict):
            return None
        positions = {tuple(path): (line, column) for path, line, column in entry["positions"]}
        inline = [(tuple(path), int(start), int(end), int(line), int(line_start)) for path, start, end, line, line_start in entry.get("inline", [])]
        return entry["data"], positions, inline
    except (ValueError, TypeError, KeyError, RecursionError):
        return None


def remember_document(
    key: str,
    data: dict[str, Any],
    positions: dict[tuple[Any, ...], tuple[int, int]],
    inline: list[tuple[Any, ...]] | tuple[()] = (),
) -> None:
    """Store a document that passed the schema, with its source map as recorded (the keys of
    ``inline`` tables are located when read, as after parsing); any failure (a value JSON cannot
    hold, a read-only folder) just leaves no entry."""
    folder = cache_dir()
    if folder is None:
        return
    try:
        text = json.dumps(
            {
                "key": key,
                "data": data,
                "positions": [[list(p), line, column] for p, (line, column) in positions.items()],
                "inline": [[list(p), *span] for p, *span in inline],
            },
            allow_nan=False,
            separators=(",", ":"),
        )
    except (TypeError, ValueError, RecursionError):
        return
    _write(_entry(folder, key), text.encode())
