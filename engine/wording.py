"""How messages read: counted nouns ("1 file", "2 files", never "1 files" or "file(s)"), "did you
mean" hints for misspelt names (:func:`closest`, the one matcher every phase asks), and messages
escaped for GitHub's workflow commands."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["closest", "github_escape", "one_letter_apart", "plural", "suggest"]


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


def closest(
    name: str,
    known: Iterable[str],
    *,
    cutoff: float = 0.6,
    separators: bool = False,
    one_letter: bool = False,
    similar_first: bool = False,
) -> str | None:
    """The name of ``known`` that ``name`` is probably a misspelling of, or None: every "did you mean"
    of kvpolicy asks this.

    First a name spelt the same but for case (with ``separators``, also ``_`` and ``-``), the first in
    sorted order when several are; then the most similar name: by difflib's ratio, at or above
    ``cutoff`` (its best match; ties to the greater name, as difflib breaks them), or, with
    ``one_letter``, the first in sorted order that is one letter edit from ``name`` ignoring case
    (:func:`one_letter_apart`). ``similar_first`` asks for the most similar name before the one spelt
    the same (the loader's and the CLI's hints, :func:`suggest`, have always read so). A name of
    ``known`` equal to ``name`` is its own closest."""
    known = list(known)
    fold = _without_separators if separators else str.lower

    def spelt_alike() -> str | None:
        folded = fold(name)
        same = [k for k in known if fold(k) == folded]
        return min(same) if same else None

    def similar() -> str | None:
        if one_letter:
            lowered = name.lower()
            near = [k for k in known if one_letter_apart(lowered, k.lower())]
            return min(near) if near else None
        import difflib  # only when a name is misspelt: not on a clean run's path

        # Skip, before difflib compares anything (1,000 rows against lint's catalogue stay fast), the
        # names whose lengths alone rule a match out: the bound get_close_matches tests first
        # (real_quick_ratio, 2 * shorter / both), in its own arithmetic, so that rounding never drops
        # a name at exactly the cutoff.
        size = len(name)
        candidates = [k for k in known if _length_bound(len(k), size) >= cutoff]
        match = difflib.get_close_matches(name, candidates, n=1, cutoff=cutoff)
        return match[0] if match else None

    first, second = (similar, spelt_alike) if similar_first else (spelt_alike, similar)
    found = first()
    return found if found is not None else second()


def suggest(name: str, known: Iterable[str], *, similar_first: bool = True) -> str:
    """A ``did you mean`` hint for a misspelled name (``; did you mean 'X'?``), or '': the
    :func:`closest` name at difflib's default cutoff, the most similar first unless
    ``similar_first`` is False (lint's catalogue hints put a difference of case first)."""
    match = closest(name, known, similar_first=similar_first)
    return f"; did you mean {match!r}?" if match is not None else ""


def one_letter_apart(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ by one letter edit (no digit involved): a letter added,
    dropped or changed, or two neighbouring letters swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        if len(diff) == 1:
            i = diff[0]
            return a[i].isalpha() and b[i].isalpha()
        if len(diff) == 2 and diff[1] == diff[0] + 1:
            i, j = diff
            return a[i] == b[j] and a[j] == b[i] and a[i].isalpha() and a[j].isalpha()
        return False
    short, long = (a, b) if len(a) < len(b) else (b, a)
    for i, char in enumerate(short):
        if char != long[i]:
            return long[i].isalpha() and short[i:] == long[i + 1 :]
    return long[-1].isalpha()


def _without_separators(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def _length_bound(a: int, b: int) -> float:
    """difflib's ``real_quick_ratio`` of two strings of these lengths, computed as difflib does."""
    return 2.0 * min(a, b) / (a + b) if a + b else 1.0
