"""Decision logs: one JSON line per resolution, opt-in and bounded in size.

OPA's decision log is the anchor: each entry says when, which decision (a fresh id), the context,
the values, the rules that decided them, the diagnostics, and the policy version and digest that
answered, so an operator can replay any start-up decision. Files rotate at ``max_bytes`` and keep
``backups`` old files (the standard library's rotating handler does the bookkeeping).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .evaluate.resolution import Resolution

__all__ = ["DecisionLog"]


class DecisionLog:
    """Append resolutions to a JSON-lines file, rotating at ``max_bytes`` (``backups`` kept)."""

    def __init__(self, path: str | Path, *, max_bytes: int = 10 << 20, backups: int = 3) -> None:
        if max_bytes <= 0 or backups < 0:
            raise ValueError("max_bytes must be positive and backups non-negative")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handler = logging.handlers.RotatingFileHandler(self.path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._lock = threading.Lock()

    def record(self, resolution: Resolution, **labels: Any) -> str:
        """Append one entry; returns its decision id. ``labels`` (e.g. ``server="ctx-0"``) are kept."""
        decision_id = uuid.uuid4().hex
        entry = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1e6) % 1000000:06d}Z",
            "decision_id": decision_id,
            **resolution.to_dict(),
            "labels": labels,
        }
        entry["diagnostics"] = [{"id": d["id"], "severity": d["severity"], "decision": d["decision"]} for d in entry["diagnostics"]]
        line = json.dumps(entry, sort_keys=True, separators=(",", ":"))
        record = logging.LogRecord("kvpolicy.decisions", logging.INFO, __file__, 0, line, None, None)
        with self._lock:
            self._handler.emit(record)
        return decision_id

    def close(self) -> None:
        """Flush and close the file."""
        with self._lock:
            self._handler.close()

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
