"""TensorRT-LLM releases and the policy version that reproduces each one.

People know which TensorRT-LLM they run (``v1.3.0rc25``), not kvpolicy's policy version ids (one
per upstream change, named by date). ``releases.toml`` beside this module maps every release tag to
the shipped policy version whose upstream state the release has, with the evidence (``source``),
how sure the mapping is (``certainty``) and what else it may be (``note``). A release no policy
version models (cut before ``transceiver_runtime`` existed, or after a change kvpolicy does not
model yet) has no policy version, and asking for it is an error that says why.

    >>> from kvpolicy.read.releases import policy_version_for
    >>> policy_version_for("1.3.0rc25").policy_version
    '2026.08.18'

:func:`installed_trtllm` reads the installed ``tensorrt_llm``'s version from its package metadata
without importing it, and without importlib.metadata (a cold ``kvpolicy resolve`` asks on every run).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from ..errors import Location, PolicyError, PolicyProblem
from ..records import FrozenRecord
from .policyfile import Pattern

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

__all__ = [
    "CERTAINTIES",
    "RELEASES_FILE",
    "Release",
    "ReleaseError",
    "UnmodelledRelease",
    "installed_trtllm",
    "normalise_tag",
    "policy_version_for",
    "release",
    "releases",
]

#: The table that ships with kvpolicy.
RELEASES_FILE = Path(__file__).with_name("releases.toml")

#: How sure a row's mapping is, surest first.
CERTAINTIES = ("high", "medium-high", "medium", "low-medium", "low")

#: The largest release table read (the shipped one is a few KB).
MAX_RELEASES_BYTES = 1 << 20

_FIELDS = ("tag", "date", "policy_version", "closest", "certainty", "source", "note")
_REQUIRED = ("tag", "date", "certainty", "source", "note")
# A release as pip or NVIDIA write it: v1.3.0rc25, 1.3.0rc25, 1.3.0.rc25, 1.3.0-rc25 (PEP 440's
# separators and `c` for `rc`), or a final 1.4.0. Three numbers of at most three digits: a policy
# version id (2026.08.18) is never a release. Local (`+cu129`) and dev builds are not releases.
# Compiled on first use (Pattern): a cold `kvpolicy resolve` imports this module and needs none of them.
_TAG = Pattern(r"v?(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?:[-_.]?(?:rc|c)[-_.]?(\d{1,4}))?", re.IGNORECASE)
_POLICY_VERSION = Pattern(r"\d{4}\.\d{2}\.\d{2}(?:\.\d+)?")
_DATE = Pattern(r"~?\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2}|\.\.(?:\d{2}-)?\d{2})?|unknown")
_ROW_HEADER = Pattern(r"^[ \t]*\[\[[ \t]*release[ \t]*\]\]", re.MULTILINE)
_TOML_POSITION = Pattern(r"\(at line (\d+), column (\d+)\)")


class Release(FrozenRecord):
    """One TensorRT-LLM release: its ``tag`` (``v1.3.0rc25``), ``date``, the ``policy_version`` that
    reproduces it (None: none does), ``closest`` (where none does: the newest policy version that
    models part of it, whose misses the note names; None when no version comes close),
    ``certainty`` (one of :data:`CERTAINTIES`), ``source``, ``note``, and where the row stands in
    the table (``location``)."""

    __slots__ = ("tag", "date", "policy_version", "closest", "certainty", "source", "note", "location")
    tag: str
    date: str
    policy_version: str | None
    closest: str | None
    certainty: str
    source: str
    note: str
    location: Location

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON data (without its location)."""
        return {name: getattr(self, name) for name in _FIELDS}


class ReleaseError(ValueError):
    """A TensorRT-LLM version that names no policy version: ``release`` is its row when the table
    knows the release (no policy version models it), None when it does not."""

    def __init__(self, message: str, given: str, release: Release | None = None) -> None:
        super().__init__(message)
        self.given = given
        self.release = release


