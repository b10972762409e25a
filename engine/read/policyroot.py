"""Which policies a command uses: one answer for every command.

In this order: the folder (or file) ``--policy`` names; the folder ``policies = "DIR"`` in
``[tool.kvpolicy]`` of the nearest ``pyproject.toml`` names (relative to that file); ``./policies``
when it holds policy files; else the history that ships with kvpolicy. A user who runs
``kvpolicy new`` in their repository then sees the new version in ``diff``, ``resolve`` and
``report`` without naming the folder again.

This module also finds and reads ``[tool.kvpolicy]`` for the linter, so that the table has one
reader. It imports no TOML parser unless a ``pyproject.toml`` may hold the table: a cold
``kvpolicy resolve`` reads the nearest one on every run.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from ..errors import Location, PolicyError, PolicyProblem
from ..records import FrozenRecord
from .policyfile import Pattern, read_capped, policy_files

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

__all__ = ["DEFAULT_FOLDER", "PolicySource", "find_pyproject", "kvpolicy_table", "policy_source"]

#: The folder a command looks for in the working directory.
DEFAULT_FOLDER = "policies"

# Text that may hold a [tool.kvpolicy] table: `[tool.kvpolicy]`, `tool.kvpolicy.x = `, a bare `[tool]`
# table or an inline `tool = {...}`. A pyproject.toml without any of these is not parsed.
_MAY_CONFIGURE = Pattern(
    rb"""tool["']?[ \t]*\.[ \t]*["']?kvpolicy|^[ \t]*\[[ \t]*["']?tool["']?[ \t]*\]|^[ \t]*["']?tool["']?[ \t]*=""",
    re.MULTILINE,
)


class PolicySource(FrozenRecord):
    """The policies a command uses and why: ``path`` is the file or folder (None: the shipped
    history), ``origin`` one of ``--policy``, ``pyproject``, ``working-directory``, ``shipped``,
    ``config`` the ``pyproject.toml`` that named the folder, ``note`` why a folder was passed over,
    ``foreign`` whether that folder was ./policies holding another tool's TOML files."""

    __slots__ = ("path", "origin", "config", "note", "foreign")
    _defaults = {"config": None, "note": "", "foreign": False}
    path: Path | None
    origin: str
    config: str | None
    note: str
    foreign: bool

    @property
    def shown(self) -> str | None:
        """The path as messages show it (``./policies``), None for the shipped history."""
        if self.path is None:
            return None
        text = str(self.path)
        if self.origin == "--policy" or os.path.isabs(text) or text.startswith("."):
            return text
        return "./" + text

    def describe(self) -> str:
        """The one line a command's text output starts with, e.g. ``policies: ./policies (found in
        the working directory)``."""
        if self.path is None:
            from ..version import __version__

            return f"policies: shipped with kvpolicy {__version__}" + (f" ({self.note})" if self.note else "")
        why = {
            "--policy": "--policy",
            "pyproject": f"[tool.kvpolicy] policies in {self.config}",
            "working-directory": "found in the working directory",
        }[self.origin]
        return f"policies: {self.shown} ({why})"

    def to_dict(self) -> dict[str, Any]:
        """``{"path": ..., "origin": ...}`` for JSON output (path null: the shipped history)."""
        return {"path": self.shown, "origin": self.origin}


def policy_source(option: str | None = None, *, pyproject: str | None = None, start: Path | None = None) -> PolicySource:
    """The policies a command uses (see the module docstring for the order).

    ``option`` is the ``--policy`` value, ``pyproject`` a file to read ``[tool.kvpolicy]`` from
    instead of the nearest one upwards of ``start`` (default: the working directory). Raises
    :class:`PolicyError`, located in the ``pyproject.toml``, when its ``policies`` names no folder."""
    if option is not None:
        return PolicySource(Path(option), "--policy")
    config = Path(pyproject) if pyproject is not None else find_pyproject(start)
    if config is not None:
        table = kvpolicy_table(config, lazy=pyproject is None)
        if table is not None and "policies" in table:
            return _configured(table["policies"], config, start)
    here = Path(start) / DEFAULT_FOLDER if start is not None else Path(DEFAULT_FOLDER)
    if here.is_dir():
        files = policy_files(here)
        if files and any(_looks_like_kvpolicy(path) for path in files):
            return PolicySource(here, "working-directory")
        if files:  # another tool's policies/ (OPA, conftest, Kyverno): not ours to read
            return PolicySource(
                None,
                "shipped",
                note=(
                    f"./{DEFAULT_FOLDER} holds TOML files that are not kvpolicy policies (no top-level schema and version); "
                    "point --policy or [tool.kvpolicy] policies in pyproject.toml at your kvpolicy folder"
                ),
                foreign=True,
            )
        return PolicySource(None, "shipped", note=f"./{DEFAULT_FOLDER} holds no policy files")
    return PolicySource(None, "shipped")


