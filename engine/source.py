"""Policy documents as text: TOML parsing with source positions.

``tomllib`` parses TOML but forgets where each value stood. Every error kvpolicy reports must carry
``file:line:col``, so this module pairs the parsed document with a *source map*: the position of
every key and every array element, addressed by the same path that jsonschema and pydantic use
(``("decisions", "transceiver_runtime", "preference", "rows", 3, "value")``).

The scanner runs only after ``tomllib`` accepted the text, so it may assume the document is valid
TOML and stays small: it tracks table headers, dotted keys, arrays and inline tables, and skips
strings and scalars.
"""

from __future__ import annotations

import bisect
import re
import sys
from dataclasses import dataclass
from typing import Any

from .errors import Location

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


__all__ = ["Location", "SourceDocument", "TomlSyntaxError", "parse_document"]

Path = tuple[Any, ...]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_TOMLLIB_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")
_END_OF_DOCUMENT = re.compile(r"\(at end of document\)")
_SUPPRESSION = re.compile(r"#\s*kvpolicy:\s*ignore\[([A-Za-z0-9_,\s]+)\]")


class TomlSyntaxError(ValueError):
    """The text is not TOML. Carries the location ``tomllib`` reported."""

    def __init__(self, message: str, location: Location, check: str = "toml") -> None:
        super().__init__(f"{location}: {message}")
        self.reason = message
        self.location = location
        self.check = check
        """``toml`` for a syntax error, ``size`` for a file refused by the bounds checked before parsing."""


@dataclass(frozen=True)
class SourceDocument:
    """A parsed policy file: its bytes, the TOML data and where each path stands in the text."""

    path: str
    raw: bytes
    text: str
    data: dict[str, Any]
    positions: dict[Path, tuple[int, int]]

    def locate(self, path: Path | list[Any] = ()) -> Location:
        """Return the location of ``path``, or of its nearest ancestor that has one."""
        key = tuple(path)
        while key:
            position = self.positions.get(key)
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

    The bounds of :func:`kvpolicy.policyfile.check_text` (nesting, key parts, value length, table
    counts) are checked first, so no input reaches ``tomllib`` that could exhaust its recursion
    or cost minutes later; a refusal has ``check == "size"``."""
    from .errors import PolicyError
    from .policyfile import check_text

    try:
        check_text(raw, path)
    except PolicyError as exc:
        problem = exc.problems[0]
        raise TomlSyntaxError(problem.message, problem.location, problem.check) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise TomlSyntaxError(
            "the file is not UTF-8 text; TOML files must be UTF-8", Location(path, line, column)
        ) from None
    try:
        data = tomllib.loads(text)
    except RecursionError:  # not reachable within check_text's bounds; kept so no input gives a traceback
        raise TomlSyntaxError("the document is nested too deeply", Location(path), "size") from None
    except tomllib.TOMLDecodeError as exc:
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
    positions = _Scanner(text).scan()
    return SourceDocument(path=path, raw=raw, text=text, data=data, positions=positions)


class _Scanner:
    """Records the position of every key and array element of a *valid* TOML document."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.positions: dict[Path, tuple[int, int]] = {}
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self._table_arrays: dict[Path, int] = {}

    def scan(self) -> dict[Path, tuple[int, int]]:
        current: Path = ()
        text = self.text
        while True:
            self._skip_blank(newlines=True)
            if self.i >= len(text):
                return self.positions
            if text.startswith("[[", self.i):
                start = self.i
                self.i += 2
                keys = self._key()
                self._expect("]]")
                prefix = self._resolve(keys[:-1])
                array = prefix + (keys[-1],)
                count = self._table_arrays.get(array, 0) + 1
                self._table_arrays[array] = count
                current = array + (count - 1,)
                self._mark(array, start)
                self._mark(current, start)
            elif text[self.i] == "[":
                start = self.i
                self.i += 1
                keys = self._key()
                self._expect("]")
                current = self._resolve(keys)
                for end in range(1, len(current) + 1):  # `[a.b]` also defines where `a` starts
                    self._mark(current[:end], start)
            else:
                start = self.i
                keys = self._key()
                self._expect("=")
                self._mark(current + tuple(keys), start)
                self._value(current + tuple(keys))

    # -- pieces ---------------------------------------------------------------------------------

    def _resolve(self, keys: list[str]) -> Path:
        path: Path = ()
        for key in keys:
            path = path + (key,)
            count = self._table_arrays.get(path)
            if count:
                path = path + (count - 1,)
        return path

    def _mark(self, path: Path, offset: int) -> None:
        if path not in self.positions:
            line = bisect.bisect_right(self._line_starts, offset)
            self.positions[path] = (line, offset - self._line_starts[line - 1] + 1)

    def _skip_blank(self, *, newlines: bool) -> None:
        text = self.text
        while self.i < len(text):
            char = text[self.i]
            if char in " \t\r" or (newlines and char == "\n"):
                self.i += 1
            elif char == "#":
                end = text.find("\n", self.i)
                self.i = len(text) if end < 0 else end
            else:
                return

    def _expect(self, token: str) -> None:
        self._skip_blank(newlines=False)
        if self.text.startswith(token, self.i):
            self.i += len(token)
        self._skip_blank(newlines=False)

    def _key(self) -> list[str]:
        keys: list[str] = []
        while True:
            self._skip_blank(newlines=False)
            char = self.text[self.i]
            if char in "\"'":
                keys.append(self._string())
            else:
                match = _BARE_KEY.match(self.text, self.i)
                assert match is not None, "tomllib accepted the text, so a key stands here"
                keys.append(match.group(0))
                self.i = match.end()
            self._skip_blank(newlines=False)
            if self.i < len(self.text) and self.text[self.i] == ".":
                self.i += 1
                continue
            return keys

    def _string(self) -> str:
        text = self.text
        quote = text[self.i]
        if text.startswith(quote * 3, self.i):
            end = self.i + 3
            while True:
                end = text.find(quote * 3, end)
                if quote == '"' and _escaped(text, end):
                    end += 1
                    continue
                break
            while text.startswith(quote, end + 3):  # up to two quotes may close the content
                end += 1
            value = text[self.i + 3 : end]
            self.i = end + 3
            return value
        end = self.i + 1
        while True:
            end = text.find(quote, end)
            if quote == '"' and _escaped(text, end):
                end += 1
                continue
            break
        value = text[self.i + 1 : end]
        self.i = end + 1
        return value

    def _value(self, path: Path) -> None:
        text = self.text
        self._skip_blank(newlines=False)
        char = text[self.i]
        if char in "\"'":
            self._string()
        elif char == "[":
            self.i += 1
            index = 0
            while True:
                self._skip_blank(newlines=True)
                if text[self.i] == "]":
                    self.i += 1
                    return
                self._mark(path + (index,), self.i)
                self._value(path + (index,))
                index += 1
                self._skip_blank(newlines=True)
                if text[self.i] == ",":
                    self.i += 1
        elif char == "{":
            self.i += 1
            while True:
                self._skip_blank(newlines=True)
                if text[self.i] == "}":
                    self.i += 1
                    return
                start = self.i
                keys = self._key()
                self._expect("=")
                self._mark(path + tuple(keys), start)
                self._value(path + tuple(keys))
                self._skip_blank(newlines=True)
                if text[self.i] == ",":
                    self.i += 1
        else:
            while self.i < len(text) and text[self.i] not in ",]}\n#":
                self.i += 1


def _escaped(text: str, index: int) -> bool:
    backslashes = 0
    while index - 1 - backslashes >= 0 and text[index - 1 - backslashes] == "\\":
        backslashes += 1
    return backslashes % 2 == 1
