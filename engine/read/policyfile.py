"""Reading a policy (or cases) file safely: cheap checks before any parse.

Every command reads policy files through :func:`read_policy_bytes` and
:func:`kvpolicy.read.scan.check_text` (which holds to the bounds defined here), so
``load``, ``lint``, ``test``, ``fmt`` and ``diff`` accept and refuse the same files with the same
located message. The checks run before the TOML parser sees a byte, and each costs at most one pass:

- the path must be a regular file (a FIFO, a device or a folder is refused without opening it
  for a blocking read); a symlink must stay inside the policy root unless ``[tool.kvpolicy]``
  ``allow-symlinks`` names the folder it points into; a symlink loop is reported as one;
- the size is checked with ``fstat`` and the file is read with a cap, so ``/dev/zero`` or a file
  growing while read cannot exhaust memory;
- nesting of arrays and inline tables, dotted keys and table headers, and the length of a bare
  value (a 5,000-digit integer) are bounded by one regex-driven scan (:mod:`kvpolicy.read.scan`, which
  records the source map in the same pass), so neither the parser's recursion nor the later
  stages' per-level costs are reachable;
- the number of ``[[array]]`` tables of one name and of inline tables is bounded before parsing,
  so a 300,000-row file is refused in a fraction of a second rather than after minutes.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from ..errors import Location, PolicyError, PolicyProblem

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any, AnyStr

__all__ = [
    "CASES_SUFFIX",
    "MAX_ARRAY_TABLES",
    "MAX_BARE_VALUE",
    "MAX_INLINE_TABLES",
    "MAX_KEY_PARTS",
    "MAX_NESTING",
    "MAX_POLICY_BYTES",
    "MAX_ROWS",
    "MAX_TABLE_KEYS",
    "Pattern",
    "allowed_symlink_roots",
    "display_path",
    "policy_files",
    "read_capped",
    "read_policy_bytes",
    "shipped_root",
    "size_error",
    "version_key",
]

#: Files in a policy folder that hold policy test cases, not policies.
CASES_SUFFIX = ".cases.toml"


def shipped_root() -> Path:
    """The folder of the policies that ship with kvpolicy."""
    # The data package's own folder: what importlib.resources.files() answers for a regular
    # package, without importing importlib.resources (a few ms of every cold start).
    from .. import policies

    # kvpolicy.policies is the top-level policies/ folder (package-dir), which mypy, checking engine/
    # as a package, cannot see.
    return Path(policies.__file__).parent  # type: ignore[attr-defined]  # policies/ lies outside engine/


def version_key(version: str) -> tuple[int, ...]:
    """Sort key of a content version (``2026.08.24`` < ``2026.09.10`` < ``2026.09.10.1``)."""
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def policy_files(folder: Path) -> list[Path]:
    """The policy files of a folder (``*.toml`` except test-case files), sorted by name."""
    return sorted(p for p in folder.glob("*.toml") if not p.name.endswith(CASES_SUFFIX))


def display_path(path: Path) -> str:
    """How messages name a file: relative to the working directory when it lies below it.

    Symlinks are not resolved: a message names the file the user listed (and a symlink loop
    cannot raise here)."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(os.path.abspath(Path.cwd())))
    except ValueError:
        return str(path)


