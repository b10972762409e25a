"""Hot reload: serve the newest valid policy of a folder, swapping atomically when it changes.

A serving process resolves many contexts against one policy set; an operator drops a new version
into the folder. :class:`PolicyWatcher` notices (by polling file sizes, mtimes and names: no
platform-specific watcher), loads and compiles the new set *before* swapping, and replaces the
reference in one assignment, so a resolution never sees half a policy. A new version that does not
load is rejected with its errors (``last_error``) and the last good set keeps serving: nothing is lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import PolicyError
from .read.loader import policy_files
from .evaluate.policyset import PolicySet, load

__all__ = ["PolicyWatcher"]

Fingerprint = tuple[tuple[str, int, int], ...]


class PolicyWatcher:
    """Keeps ``current`` at the newest valid version of ``folder`` (or at ``version`` if pinned).

    Call :meth:`poll` yourself, or :meth:`start` a daemon thread polling every ``interval_s``.
    ``on_change(new, old)`` and ``on_error(error)`` are called from the polling thread.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        version: str | None = None,
        interval_s: float = 1.0,
        on_change: Callable[[PolicySet, PolicySet], Any] | None = None,
        on_error: Callable[[PolicyError], Any] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.folder = Path(folder)
        self.version = version
        self.interval_s = interval_s
        self.on_change = on_change
        self.on_error = on_error
        self.last_error: PolicyError | None = None
        self._fingerprint = self._scan()
        self._current = load(self.folder, version=version)  # the first load must succeed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def current(self) -> PolicySet:
        """The policy set serving now."""
        return self._current

    def resolve(self, config: Any = None, /, **fields: Any) -> Any:
        """Resolve with the current policy set."""
        return self._current.resolve(config, **fields)

    def poll(self) -> bool:
        """Reload if the folder changed; True when a new policy set was swapped in."""
        fingerprint = self._scan()
        if fingerprint == self._fingerprint:
            return False
        self._fingerprint = fingerprint
        try:
            candidate = load(self.folder, version=self.version)
        except PolicyError as exc:
            self.last_error = exc
            if self.on_error is not None:
                self.on_error(exc)
            return False
        self.last_error = None
        if candidate.digest == self._current.digest:
            return False
        old, self._current = self._current, candidate
        if self.on_change is not None:
            self.on_change(candidate, old)
        return True

    def start(self) -> PolicyWatcher:
        """Poll in a daemon thread until :meth:`stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvpolicy-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the polling thread (waits at most ``timeout_s``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def _scan(self) -> Fingerprint:
        found = []
        for path in policy_files(self.folder):
            try:
                stat = path.stat()
            except OSError:
                continue
            found.append((path.name, stat.st_size, stat.st_mtime_ns))
        return tuple(found)

    def __enter__(self) -> PolicyWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
