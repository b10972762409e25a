"""One pass over a policy file's text before it is parsed: the structural bounds, and the source map.

:func:`check_text` runs :func:`scan` (after its cheap counts) on every policy
file before the parser sees a byte: nesting of arrays and inline tables, parts of a dotted key or
header and the length of a bare value are bounded here, so neither the parser's recursion nor the
later stages' per-level costs are reachable. The same pass records where each key, table and array
element stands (a :class:`SourceMap`), which every ``file:line:col`` in kvpolicy's messages comes
from; it reads every token anyway, and a second scan of the text cost as much as the parser.
"""

from __future__ import annotations

import re

from ..errors import PolicyError
from .policyfile import (
    MAX_ARRAY_TABLES,
    MAX_BARE_VALUE,
    MAX_FEATURES,
    MAX_HEADERS,
    MAX_INLINE_TABLES,
    MAX_KEY_PARTS,
    MAX_NESTING,
    MAX_ROWS,
    MAX_TABLE_KEYS,
    Pattern,
    size_error,
)

__all__ = ["SourceMap", "check_text", "scan"]

# One token per match; strings and comments are consumed whole so that brackets and dots inside
# them do not count. Possessive quantifiers keep an unterminated string linear (the parser then
# reports it with its position).
_TOKEN = Pattern(
    r'''
      (?P<mlb>"""(?:[^"\\]|\\[\s\S]|"(?!""))*+"{3,5}|"""[\s\S]*+)
    | (?P<mll>\'\'\'(?:[^']|'(?!''))*+'{3,5}|\'\'\'[\s\S]*+)
    | (?P<str>"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"?|'[^'\n]*+'?)
    | (?P<comment>\#[^\n]*+)
    | (?P<itab>\{[ \t]*(?:[A-Za-z0-9_-]++[ \t]*=[ \t]*"[^"\\\n]*+"(?!")[ \t]*,[ \t]*)*+[A-Za-z0-9_-]++[ \t]*=[ \t]*"[^"\\\n]*+"(?!")[ \t]*\})
    | (?P<kv>(?P<kvkey>[A-Za-z0-9_-]++)[ \t]*=[ \t]*"[^"\\\n]*+"(?!"))
    | (?P<nl>\n)
    | (?P<bare>[A-Za-z0-9_+\-:]++)
    | (?P<punct>[\[\]{}=,.])
    | [^\S\n]++
    | .
    ''',
    re.VERBOSE,
)
# A key of a simple inline table (the ``itab`` token above), for the source map.
_INLINE_KEY = Pattern(r'([A-Za-z0-9_-]++)[ \t]*=[ \t]*"[^"\\\n]*+"(?!")')  # (each match skips its string)


class SourceMap:
    """Where each key, table and array element of a TOML text stands: ``positions`` maps its path
    (``("decisions", "backend", "preference", "rows", 3, "value")``) to a 1-based (line, column).

    Filled by :func:`kvpolicy.read.scan.check_text`. The keys of simple inline tables (``inline``: the table's path,
    its span and line) are added by :meth:`complete`, on the first question that needs them:
    a policy that loads cleanly never asks where ``rows[3].value`` stands."""

    __slots__ = ("text", "positions", "inline")

    def __init__(self) -> None:
        self.text = ""
        self.positions: dict[tuple[object, ...], tuple[int, int]] = {}
        self.inline: list[tuple[tuple[object, ...], int, int, int, int]] = []

    def complete(self) -> dict[tuple[object, ...], tuple[int, int]]:
        """``positions`` with the keys of every inline table added."""
        positions, text, finditer = self.positions, self.text, _INLINE_KEY.finditer
        for path, start, end, line, line_start in self.inline:
            for key in finditer(text, start, end):
                positions.setdefault(path + (key.group(1),), (line, key.start() - line_start + 1))
        self.inline = []
        return positions