class UnmodelledRelease(ReleaseError):
    """A TensorRT-LLM release kvpolicy knows of (or one newer than every release it knows) that no
    policy version models. ``closest`` is the policy version that comes nearest (None: none does),
    ``misses`` what it is known not to model. Answering such a release with ``closest`` is a risk
    only the caller may accept (``accept_unmodelled=True``, ``--accept-unmodelled``)."""

    def __init__(self, message: str, given: str, release: Release | None, closest: str | None, misses: str) -> None:
        super().__init__(message, given, release)
        self.closest = closest
        self.misses = misses


def normalise_tag(text: str) -> str | None:
    """The tag a release version names, as NVIDIA writes tags (``1.3.0.rc25`` -> ``v1.3.0rc25``),
    or None when ``text`` is not a release version (a policy version id, a local or dev build)."""
    match = _TAG.fullmatch(text.strip())
    if match is None:
        return None
    major, minor, patch, candidate = match.groups()
    tag = f"v{int(major)}.{int(minor)}.{int(patch)}"
    return tag if candidate is None else f"{tag}rc{int(candidate)}"


_loaded: dict[Path, tuple[Release, ...]] = {}


def releases(path: Path | None = None) -> tuple[Release, ...]:
    """Every row of the release table (default: the shipped :data:`RELEASES_FILE`), in file order.

    Raises :class:`kvpolicy.PolicyError` (check ``io``, ``size``, ``toml`` or ``releases``) listing
    every problem with ``file:line:col``: the table is read with the policy reader's bounds."""
    path = RELEASES_FILE if path is None else Path(path)
    if path not in _loaded:
        _loaded[path] = _read_table(path)
    return _loaded[path]