#: How much of a file the ./policies fallback reads to tell a kvpolicy policy from another tool's TOML.
_SNIFF_BYTES = 4096
_TOP_KEY = re.compile(r"^(schema|version)[ \t]*=", re.MULTILINE)


def _looks_like_kvpolicy(path: Path) -> bool:
    """Whether a TOML file in ./policies is a kvpolicy policy: ``schema`` and ``version`` at the top
    level, before the first table (the first 4 KB, so a hostile file costs nothing). A file that
    cannot be read counts as one: the loader then reports it with its location."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SNIFF_BYTES).decode("utf-8", "replace")
    except OSError:
        return True
    table = re.search(r"^[ \t]*\[", head, re.MULTILINE)
    top = head[: table.start()] if table else head
    return {m.group(1) for m in _TOP_KEY.finditer(top)} == {"schema", "version"}


def _configured(value: object, config: Path, start: Path | None) -> PolicySource:
    """The folder ``[tool.kvpolicy] policies`` names, checked."""
    root = config.parent
    shown_config = _relative(config, start, root)

    def problem(message: str) -> PolicyError:
        return PolicyError(PolicyProblem(Location(shown_config, _key_line(config)), "config", f"[tool.kvpolicy] policies {message}"))

    if not isinstance(value, str) or not value.strip():
        raise problem(f"must name a folder (a path relative to {shown_config}), not {value!r}")
    folder = Path(os.path.abspath(config.parent / value))
    if not folder.exists():
        raise problem(f"= {value!r}: no such folder {folder}; create it or fix the path (relative to {shown_config})")
    if not folder.is_dir():
        raise problem(f"= {value!r}: {folder} is not a folder; name the folder that holds the policy files")
    return PolicySource(Path(_relative(folder, start, root)), "pyproject", shown_config)


def _relative(path: Path, start: Path | None, root: Path) -> str:
    """``path`` as messages show it: relative to the working directory (``start``) when both lie in
    the project folder ``root`` (``./mypol``, ``../pyproject.toml``), absolute otherwise."""
    here = os.path.abspath(start if start is not None else os.getcwd())
    absolute = os.path.abspath(path)
    top = os.path.abspath(root)
    if os.path.commonpath([here, absolute, top]) != top:
        return absolute
    relative = os.path.relpath(absolute, here)
    return relative if relative.startswith(os.curdir) else os.path.join(os.curdir, relative)


def _key_line(config: Path) -> int:
    """The line of the ``policies`` key in ``config`` (1 when it cannot be found)."""
    try:
        text = config.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 1
    match = re.search(r"^[ \t]*(?:tool\.kvpolicy\.)?policies[ \t]*=", text, re.MULTILINE)
    return text.count("\n", 0, match.start()) + 1 if match else 1


def find_pyproject(start: Path | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` from ``start`` (default: the working directory) upwards."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def kvpolicy_table(path: Path, *, lazy: bool = False) -> dict[str, Any] | None:
    """The ``[tool.kvpolicy]`` table of a ``pyproject.toml`` (None when it has none).

    Raises :class:`PolicyError` when the file cannot be read or is not TOML, or the table is not a
    table. ``lazy``: a file whose text cannot hold the table is not parsed (and not judged)."""
    raw = read_capped(path, str(path), 1 << 20, "pyproject.toml files")
    if lazy and _MAY_CONFIGURE.search(raw) is None:
        return None
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PolicyError(PolicyProblem(Location(str(path)), "config", f"cannot read the file as TOML: {exc}")) from None
    tool = data.get("tool", {})
    table = tool.get("kvpolicy") if isinstance(tool, dict) else None
    if table is not None and not isinstance(table, dict):
        raise PolicyError(PolicyProblem(Location(str(path)), "config", "[tool.kvpolicy] must be a table"))
    return table