def scan(text: str, shown: str, source_map: SourceMap | None = None) -> None:
    """The bounds pass; with ``source_map``, also the source map of the text.

    The map is recorded in the same pass because this pass already reads every token of the
    file; it is only used when the parser then accepts the text, so for invalid TOML it may hold
    anything. A simple inline table (bare keys, one-line strings without escapes: a preference
    row) and a ``key = "string"`` pair are single tokens, so a row costs one step here; the keys
    inside such a table are located only when something asks (:meth:`SourceMap.complete`)."""
    stack: list[str] = []  # "a" array, "i" inline table
    mode = "key"  # key | value | header
    parts = 0
    line, line_start = 1, 0
    record = source_map is not None
    positions = source_map.positions if source_map is not None else None
    inline = source_map.inline if source_map is not None else None
    if source_map is not None:
        source_map.text = text
    # The source map's state: the table of the current section, the number of [[tables]] of each
    # name so far, and for each open array or inline table its path (None: not a value, i.e.
    # invalid TOML) and, for arrays, the elements seen so far.
    current: tuple[object, ...] = ()
    table_arrays: dict[tuple[object, ...], int] = {}
    paths: list[tuple[object, ...] | None] = []
    counts: list[int] = []
    keys: list[str] = []  # parts of the key being read
    key_start = 0
    header_start = 0
    header_array = False
    value_path: tuple[object, ...] | None = None  # the key whose value comes next (after '=')
    element = False  # in an array, the next value is an element

    def fail(message: str, offset: int) -> PolicyError:
        return size_error(shown, message, "size", line, offset - line_start + 1)

    def deep(offset: int) -> PolicyError:
        return fail(f"arrays and inline tables nested more than {MAX_NESTING} deep; policies need at most 4", offset)

    # Keys of the current section and of each open inline table: a table of a million unknown
    # keys would otherwise reach the parser and the schema's messages (seconds, not milliseconds).
    section_keys = 0
    table_keys: list[int] = []  # aligned with ``stack`` (counted for inline tables only)

    def too_many_keys(offset: int) -> PolicyError:
        return fail(f"more than {MAX_TABLE_KEYS:,} keys in one table; no policy table needs that many", offset)

    def count_key(offset: int) -> None:
        nonlocal section_keys
        if stack:
            table_keys[-1] += 1
            count = table_keys[-1]
        else:
            section_keys += 1
            count = section_keys
        if count > MAX_TABLE_KEYS:
            raise too_many_keys(offset)

    def resolve(names: list[str]) -> tuple[object, ...]:
        path: tuple[object, ...] = ()
        for name in names:
            path = path + (name,)
            count = table_arrays.get(path)
            if count:
                path = path + (count - 1,)
        return path

    for match in _TOKEN.finditer(text):
        kind = match.lastgroup
        if kind is None:
            continue
        if kind == "nl":
            line += 1
            line_start = match.start() + 1
            if not stack:
                mode, parts = "key", 0
                keys = []
                value_path = None
            continue
        if kind == "itab":  # { key = "string", ... }: a preference row
            if mode != "value":
                mode, parts = ("key" if mode == "header" else "value"), 0  # not TOML: the parser stops here
                continue
            if len(stack) >= MAX_NESTING:
                raise deep(match.start())
            if (
                text.count("=", match.start(), match.end()) > MAX_TABLE_KEYS
                and sum(1 for _ in _INLINE_KEY.finditer(text, match.start(), match.end())) > MAX_TABLE_KEYS
            ):
                raise too_many_keys(match.start())
            if record:
                start = match.start()
                path = value_path
                if path is None and element and stack and stack[-1] == "a":
                    path = paths[-1]
                    if path is not None:
                        path = path + (counts[-1],)
                        positions.setdefault(path, (line, start - line_start + 1))  # type: ignore[union-attr]  # paths are tracked only with a source map: positions and inline exist here
                    counts[-1] += 1
                if path is not None and value_path is None:  # a row: its keys are located on first ask
                    inline.append((path, start, match.end(), line, line_start))  # type: ignore[union-attr]  # paths are tracked only with a source map: positions and inline exist here
                elif path is not None:  # a key's value (a rule's `default = {...}`): few, and the loader claims their ids
                    for key in _INLINE_KEY.finditer(text, start, match.end()):
                        positions.setdefault(path + (key.group(1),), (line, key.start() - line_start + 1))  # type: ignore[union-attr]  # paths are tracked only with a source map: positions and inline exist here
            value_path = None
            element = False
            continue
        if kind == "kv":  # key = "string"
            if mode == "key":
                if parts == 0:
                    parts = 1
                count_key(match.start())
                if record:
                    if not keys:
                        key_start = match.start()
                    keys.append(match.group("kvkey"))
                    base = current if not stack else paths[-1]
                    if base is not None:
                        positions.setdefault(base + tuple(keys), (line, key_start - line_start + 1))  # type: ignore[union-attr]  # paths are tracked only with a source map: positions and inline exist here
                    keys = []
                mode, parts = "value", 0
                value_path = None
                continue
            # Not a key here (not TOML): a bare value and a string, as the bounds read them.
            width = len(match.group("kvkey"))
            if mode == "value" and width > MAX_BARE_VALUE:
                raise fail(
                    f"a value of {width:,} characters; numbers in a policy have at most 20 digits (values are at most {MAX_BARE_VALUE} characters)",
                    match.start(),
                )
            if mode == "header" and parts == 0:
                parts = 1
            kind = "str"  # for the source map below: one scalar value
        at_line, at_start = line, line_start  # where the token starts (a multi-line string moves line)
        if kind in ("mlb", "mll"):
            token = match.group()
            newlines = token.count("\n")
            if newlines:
                line += newlines
                line_start = match.start() + token.rfind("\n") + 1
            # a value (an array element), never a key in TOML
        elif kind == "comment":
            continue
        elif kind in ("str", "bare"):
            if mode == "value" and kind == "bare" and match.end() - match.start() > MAX_BARE_VALUE:
                raise fail(
                    f"a value of {match.end() - match.start():,} characters; numbers in a policy have "
                    f"at most 20 digits (values are at most {MAX_BARE_VALUE} characters)",
                    match.start(),
                )
            if mode != "value":
                if parts == 0:
                    parts = 1
                if record:
                    if not keys:
                        key_start = match.start()
                    token = match.group()
                    keys.append(token if kind == "bare" else token[1:-1] if len(token) > 1 and token[-1] == token[0] else token[1:])
                continue
        if kind != "punct":
            # A scalar value: the element of an array it starts, if any.
            if record and mode == "value":
                if value_path is not None:
                    value_path = None
                elif element and stack and stack[-1] == "a":
                    element = False
                    path = paths[-1]
                    if path is not None:
                        positions.setdefault(path + (counts[-1],), (at_line, match.start() - at_start + 1))  # type: ignore[union-attr]  # paths are tracked only with a source map: positions and inline exist here
                    counts[-1] += 1
            continue
        char = match.group()
        if char == ",":
            if stack and stack[-1] == "i":
                mode, parts = "key", 0
                keys = []
            elif stack:
                mode = "value"
                element = True
        elif char == "=":
            if mode == "key":
                mode, parts = "value", 0
                count_key(match.start())
                if record and keys:
                    base = current if not stack else paths[-1]
                    value_path = None if base is None else base + tuple(keys)
                    if value_path is not None:
                        positions.setdefault(value_path, (line, key_start - line_start + 1))  # type: ignore[union-attr]  # paths are tracked only with a source map: positions and inline exist here
                    keys = []
        elif char == ".":
            if mode in ("key", "header"):
                parts += 1
                if parts > MAX_KEY_PARTS:
                    raise fail(
                        f"a dotted key or table header of more than {MAX_KEY_PARTS} parts; policy keys have at most 7",
                        match.start(),
                    )
        elif char in "[{":
            if mode == "value":
                stack.append("a" if char == "[" else "i")
                table_keys.append(0)
                if len(stack) > MAX_NESTING:
                    raise deep(match.start())
                if record:
                    path = value_path
                    if path is None and element and len(stack) > 1 and stack[-2] == "a":
                        path = paths[-1]
                        if path is not None:
                            path = path + (counts[-1],)
                            positions.setdefault(path, (line, match.start() - line_start + 1))  # type: ignore[union-attr]  # paths are tracked only with a source map: positions and inline exist here
                        counts[-1] += 1
                    paths.append(path)
                    counts.append(0)
                    value_path = None
                    keys = []
                element = char == "["
                if char == "{":
                    mode, parts = "key", 0
            elif char == "[" and mode == "key" and not stack:
                mode = "header"
                header_start = match.start()
                header_array = False
                keys = []
            elif char == "[" and mode == "header" and not keys and match.start() == header_start + 1:
                header_array = True  # [[name]]
        else:  # ] or }
            if mode == "header":
                mode, parts = "key", 0
                section_keys = 0
                if record and keys:
                    at = (line, header_start - line_start + 1)
                    if header_array:
                        array = resolve(keys[:-1]) + (keys[-1],)
                        count = table_arrays.get(array, 0) + 1
                        table_arrays[array] = count
                        current = array + (count - 1,)
                        positions.setdefault(array, at)  # type: ignore[union-attr]  # paths are tracked only with a source map: positions and inline exist here
                        positions.setdefault(current, at)  # type: ignore[union-attr]  # paths are tracked only with a source map: positions and inline exist here
                    else:
                        current = resolve(keys)
                        for end in range(1, len(current) + 1):  # `[a.b]` also says where `a` starts
                            positions.setdefault(current[:end], at)  # type: ignore[union-attr]  # paths are tracked only with a source map: positions and inline exist here
                keys = []
            elif stack:
                stack.pop()
                table_keys.pop()
                mode = "value"
                element = False
                value_path = None
                if record:
                    paths.pop()
                    counts.pop()