def _read_table(path: Path) -> tuple[Release, ...]:
    from .policyfile import read_capped, display_path

    shown = display_path(path)
    raw = read_capped(path, shown, MAX_RELEASES_BYTES, "release tables")
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise _problem(shown, 1, 1, "toml", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        position = _TOML_POSITION.search(str(exc))
        line, column = (int(position.group(1)), int(position.group(2))) if position else (1, 1)
        raise _problem(shown, line, column, "toml", _TOML_POSITION.sub("", str(exc)).strip()) from None
    lines = [text.count("\n", 0, m.start()) + 1 for m in _ROW_HEADER.finditer(text)]
    problems: list[PolicyProblem] = []
    if data.get("schema") != 1:
        problems.append(PolicyProblem(Location(shown), "releases", "expected `schema = 1` at the top of the table"))
    rows = data.get("release")
    unknown = sorted(set(data) - {"schema", "release"})
    if unknown:
        problems.append(PolicyProblem(Location(shown), "releases", f"unknown top-level key(s) {', '.join(unknown)}; rows are [[release]] tables"))
    if not isinstance(rows, list) or not rows:
        problems.append(PolicyProblem(Location(shown), "releases", "no [[release]] rows"))
        raise PolicyError(problems)
    found: list[Release] = []
    seen: dict[str, Location] = {}
    for index, row in enumerate(rows):
        # Rows written inline (release = [{...}]) have no header of their own: the file is located.
        where = Location(shown, lines[index] if len(lines) == len(rows) else 1, 1)
        checked = _check_row(row, where, problems)
        if checked is None:
            continue
        if checked.tag in seen:
            problems.append(PolicyProblem(where, "releases", f"tag {checked.tag} is listed twice (first at {seen[checked.tag]})"))
            continue
        seen[checked.tag] = where
        found.append(checked)
    if problems:
        raise PolicyError(problems)
    return tuple(found)


def _check_row(row: object, where: Location, problems: list[PolicyProblem]) -> Release | None:
    def bad(message: str) -> None:
        problems.append(PolicyProblem(where, "releases", message))

    if not isinstance(row, dict):
        bad("a release row must be a table")
        return None
    count = len(problems)
    extra = sorted(set(row) - set(_FIELDS))
    if extra:
        bad(f"unknown key(s) {', '.join(extra)}; a row has {', '.join(_FIELDS)}")
    for name in _REQUIRED:
        if not isinstance(row.get(name), str) or not row[name].strip():
            bad(f"`{name}` must be a non-empty string")
    version = row.get("policy_version")
    if version is not None and not (isinstance(version, str) and _POLICY_VERSION.fullmatch(version)):
        bad(f"`policy_version` must be a policy version id like 2026.08.18 (left out: none models the release), not {version!r}")
    closest = row.get("closest")
    if closest is not None:
        if not (isinstance(closest, str) and _POLICY_VERSION.fullmatch(closest)):
            bad(f"`closest` must be a policy version id like 2026.08.18, not {closest!r}")
        elif version is not None:
            bad("`closest` names the nearest version of a release no version models: leave it out beside `policy_version`")
    if len(problems) > count:
        return None
    tag = normalise_tag(row["tag"])
    if tag != row["tag"]:
        bad(f"`tag` {row['tag']!r} is not a release tag as NVIDIA writes it" + (f"; write {tag!r}" if tag else " (v1.3.0rc25)"))
    if not _DATE.fullmatch(row["date"]):
        bad(f"`date` {row['date']!r}: expected 2026-07-22, 2026-07-15 22:46, ~2026-08-10, 2026-07-30..08-01 or unknown")
    if row["certainty"] not in CERTAINTIES:
        bad(f"`certainty` {row['certainty']!r}: expected one of {', '.join(CERTAINTIES)}")
    if len(problems) > count:
        return None
    return Release(row["tag"], row["date"], version, closest, row["certainty"], row["source"], row["note"], where)


def _problem(path: str, line: int, column: int, check: str, message: str) -> PolicyError:
    return PolicyError(PolicyProblem(Location(path, line, column), check, message))


def release(version: str, table: Iterable[Release] | None = None) -> Release:
    """The row of the release ``version`` names (``v1.3.0rc25``, ``1.3.0rc25``, ``1.3.0.rc25``).

    Raises :class:`ReleaseError` for a version the table does not list, naming the ones it does
    and how to pick a policy version by its id instead."""
    rows = tuple(releases() if table is None else table)
    tag = normalise_tag(version)
    for row in rows:
        if row.tag == tag:
            return row
    known = ", ".join(row.tag for row in rows)
    if tag is not None:
        what = f"TensorRT-LLM {tag} is not in kvpolicy's release table"
    elif "+" in version and normalise_tag(version.partition("+")[0]) is not None:
        what = f"{version!r} is a local build ('+{version.partition('+')[2]}'), not a release; if it is {normalise_tag(version.partition('+')[0])}, name that"
    else:
        what = f"{version!r} is not a TensorRT-LLM release version (like v1.3.0rc25)"
    raise ReleaseError(
        f"{what}; known releases: {known}. Otherwise pick a policy version by its id "
        "(--version V; `kvpolicy versions` lists them, README's version table says which upstream change each reproduces)",
        version,
    )


def policy_version_for(version: str, table: Iterable[Release] | None = None) -> Release:
    """The row of the release ``version`` names, which has a ``policy_version``.

    Raises :class:`UnmodelledRelease` for a release no policy version models (a row without one,
    or a release newer than every row), with what comes closest and what it misses, and
    :class:`ReleaseError` for any other version the table does not list (see :func:`release`)."""
    rows = tuple(releases() if table is None else table)
    try:
        row = release(version, rows)
    except ReleaseError as exc:
        newer = _newer_than_every_row(version, rows)
        if newer is None:
            raise
        modelled = [r for r in rows if r.policy_version is not None]
        closest = modelled[-1].policy_version if modelled else None
        misses = f"everything upstream changed after {newer.tag}, the newest release kvpolicy's table knows"
        raise UnmodelledRelease(
            f"TensorRT-LLM {normalise_tag(version)} is newer than every release kvpolicy models; " + _ways_forward(closest, misses),
            version,
            None,
            closest,
            misses,
        ) from exc
    if row.policy_version is None:
        raise UnmodelledRelease(
            f"no policy version models TensorRT-LLM {row.tag} ({row.date}): {row.note}; " + _ways_forward(row.closest, None),
            version,
            row,
            row.closest,
            row.note,
        )
    return row


def _ways_forward(closest: str | None, misses: str | None) -> str:
    """What a user of an unmodelled release can do, in one sentence."""
    if closest is None:
        return (
            "no policy version comes close. Pick a version yourself with --version V (`kvpolicy versions`), "
            "or write one that models it: `kvpolicy new` starts the next version from the newest"
        )
    missing = f" (it misses {misses})" if misses else ""
    return (
        f"the closest is policy {closest}{missing}. Accept that risk explicitly with --accept-unmodelled "
        f"(API: accept_unmodelled=True), pick a version with --version V, or write one that models the release: "
        "`kvpolicy new` starts the next version from the newest"
    )


def _key(tag: str) -> tuple[int, ...]:
    """A release tag's order: 1.4.0rc1 < 1.4.0 (a final release after its candidates)."""
    match = _TAG.fullmatch(tag)
    assert match is not None
    major, minor, patch, candidate = match.groups()
    return (int(major), int(minor), int(patch), 1 << 30 if candidate is None else int(candidate))


def _newer_than_every_row(version: str, rows: tuple[Release, ...]) -> Release | None:
    """The newest row when ``version`` names a release newer than all of them, else None."""
    tag = normalise_tag(version)
    if tag is None or not rows:
        return None
    newest = max(rows, key=lambda r: _key(r.tag))
    return newest if _key(tag) > _key(newest.tag) else None


# A distribution's metadata folder: tensorrt_llm-1.3.0rc25.dist-info, tensorrt_llm-1.3.0-py3.12.egg-info,
# or tensorrt_llm.egg-info (a source checkout: the version is only inside). Names compare as pip
# normalises them (case, and runs of - _ . alike).
_METADATA_FOLDER = Pattern(r"tensorrt[-_.]+llm(?:-([^-]+?))?(?:-py[\d.]+)?\.(dist|egg)-info", re.IGNORECASE)
_VERSION_HEADER = Pattern(r"^Version:[ \t]*(\S+)[ \t]*$", re.MULTILINE)


def installed_trtllm(path: Iterable[str] | None = None) -> str | None:
    """The version of the installed TensorRT-LLM (distribution ``tensorrt_llm`` / ``tensorrt-llm``),
    or None when none is installed.

    Found as importlib.metadata finds it (the first entry of ``path``, default ``sys.path``, that
    holds its ``*.dist-info`` or ``*.egg-info``; ``""`` is the working directory), without importing
    importlib.metadata or tensorrt_llm: one ``listdir`` per entry, and one small read of the
    metadata's ``Version`` header when it is there."""
    for entry in sys.path if path is None else path:
        try:
            names = os.listdir(entry or ".")
        except (OSError, TypeError, ValueError):  # a zip file, a missing folder
            continue
        candidates = sorted(name for name in names if name[:8].lower() == "tensorrt" and _METADATA_FOLDER.fullmatch(name))
        for name in candidates:
            match = _METADATA_FOLDER.fullmatch(name)
            assert match is not None
            version = _metadata_version(os.path.join(entry or ".", name), match.group(2)) or match.group(1)
            if version:
                return version
    return None


def _metadata_version(folder: str, kind: str) -> str | None:
    """The ``Version:`` header of a metadata folder (an old egg-info may be the file itself)."""
    target = folder if os.path.isfile(folder) else os.path.join(folder, "METADATA" if kind.lower() == "dist" else "PKG-INFO")
    try:
        with open(target, "rb") as handle:
            head = handle.read(64 << 10)
    except OSError:
        return None
    headers = head.decode("utf-8", "replace").split("\n\n", 1)[0].replace("\r\n", "\n")
    found = _VERSION_HEADER.search(headers)
    return found.group(1) if found else None
