"""Reading serving configs (YAML or JSON) safely, for ``kvpolicy impact``.

A config folder may hold anything a repository holds, so each file is read with the same cheap
checks as a policy file (regular files only, size by ``stat`` and a capped read) and parsed with
bounds that keep one hostile file from costing the whole report:

- YAML is composed by :class:`BoundedSafeLoader` (PyYAML's ``SafeLoader``: no Python objects),
  which refuses nesting deeper than :data:`MAX_DEPTH` before the composer's recursion can
  overflow, counts every alias at the size of what it expands to and refuses a document that
  would expand past :data:`MAX_EXPANDED_NODES` (an alias bomb), and makes a duplicate key an
  error instead of silently keeping the last value;
- JSON is checked for depth with one regex pass before ``json.loads``, and duplicate keys are
  an error too.

Every refusal is a :class:`ConfigFileError` with ``file:line:col``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import PolicyError
from ..read.policyfile import read_capped

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_EXPANDED_NODES",
    "BoundedSafeLoader",
    "ConfigFileError",
    "position_of",
    "read_config",
]

#: The largest config file read (real serving configs are a few KB).
MAX_CONFIG_BYTES = 4 << 20

#: Mappings and sequences nested in one another.
MAX_DEPTH = 64

#: Nodes a YAML document may have once every alias is expanded.
MAX_EXPANDED_NODES = 100_000


class ConfigFileError(ValueError):
    """A config file that cannot be used, with where and why."""

    def __init__(self, path: str, message: str, line: int | None = None, column: int | None = None) -> None:
        where = path + (f":{line}" if line is not None else "") + (f":{column}" if line is not None and column is not None else "")
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.column = column
        self.message = message


def _loader_class() -> Any:
    import yaml
    from yaml.composer import ComposerError
    from yaml.constructor import ConstructorError

    class _Bounded(yaml.SafeLoader):
        """``SafeLoader`` with a depth bound, an alias expansion budget and duplicate keys refused."""

        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self._depth = 0
            self._sizes: dict[int, int] = {}

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep; serving configs need a handful", event.start_mark)
                is_alias = isinstance(event, yaml.AliasEvent)
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            size = self._sizes.get(id(node))
            if size is None:
                size = 1
                if isinstance(node, yaml.MappingNode):
                    size += sum(self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1) for k, v in node.value)
                elif isinstance(node, yaml.SequenceNode):
                    size += sum(self._sizes.get(id(item), 1) for item in node.value)
                self._sizes[id(node)] = size
            if is_alias:
                self._expanded = getattr(self, "_expanded", 0) + size
            if size > MAX_EXPANDED_NODES or getattr(self, "_expanded", 0) > MAX_EXPANDED_NODES:
                raise ComposerError(
                    None,
                    None,
                    f"aliases expand to more than {MAX_EXPANDED_NODES:,} nodes; write the values out or use fewer aliases",
                    event.start_mark,
                )
            return node

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.get(key)
                    except TypeError:
                        continue  # an unhashable key: the base class reports it
                    if first is not None:
                        raise ConstructorError(
                            None,
                            None,
                            f"duplicate key {key!r} (first at line {first.line + 1}); YAML keeps only the last value, so remove one",
                            key_node.start_mark,
                        )
                    seen[key] = key_node.start_mark
            return super().construct_mapping(node, deep=deep)

    return _Bounded


_LOADER: Any = None


def BoundedSafeLoader(stream: Any) -> Any:  # noqa: N802 - used like a class, built lazily so yaml loads only when needed
    """A PyYAML loader for ``stream``: ``SafeLoader`` with depth, alias and duplicate-key checks."""
    global _LOADER
    if _LOADER is None:
        _LOADER = _loader_class()
    return _LOADER(stream)


def read_config(path: Path, shown: str | None = None, *, limit: int = MAX_CONFIG_BYTES) -> tuple[Any, Any]:
    """(document, YAML node tree or None) of a config file; :class:`ConfigFileError` if unusable."""
    shown = shown or str(path)
    try:
        raw = read_capped(path, shown, limit, "config files")
    except PolicyError as exc:
        problem = exc.problems[0]
        raise ConfigFileError(shown, problem.message) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigFileError(shown, "the file is not UTF-8 text", line, exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1) from None
    if path.suffix.lower() == ".json":
        document = parse_json(text, shown)
        try:  # JSON is YAML: its node tree gives the line of each key for messages
            _, node = parse_yaml(text, shown)
        except ConfigFileError:
            node = None
        return document, node
    return parse_yaml(text, shown)


def parse_yaml(text: str, shown: str) -> tuple[Any, Any]:
    """(document, node tree) of YAML text within the bounds; :class:`ConfigFileError` otherwise."""
    import yaml

    loader = BoundedSafeLoader(text)
    try:
        node = loader.get_single_node()
        document = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigFileError(
            shown,
            f"invalid YAML: {problem}",
            mark.line + 1 if mark is not None else None,
            mark.column + 1 if mark is not None else None,
        ) from None
    except RecursionError:  # not reachable within MAX_DEPTH; kept so no input gives a traceback
        raise ConfigFileError(shown, "invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    return document, node


_JSON_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*+"?|[\[\]{}\n]')


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def parse_json(text: str, shown: str) -> Any:
    """A JSON document within the depth bound and without duplicate keys; :class:`ConfigFileError` otherwise."""
    depth, line, line_start = 0, 1, 0
    for match in _JSON_TOKEN.finditer(text):
        char = match.group()
        if char == "\n":
            line, line_start = line + 1, match.end()
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigFileError(shown, f"nested more than {MAX_DEPTH} levels deep; serving configs need a handful", line, match.start() - line_start + 1)
        elif char in "]}":
            depth -= 1
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        found = [m for m in re.finditer(re.escape(json.dumps(exc.key)) + r"\s*:", text)]
        at = found[1].start() if len(found) > 1 else 0
        line = text.count("\n", 0, at) + 1
        raise ConfigFileError(
            shown, f"duplicate key {exc.key!r}; JSON readers keep only one value, so remove one", line, at - (text.rfind("\n", 0, at) + 1) + 1
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigFileError(shown, f"invalid JSON: {exc.msg}", exc.lineno, exc.colno) from None
    except (RecursionError, ValueError) as exc:
        raise ConfigFileError(shown, f"invalid JSON: {exc}") from None


def position_of(node: Any, *keys: Any) -> tuple[int, int] | None:
    """The 1-based (line, column) of the deepest of ``keys`` found in a YAML node tree (the key
    itself), or None when not even the first is there. JSON files have a node tree too
    (:func:`read_config`), so messages about either carry ``file:line:col``."""
    import yaml

    found = None
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return found
        for key_node, value_node in node.value:
            if key_node.value == key or (not isinstance(key, str) and key_node.value == str(key)):
                found = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                node = value_node
                break
        else:
            return found
    return found
