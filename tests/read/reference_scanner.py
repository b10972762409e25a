"""The source-position scanner kvpolicy used before the bounds pass recorded positions itself
(``kvpolicy.read.source`` until issue 14): a character-by-character walk of a *valid* TOML document.
Kept here as the oracle the one-pass source map is compared against (tests/read/test_source.py)."""

from __future__ import annotations

import bisect
import re
from typing import Any

Path = tuple[Any, ...]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def scan(text: str) -> dict[Path, tuple[int, int]]:
    """The position of every key and array element of valid TOML ``text``, by path."""
    return Scanner(text).scan()


class Scanner:
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
