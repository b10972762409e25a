"""A cache of schema verdicts, keyed by content digest, in the user's cache folder.

Validating a policy against the JSON Schema costs most of a cold ``kvpolicy resolve`` (importing
jsonschema and building its validator alone is ~0.2 s here). The verdict depends only on the
file's bytes, the schema and kvpolicy's version, so it is remembered by the digest of all three:
a file that passed once is not validated again until one of them changes.

Where: ``$KVPOLICY_CACHE_DIR`` if set (empty: no cache at all), else ``$XDG_CACHE_HOME/kvpolicy``,
else ``~/.cache/kvpolicy``; never inside the installed package (a folder there is ignored). Safe
to delete at any time. Nothing is deserialised from it: an entry is a file named by the digest
whose whole content is that digest, read with a bounded, non-blocking, no-follow read, so a
corrupt, truncated, foreign or special entry is simply a miss. The cache is consulted only after
the file has been read through :mod:`kvpolicy.policyfile` and parsed within its bounds, and only
ever skips the schema check of bytes that passed it before: every other check still runs.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["cache_dir", "schema_key", "schema_passed", "remember_schema_passed"]

_ENTRY = "schema-ok"


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
    package = Path(__file__).resolve().parent
    try:
        resolved = folder.resolve()
    except (OSError, RuntimeError):
        return None
    if resolved == package or package in resolved.parents:
        return None
    return folder


def schema_key(raw: bytes, schema_raw: bytes, version: str) -> str:
    """The digest a verdict is stored under: kvpolicy's version, the schema and the file."""
    digest = hashlib.sha256()
    for part in (b"kvpolicy-schema-verdict-1", version.encode(), hashlib.sha256(schema_raw).digest(), raw):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def _entry(folder: Path, key: str) -> Path:
    return folder / _ENTRY / key[:2] / key


def schema_passed(key: str) -> bool:
    """Whether the bytes of ``key`` passed the schema before (a missing or bad entry: no)."""
    folder = cache_dir()
    if folder is None:
        return False
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(_entry(folder, key), flags)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return os.read(fd, len(key) + 1) == key.encode()
    except OSError:
        return False
    finally:
        os.close(fd)


def remember_schema_passed(key: str) -> None:
    """Record that the bytes of ``key`` passed the schema; any failure just leaves no entry."""
    folder = cache_dir()
    if folder is None:
        return
    path = _entry(folder, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(key.encode())
            os.replace(temporary, path)  # atomic: a reader sees no entry or a whole one
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:
        pass
