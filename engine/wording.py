"""How messages read: counted nouns ("1 file", "2 files", never "1 files" or "file(s)"), "did you
mean" hints for misspelt names, and messages escaped for GitHub's workflow commands."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["github_escape", "plural", "suggest"]


def github_escape(value: str, *, prop: bool = False) -> str:
    """``value`` as a GitHub workflow command (``::error file=...::message``) carries it: ``%``, CR and
    LF escaped; in a property (``prop``: ``file=``, ``title=``) also ``:`` and ``,``."""
    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return value.replace(":", "%3A").replace(",", "%2C") if prop else value


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
