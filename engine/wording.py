"""How messages read: counted nouns ("1 file", "2 files", never "1 files" or "file(s)"), and
"did you mean" hints for misspelt names."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["plural", "suggest"]


def plural(count: int, noun: str, nouns: str | None = None, *, grouped: bool = False) -> str:
    """``count`` and ``noun``, plural unless ``count`` is 1 (``nouns``, else ``noun`` + "s");
    ``grouped`` writes thousands separators (``7,680 contexts``)."""
    shown = f"{count:,}" if grouped else str(count)
    return f"{shown} {noun if count == 1 else (nouns or noun + 's')}"


def suggest(name: str, known: Iterable[str]) -> str:
    """A ``did you mean`` hint for a misspelled name, or ''."""
    import difflib  # only when a name is misspelt: not on a clean run's path

    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if not match:
        lowered = {k.lower(): k for k in known}
        if name.lower() in lowered:
            match = [lowered[name.lower()]]
    return f"; did you mean {match[0]!r}?" if match else ""
