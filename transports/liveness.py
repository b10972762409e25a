"""Whether a rank record still beats, as one reader judges it. A :class:`Sightings` table remembers the
``mod_revision`` of each rank's record and when, on the reader's own monotonic clock, it first saw
it; a record that promises ``ttl_s`` and has not changed for longer is ``stale`` (:func:`check_fresh`):
its sender stopped rewriting it (:mod:`.registration`), whoever keeps its lease alive. The reader
that asks is :class:`~.discovery.EtcdRegistry`."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from typing import Any

from .records import InvalidRecord

__all__ = ["Sightings", "check_fresh", "mod_revision"]


def mod_revision(entry: Mapping[str, Any]) -> int | None:
    """An entry's ``mod_revision`` (the gateway writes int64s as decimal strings), or None."""
    revision = entry.get("mod_revision")
    if isinstance(revision, str) and revision.isascii() and revision.isdigit() and len(revision) <= 20:
        return int(revision)
    return revision if isinstance(revision, int) and not isinstance(revision, bool) else None


class Sightings:
    """What one reader saw of each rank's record: its ``mod_revision`` and when, on this process's
    monotonic clock, that revision was first seen. Never a clock of the writer's or of etcd's.

    A revision read in an answer that came back at ``t0`` and again in one asked for at ``t1`` has
    existed, unchanged, for at least ``t1 - t0``: that is the age :meth:`age` gives.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: dict[str, tuple[int, float]] = {}

    def age(self, name: str, revision: int | None, *, asked: float, answered: float) -> float:
        """How long the record of ``name`` at ``revision`` has surely been unchanged: 0 the first
        time this revision is seen (or if it is unknown), else ``asked`` minus when it was first
        answered."""
        with self._lock:
            first = self._first.get(name)
            if revision is None or first is None or first[0] != revision:
                if revision is None:
                    self._first.pop(name, None)
                else:
                    self._first[name] = (revision, answered)
                return 0.0
            return max(0.0, asked - first[1])

    def keep(self, names: Collection[str]) -> None:
        """Forget every rank but ``names`` (those still stored), so the table never outgrows the prefix."""
        with self._lock:
            for name in [n for n in self._first if n not in names]:
                del self._first[name]

    def forget(self, name: str) -> None:
        """``name`` holds no record now."""
        with self._lock:
            self._first.pop(name, None)

    def outage(self) -> None:
        """etcd did not answer this reader: start every clock again at the next sighting. A sender
        cut off from etcd cannot beat either, and the time this reader could not look is not held
        against it (after an etcd restart, every rank would otherwise look stale until its next beat)."""
        with self._lock:
            self._first.clear()


def check_fresh(name: str, ttl_s: int | None, age: float) -> None:
    """A record that promises ``ttl_s`` and has not changed for longer is its dead sender's."""
    if ttl_s is not None and age > ttl_s:
        raise InvalidRecord(
            f"record of rank {name!r} has not been rewritten for {age:.1f}s, past the ttl_s of {ttl_s} it promises: "
            "its sender is gone though its lease is kept alive (waiting for a fresh one)",
            "stale",
        )
