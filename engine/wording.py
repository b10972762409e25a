"""Counted nouns in messages: "1 file", "2 files", never "1 files" or "file(s)"."""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: int, noun: str, nouns: str | None = None, *, grouped: bool = False) -> str:
    """``count`` and ``noun``, plural unless ``count`` is 1 (``nouns``, else ``noun`` + "s");
    ``grouped`` writes thousands separators (``7,680 contexts``)."""
    shown = f"{count:,}" if grouped else str(count)
    return f"{shown} {noun if count == 1 else (nouns or noun + 's')}"
