"""A normalised fingerprint of a function's logic.

The rules kvpolicy models are code upstream (the auto resolvers, the fallback reasons, the start-up
validators, the checkpoint loader's predicates). A policy version records a fingerprint of each such
function as it was in the upstream state the version models; a different fingerprint in a tree means
"a person must re-read this function".

The fingerprint hashes the function's syntax tree without positions, so comments, blank lines,
formatting and quoting never move it; docstrings and other bare string statements are dropped too.
Anything that changes what the code does (a comparison, a constant, a call, a name) moves it.

It is the same on every Python kvpolicy runs on: the tree is written out by this module (node names,
then each field that holds something, in the node's field order), not by ``ast.dump``, whose text
differs between Python versions; fields a newer Python added and left empty (``type_params``) and
ones that never change meaning (``type_comment``, a string's ``u`` prefix ``kind``) are skipped.
The walk keeps its own stack, so no nesting depth can make it fail.
"""

from __future__ import annotations

import ast
import hashlib

__all__ = ["fingerprint"]

_SKIPPED = frozenset({"type_params", "type_comment", "kind", "ctx"})


def _is_doc(stmt: ast.AST) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _write(root: object, out: list[str]) -> None:
    """The tree written out in prefix order, with an explicit stack: a hostile file nested
    thousands of levels deep costs time in proportion to its size, never a RecursionError."""
    stack: list[tuple[bool, object]] = [(False, root)]
    while stack:
        is_text, item = stack.pop()
        if is_text:
            out.append(item)  # type: ignore[arg-type]  # is_text marks the str leaves pushed below
            continue
        if isinstance(item, ast.AST):
            parts: list[tuple[bool, object]] = [(True, type(item).__name__ + "(")]
            for name in item._fields:
                if name in _SKIPPED:
                    continue
                value = getattr(item, name, None)
                if name in ("body", "orelse", "finalbody") and isinstance(value, list):
                    value = [s for s in value if not _is_doc(s)]
                if value is None or value == []:
                    continue
                parts += [(True, name + "="), (False, value), (True, ",")]
            parts.append((True, ")"))
            stack.extend(reversed(parts))
        elif isinstance(item, list):
            parts = [(True, "[")]
            for element in item:
                parts += [(False, element), (True, ",")]
            parts.append((True, "]"))
            stack.extend(reversed(parts))
        else:
            out.append(f"{type(item).__name__}:{item!r}")


def fingerprint(node: ast.AST) -> str:
    """16 hex digits of SHA-256 over the node's position-free syntax tree, docstrings dropped."""
    out: list[str] = []
    _write(node, out)
    return hashlib.sha256("".join(out).encode("utf-8")).hexdigest()[:16]