# -- bounds before tomllib -------------------------------------------------------------------------

_ARRAY_HEADER = Pattern(rb"^[ \t]*\[\[[ \t]*([^\]\n]{1,200}?)[ \t]*\]\]", re.MULTILINE)


def check_text(raw: bytes, shown: str, source_map: SourceMap | None = None) -> None:
    """Refuse, with a location, a file whose structure would cost more than a policy can need:
    too deep, too many parts in a key, a too-long bare value, too many tables or rows. Valid TOML
    within the bounds passes; invalid TOML is left to the parser to report.

    With ``source_map`` (a new :class:`SourceMap`), the same pass fills it with
    where each key, table and array element stands, meaningful once the parser accepted the text."""
    _check_array_tables(raw, shown)
    text = raw.decode("utf-8", errors="replace")
    if raw.count(b"{") > MAX_FEATURES:  # only then can an inline list or the inline tables be too many
        _count_rows(text, shown)
    scan(text, shown, source_map)


_HEADER = Pattern(rb"^[ \t]*\[", re.MULTILINE)
_FEATURE_HEADER = Pattern(rb"^[ \t]*\[[ \t]*features[ \t]*\.", re.MULTILINE)


def _check_headers(raw: bytes, shown: str) -> None:
    if raw.count(b"[") <= MAX_FEATURES:
        return
    for pattern, limit, what in (
        (_FEATURE_HEADER, MAX_FEATURES, f"more than {MAX_FEATURES:,} [features.*] tables; the schema allows at most {MAX_FEATURES:,} features"),
        (_HEADER, MAX_HEADERS, f"more than {MAX_HEADERS:,} table headers; no policy needs that many"),
    ):
        count = 0
        for match in pattern.finditer(raw):
            count += 1
            if count > limit:
                raise size_error(shown, what, line=raw.count(b"\n", 0, match.start()) + 1)


