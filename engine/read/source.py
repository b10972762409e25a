"""Policy documents as text: TOML parsing with source positions.

``tomllib`` parses TOML but forgets where each value stood. Every error kvpolicy reports must carry
``file:line:col``, so this module pairs the parsed document with a *source map*: the position of
every key and every array element, addressed by the same path that jsonschema uses
(``("decisions", "transceiver_runtime", "preference", "rows", 3, "value")``).

The source map is recorded by the bounds pass that runs before the parser
(:func:`kvpolicy.read.scan.check_text`), which reads every token of the file anyway: one scan of
the text, then the parser. The keys inside a preference row are located only when something asks.

The parser is tomli's compiled (mypyc) build when it is installed, at a version that parses TOML
1.0 like the standard library's ``tomllib`` (the same code, about 3x faster); ``tomllib`` otherwise.
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from types import ModuleType
from typing import Any

from ..errors import Location

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .scan import SourceMap

__all__ = ["Location", "SourceDocument", "TomlSyntaxError", "parse_document", "toml_parser"]

Path = tuple[Any, ...]

_TOMLLIB_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")
_END_OF_DOCUMENT = re.compile(r"\(at end of document\)")
_SUPPRESSION = re.compile(r"#\s*kvpolicy:\s*ignore\[([A-Za-z0-9_,\s]+)\]")


@lru_cache(maxsize=1)
def toml_parser() -> ModuleType:
    """The module whose ``loads`` parses policy files: tomli when it is compiled and parses TOML
    1.0 (``2.0.1 <= version < 2.4``: the code of Python 3.11's ``tomllib``, accepting and refusing
    the same documents), else ``tomllib`` (``tomli`` on Python 3.10)."""
    found: ModuleType | None
    try:
        import tomli
        from tomli import _parser
    except ImportError:
        found = None
    else:
        found = tomli
        version = tuple(int(part) for part in re.findall(r"\d+", getattr(tomli, "__version__", "0"))[:3])
        compiled = not str(getattr(_parser, "__file__", "")).endswith(".py")
        if (2, 0, 1) <= version < (2, 4) and (compiled or sys.version_info < (3, 11)):
            return tomli
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    if found is None:  # pragma: no cover - the install requires tomli on Python 3.10
        raise ImportError("kvpolicy needs tomli on Python 3.10: pip install 'tomli>=2.0.1,<2.4'")
    return found  # pragma: no cover - exercised on Python 3.10 only


class TomlSyntaxError(ValueError):
    """The text is not TOML. Carries the location the parser reported."""

    def __init__(self, message: str, location: Location, check: str = "toml") -> None:
        super().__init__(f"{location}: {message}")
        self.reason = message
        self.location = location
        self.check = check
        """``toml`` for a syntax error, ``size`` for a file refused by the bounds checked before parsing."""


_set = object.__setattr__


class SourceDocument:
    """A parsed policy file: its bytes, the TOML data and where each path stands in the text.

    ``positions`` maps paths to 1-based (line, column); see :class:`kvpolicy.read.scan.SourceMap`
    for the part of it that is filled only when first read. Read-only, like the frozen dataclass
    it was."""

    __slots__ = ("path", "raw", "text", "data", "_positions", "_source_map")
    path: str
    raw: bytes
    text: str
    data: dict[str, Any]
    _positions: dict[Path, tuple[int, int]]
    _source_map: SourceMap | None

    def __init__(
        self,
        path: str,
        raw: bytes,
        text: str,
        data: dict[str, Any],
        positions: dict[Path, tuple[int, int]],
        source_map: SourceMap | None = None,
    ) -> None:
        _set(self, "path", path)
        _set(self, "raw", raw)
        _set(self, "text", text)
        _set(self, "data", data)
        _set(self, "_positions", positions)
        _set(self, "_source_map", source_map)  # a SourceMap with keys still to locate, or None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a SourceDocument is read-only (cannot assign {name!r})")

    @property
    def positions(self) -> dict[Path, tuple[int, int]]:
        """Every recorded path and its (line, column)."""
        if self._source_map is not None:
            _set(self, "_positions", self._source_map.complete())
            _set(self, "_source_map", None)
        return self._positions

    def recorded_map(self) -> tuple[dict[Path, tuple[int, int]], list[tuple[Any, ...]]]:
        """The source map as recorded, without locating anything more: the positions so far and
        the inline tables whose keys are still to locate (for the document cache)."""
        if self._source_map is None:
            return self._positions, []
        return self._positions, list(self._source_map.inline)

    def __repr__(self) -> str:
        return f"SourceDocument(path={self.path!r}, {len(self.raw):,} bytes)"

    def locate(self, path: Path | list[Any] = ()) -> Location:
        """Return the location of ``path``, or of its nearest ancestor that has one."""
        key = tuple(path)
        positions = self._positions
        while key:
            position = positions.get(key)
            if position is None and self._source_map is not None:
                positions = self.positions
                position = positions.get(key)
            if position is not None:
                return Location(self.path, position[0], position[1])
            key = key[:-1]
        return Location(self.path, 1, 1)

    def line_text(self, line: int) -> str:
        """The text of a 1-based line, without its newline ('' past the end)."""
        lines = self.text.splitlines()
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def suppressions(self) -> dict[int, frozenset[str]]:
        """Inline ``# kvpolicy: ignore[CODE, ...]`` comments, by line."""
        found: dict[int, frozenset[str]] = {}
        for number, line in enumerate(self.text.splitlines(), start=1):
            match = _SUPPRESSION.search(line)
            if match:
                codes = frozenset(c.strip().upper() for c in match.group(1).split(",") if c.strip())
                found[number] = codes
        return found


def parse_document(raw: bytes, path: str) -> SourceDocument:
    """Parse TOML bytes; raise :class:`TomlSyntaxError` with the position of the first problem.

    The bounds of :func:`kvpolicy.read.scan.check_text` (nesting, key parts, value length, table
    counts) are checked first, so no input reaches the parser that could exhaust its recursion
    or cost minutes later; a refusal has ``check == "size"``. The same pass records the source map."""
    from ..errors import PolicyError
    from .scan import check_text
    from .scan import SourceMap

    source_map = SourceMap()
    try:
        check_text(raw, path, source_map)
    except PolicyError as exc:
        problem = exc.problems[0]
        raise TomlSyntaxError(problem.message, problem.location, problem.check) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise TomlSyntaxError("the file is not UTF-8 text; TOML files must be UTF-8", Location(path, line, column)) from None
    parser = toml_parser()
    try:
        data = parser.loads(text)
    except RecursionError:  # not reachable within check_text's bounds; kept so no input gives a traceback
        raise TomlSyntaxError("the document is nested too deeply", Location(path), "size") from None
    except parser.TOMLDecodeError as exc:
        message = str(exc)
        match = _TOMLLIB_POSITION.search(message)
        if match:
            line, column = int(match.group(1)), int(match.group(2))
        elif "end of document" in message:
            lines = text.splitlines() or [""]
            line, column = len(lines), len(lines[-1]) + 1
        else:
            line, column = 1, 1
        reason = _END_OF_DOCUMENT.sub("", _TOMLLIB_POSITION.sub("", message)).strip()
        if "end of document" in message:
            reason += " at the end of the file"
        raise TomlSyntaxError(f"invalid TOML: {reason}", Location(path, line, column)) from None
    except ValueError as exc:  # e.g. an integer beyond int's string-conversion limit
        raise TomlSyntaxError(f"invalid TOML: {exc}", Location(path), "size") from None
    return SourceDocument(path, raw, text, data, source_map.positions, source_map if source_map.inline else None)