class _LazyPattern:
    """A regular expression compiled on first use: reading a policy through the compiled-policy
    cache never scans it, and compiling these at import cost ~2 ms of every cold start."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern: str | bytes, flags: int = 0) -> None:
        self._args: tuple[Any, int] = (pattern, flags)  # (Any: str or bytes, each as re.compile takes it)
        self._compiled: re.Pattern[Any] | None = None

    def __getattr__(self, name: str) -> object:
        if self._compiled is None:
            self._compiled = re.compile(*self._args)
        return getattr(self._compiled, name)


if TYPE_CHECKING:

    def Pattern(pattern: AnyStr, flags: int = 0) -> re.Pattern[AnyStr]:
        """What a type checker sees: every attribute of a lazy pattern is the compiled pattern's, so
        it is typed as the ``re.Pattern`` (of ``str`` or ``bytes``, as its source) it stands for."""
        ...

else:
    Pattern = _LazyPattern


#: The largest policy file kvpolicy reads (a 100,000-row policy is about 15 MB).
MAX_POLICY_BYTES = 32 << 20

#: Arrays and inline tables nested in one another (the policy format needs 4).
MAX_NESTING = 16

#: Parts of one dotted key or table header (``[decisions.backend.preference]`` has 3).
MAX_KEY_PARTS = 16

#: Characters of one bare value: numbers, booleans, dates (an int64 has at most 20).
MAX_BARE_VALUE = 64

#: ``[[name]]`` tables of one name (the schema allows 10,000 rules or constraints per list).
MAX_ARRAY_TABLES = 10_000

#: Rows of one preference table (as in the schema), whether inline tables or ``[[...rows]]``.
MAX_ROWS = 100_000

#: Inline tables in a file: preference rows (at most 100,000) plus conditions and notices.
MAX_INLINE_TABLES = 150_000

#: Features of a policy (as in the schema).
MAX_FEATURES = 1_000

#: Table headers in a file: every list of rules and constraints at its bound, rows as ``[[...rows]]``.
MAX_HEADERS = 150_000

#: Keys of one table, inline or not (a policy's tables hold tens; a thousand features written as
#: dotted keys of one table, a few thousand).
MAX_TABLE_KEYS = 10_000


def size_error(path: str, message: str, check: str = "size", line: int = 1, column: int = 1) -> PolicyError:
    """A :class:`PolicyError` with one problem at ``path:line:column`` (a bound a file passed)."""
    return PolicyError(PolicyProblem(Location(path, line, column), check, message))


def allowed_symlink_roots(start: Path) -> tuple[Path, ...]:
    """Folders ``[tool.kvpolicy] allow-symlinks`` (nearest ``pyproject.toml`` from ``start``
    upwards) lets policy symlinks point into, resolved relative to that ``pyproject.toml``.

    A ``pyproject.toml`` that cannot be read allows nothing (lint reports it as a usage error)."""
    import tomllib

    here = start.resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if not candidate.is_file():
            continue
        try:
            data = tomllib.loads(read_capped(candidate, str(candidate), 1 << 20).decode("utf-8"))
        except (PolicyError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError, ValueError):
            return ()
        table = data.get("tool", {}).get("kvpolicy", {})
        allowed = table.get("allow-symlinks", []) if isinstance(table, dict) else []
        if not isinstance(allowed, list):
            return ()
        return tuple((folder / str(entry)).resolve() for entry in allowed if isinstance(entry, str))
    return ()


def read_policy_bytes(
    path: Path,
    shown: str,
    *,
    root: Path | None = None,
    allowed: tuple[Path, ...] | None = None,
    limit: int = MAX_POLICY_BYTES,
) -> bytes:
    """The bytes of a policy file, or :class:`PolicyError` (check ``io`` or ``size``) saying why not.

    ``root`` is the policy folder: a symlink whose target lies outside it (and outside every
    folder of ``allowed``; default: ``[tool.kvpolicy] allow-symlinks``) is refused."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise size_error(shown, f"cannot read the file: {exc.strerror or exc}", "io") from None
    if stat.S_ISLNK(info.st_mode):
        try:
            target = path.resolve(strict=True)
        except RuntimeError:
            raise size_error(shown, "the symlink points to itself through a loop; point it at a policy file", "io") from None
        except OSError as exc:
            if exc.errno == 40:  # ELOOP on Linux; Python >= 3.13 raises OSError instead of RuntimeError
                raise size_error(shown, "the symlink points to itself through a loop; point it at a policy file", "io") from None
            raise size_error(shown, f"the symlink's target cannot be read: {exc.strerror or exc}", "io") from None
        base = (root if root is not None else path.parent).resolve()
        roots = (base, *(allowed if allowed is not None else allowed_symlink_roots(path.parent)))
        if not any(target == r or r in target.parents for r in roots):
            raise size_error(
                shown,
                f"the symlink points outside the policy folder (to {target}); copy the file in, or allow "
                'its folder with allow-symlinks = ["..."] in [tool.kvpolicy] of pyproject.toml',
                "io",
            )
    return read_capped(path, shown, limit)


def read_capped(path: Path, shown: str, limit: int, kind: str = "policy files") -> bytes:
    """At most ``limit`` bytes of a regular file; :class:`PolicyError` (``io`` or ``size``) otherwise.
    ``kind`` names the files in messages ("policy files", "config files")."""
    try:
        info = os.stat(path)
    except RuntimeError:
        raise size_error(shown, "the symlink points to itself through a loop; point it at a policy file", "io") from None
    except OSError as exc:
        if exc.errno == 40:
            raise size_error(shown, "the symlink points to itself through a loop; point it at a policy file", "io") from None
        raise size_error(shown, f"cannot read the file: {exc.strerror or exc}", "io") from None
    if not stat.S_ISREG(info.st_mode):
        raise size_error(shown, f"not a regular file ({_kind(info.st_mode)}); {kind} must be regular files", "io")
    if info.st_size > limit:
        raise size_error(shown, f"the file is {info.st_size:,} bytes; {kind} are limited to {limit:,} bytes")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO since the stat, opening must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise size_error(shown, f"cannot read the file: {exc.strerror or exc}", "io") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise size_error(shown, f"not a regular file; {kind} must be regular files", "io")
        chunks = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise size_error(shown, f"cannot read the file: {exc.strerror or exc}", "io") from None
    finally:
        os.close(fd)
    if total > limit:
        raise size_error(shown, f"the file grew past {limit:,} bytes while read; {kind} are limited to {limit:,} bytes")
    return b"".join(chunks)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"