def _check_array_tables(raw: bytes, shown: str) -> None:
    _check_headers(raw, shown)
    if raw.count(b"[[") <= MAX_ARRAY_TABLES:
        return
    counts: dict[bytes, int] = {}
    for match in _ARRAY_HEADER.finditer(raw):
        name = re.sub(rb"\s+", b"", match.group(1))
        counts[name] = counts.get(name, 0) + 1
        limit = MAX_ROWS if name.endswith(b".rows") else MAX_ARRAY_TABLES
        if counts[name] > limit:
            line = raw.count(b"\n", 0, match.start()) + 1
            raise size_error(
                shown,
                f"more than {limit:,} [[{name.decode('utf-8', 'replace')}]] tables; a policy allows at most {limit:,} per list",
                line=line,
                column=1,
            )


# Strings and comments, removed before counting rows: multi-line strings first (replaced by their
# newlines, so line numbers stay), then one-line strings and comments (they hold no newline).
_MULTILINE_STRING = Pattern(r'''"""(?:[^"\\]|\\[\s\S]|"(?!""))*+"{3,5}|"""[\s\S]*+|\'\'\'(?:[^']|'(?!''))*+'{3,5}|\'\'\'[\s\S]*+''')
# Unrolled ("normal* (special normal*)*"): twice as fast as a per-character alternation.
_LINE_STRING_OR_COMMENT = Pattern(r""""[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"?|'[^'\n]*+'?|\#[^\n]*+""")
_LIST_KEY = Pattern(r"(?<![\w-])(?:(rows|constraints|requirement|conditional)[ \t]*=[ \t]*\[|(features)[ \t]*=[ \t]*\{)")
_BRACKET = Pattern(r"[\[\]{}]")


def _count_rows(text: str, shown: str) -> None:
    """Refuse more entries in an inline list of tables (``rows = [...]``, ``constraints = [...]``,
    ``requirement``, ``conditional``), or more inline tables in the file, than a policy may hold.
    Counting runs on the text without strings and comments, bracket by bracket, and stops at the
    bound: a 300,000-row file is refused in about a second instead of minutes of parsing."""
    if '"""' in text or "'''" in text:
        text = _MULTILINE_STRING.sub(lambda m: "\n" * m.group().count("\n"), text)
    bare = _LINE_STRING_OR_COMMENT.sub("", text)
    for match in _LIST_KEY.finditer(bare):
        name = match.group(1) or match.group(2)
        limit = MAX_ROWS if name == "rows" else MAX_FEATURES if name == "features" else MAX_ARRAY_TABLES
        if bare.count("{", match.end()) <= limit:
            continue
        depth = count = 0
        for bracket in _BRACKET.finditer(bare, match.end()):
            char = bracket.group()
            if char in "[{":
                if depth == 0 and char == "{":
                    count += 1
                    if count > limit:
                        raise size_error(
                            shown,
                            f"more than {limit:,} entries in `{name} = {'{...}' if name == 'features' else '[...]'}`; "
                            f"the schema allows at most {limit:,} "
                            "(split the table across versions or architectures)",
                            line=bare.count("\n", 0, match.start()) + 1,
                            column=match.start() - (bare.rfind("\n", 0, match.start()) + 1) + 1,
                        )
                depth += 1
            elif depth == 0:
                break  # the list's own closing bracket
            else:
                depth -= 1
    if bare.count("{") > MAX_INLINE_TABLES:
        at = -1
        for _ in range(MAX_INLINE_TABLES + 1):
            at = bare.find("{", at + 1)
        raise size_error(
            shown,
            f"more than {MAX_INLINE_TABLES:,} inline tables; a policy has at most {MAX_ROWS:,} rows plus its rules' conditions",
            line=bare.count("\n", 0, at) + 1,
        )
