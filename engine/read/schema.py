"""The policy format's JSON Schema, and the check of a document against it.

``policies/policy.schema.json`` is the published contract, and jsonschema gives the verdict and the
messages. Importing jsonschema is slow, and checking 100,000 preference rows through it resolves
``$ref`` once per row, so the schema is also compiled here into plain predicates
(:func:`compiled_document_validator`, :func:`compiled_row_validator`) that never accept a document
jsonschema refuses: a document the whole-schema predicate accepts is valid without jsonschema; one it
refuses goes to jsonschema, its valid rows cut short (:func:`schema_problems`).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from ..errors import PolicyProblem
from ..wording import suggest
from .policyfile import MAX_POLICY_BYTES, shipped_root

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .source import SourceDocument

__all__ = [
    "compiled_document_validator",
    "compiled_row_validator",
    "schema",
    "schema_bytes",
    "schema_problems",
    "shown_value",
]


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema of the policy format (shipped as ``policies/policy.schema.json``)."""
    return json.loads((shipped_root() / "policy.schema.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(schema())


@lru_cache(maxsize=1)
def schema_bytes() -> bytes:
    """The schema file's bytes (part of the key of every document :mod:`kvpolicy.read.cache` keeps)."""
    return (shipped_root() / "policy.schema.json").read_bytes()


def schema_problems(document: SourceDocument, *, compiled_rows: bool = True) -> list[PolicyProblem]:
    """Every schema problem of a document. With ``compiled_rows``, preference rows are checked by
    a validator compiled from the schema's ``row`` definition (see :func:`compiled_row_validator`)
    and only the rest goes through jsonschema: the verdict and every message are the same
    (property-tested), without resolving ``$ref`` once per row."""
    if compiled_rows:
        accept = compiled_document_validator()
        if accept is not None and accept(document.data):
            return []
    problems = []
    data = _without_valid_rows(document.data) if compiled_rows else document.data
    for error in _validator().iter_errors(data):
        path = tuple(error.absolute_path)
        message = _schema_message(error)
        if error.validator == "additionalProperties":
            extra = _extra_keys(error)
            location = document.locate(path + (extra[0],)) if extra else document.locate(path)
        else:
            location = document.locate(path)
        problems.append(PolicyProblem(location, "schema", message))
    problems.sort(key=lambda p: (p.location.line, p.location.column, p.message))
    return problems


# -- the compiled row validator ---------------------------------------------------------------------

#: Annotations a compiled validator may ignore: they never change a verdict.
_ANNOTATIONS = frozenset({"description", "title", "$comment", "examples", "default", "$schema", "$id", "$defs"})

#: JSON Schema ``type`` names -> the check jsonschema makes (a bool is neither integer nor number;
#: an integral float is an integer).
_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def _compile_schema(node: Any, defs: dict[str, Any], compiled_defs: dict[str, Callable[[Any], bool] | None] | None = None) -> Callable[[Any], bool] | None:
    """A predicate that is true only where jsonschema's verdict on ``node`` is "valid", for the
    keywords the policy schema uses (``$ref`` to ``#/$defs/``, ``type``, ``properties``,
    ``required``, ``additionalProperties: false``, ``pattern``, ``minLength``, ``maxLength``,
    ``enum`` and ``const`` of strings, ``items``, ``minItems``, ``maxItems``, ``uniqueItems``,
    ``maxProperties``, ``propertyNames``, ``oneOf`` of branches of distinct types); None when
    ``node`` uses any other keyword, so the caller falls back to jsonschema.

    A false answer is never final: the caller then asks jsonschema (for the verdict and the
    messages), so where exactness would cost (``uniqueItems`` over values that are not strings)
    the predicate may say "no"; it must never say "yes" to a document jsonschema refuses."""
    if not isinstance(node, dict):
        return None
    if compiled_defs is None:
        compiled_defs = {}
    # Each check is called with one value; its other parameters only bind values as defaults, which
    # a one-argument Callable cannot express (mypy cannot infer such a lambda against it).
    checks: list[Callable[..., bool]] = []
    for keyword, argument in node.items():
        if keyword in _ANNOTATIONS:
            continue
        if keyword == "$ref":
            prefix = "#/$defs/"
            if not isinstance(argument, str) or not argument.startswith(prefix) or argument[len(prefix) :] not in defs:
                return None
            name = argument[len(prefix) :]
            if name not in compiled_defs:
                compiled_defs[name] = None  # a recursive reference resolves through the table below
                compiled_defs[name] = _compile_schema(defs[name], defs, compiled_defs)
                if compiled_defs[name] is None:
                    return None
            done = compiled_defs[name]
            if done is not None:  # compiled already: call it directly
                checks.append(done)
            else:  # a recursive reference: through the table, filled once its definition is compiled
                checks.append(lambda v, name=name, table=compiled_defs: table[name](v))
        elif keyword == "type" and isinstance(argument, str) and argument in _TYPES:
            checks.append(_TYPES[argument])
        elif keyword == "pattern" and isinstance(argument, str):
            search = re.compile(argument).search
            checks.append(lambda v, search=search: not isinstance(v, str) or search(v) is not None)
        elif keyword in ("minLength", "maxLength") and type(argument) is int:
            if keyword == "minLength":
                checks.append(lambda v, n=argument: not isinstance(v, str) or len(v) >= n)
            else:
                checks.append(lambda v, n=argument: not isinstance(v, str) or len(v) <= n)
        elif keyword == "enum" and isinstance(argument, list) and all(isinstance(a, str) for a in argument):
            options = frozenset(argument)
            checks.append(lambda v, options=options: isinstance(v, str) and v in options)
        elif keyword == "const" and isinstance(argument, str):
            checks.append(lambda v, wanted=argument: isinstance(v, str) and v == wanted)
        elif keyword == "const" and type(argument) is int:  # (1.0 is also 1 to jsonschema: left to it)
            checks.append(lambda v, wanted=argument: type(v) is int and v == wanted)
        elif keyword == "required" and isinstance(argument, list):
            names = tuple(argument)
            checks.append(lambda v, names=names: not isinstance(v, dict) or all(n in v for n in names))
        elif keyword == "additionalProperties" and argument is False and "patternProperties" not in node:
            allowed = frozenset(node.get("properties", {}))
            checks.append(lambda v, allowed=allowed: not isinstance(v, dict) or allowed.issuperset(v))
        elif keyword == "additionalProperties" and isinstance(argument, dict) and "patternProperties" not in node:
            check = _compile_schema(argument, defs, compiled_defs)
            if check is None:
                return None
            named = frozenset(node.get("properties", {}))
            checks.append(lambda v, named=named, check=check: not isinstance(v, dict) or all(check(item) for key, item in v.items() if key not in named))
        elif keyword == "properties" and isinstance(argument, dict):
            compiled = {}
            for name, sub in argument.items():
                check = _compile_schema(sub, defs, compiled_defs)
                if check is None:
                    return None
                compiled[name] = check
            checks.append(_properties(tuple(compiled.items())))
        elif keyword == "items" and isinstance(argument, dict) and "prefixItems" not in node:
            check = _compile_schema(argument, defs, compiled_defs)
            if check is None:
                return None
            checks.append(lambda v, check=check: not isinstance(v, list) or all(map(check, v)))
        elif keyword in ("minItems", "maxItems", "maxProperties") and type(argument) is int:
            kind = dict if keyword == "maxProperties" else list
            if keyword == "minItems":
                checks.append(lambda v, n=argument: not isinstance(v, list) or len(v) >= n)
            else:
                checks.append(lambda v, n=argument, kind=kind: not isinstance(v, kind) or len(v) <= n)
        elif keyword == "uniqueItems" and isinstance(argument, bool):
            if argument:  # strings only: anything else is left to jsonschema ("no" is never final)
                checks.append(lambda v: not isinstance(v, list) or (all(isinstance(x, str) for x in v) and len(set(v)) == len(v)))
        elif keyword == "propertyNames":
            check = _compile_schema(argument, defs, compiled_defs)
            if check is None:
                return None
            checks.append(lambda v, check=check: not isinstance(v, dict) or all(map(check, v)))
        elif keyword == "oneOf" and isinstance(argument, list) and argument:
            # Exactly one branch: with branches of pairwise distinct types (never integer and
            # number together) at most one can hold, so "exactly one" is "any", and a branch
            # that wrongly says "no" only sends the document to jsonschema.
            kinds = [_declared_type(branch, defs) for branch in argument]
            if any(k not in _TYPES for k in kinds) or len(set(kinds)) != len(kinds) or {"integer", "number"} <= set(kinds):
                return None
            branches = [_compile_schema(branch, defs, compiled_defs) for branch in argument]
            if any(b is None for b in branches):
                return None
            options_t = tuple(branches)
            checks.append(lambda v, options=options_t: any(b(v) for b in options))
        else:
            return None
    return _all_of(checks)


def _all_of(checks: list[Callable[[Any], bool]]) -> Callable[[Any], bool]:
    """A predicate true where every one of ``checks`` is (short-circuit, in order). Spelled out for
    the common counts: a generator per value is most of the cost of checking 100,000 rows."""
    if not checks:
        return lambda v: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        a, b = checks
        return lambda v: a(v) and b(v)
    if len(checks) == 3:
        a, b, c = checks
        return lambda v: a(v) and b(v) and c(v)
    if len(checks) == 4:
        a, b, c, d = checks
        return lambda v: a(v) and b(v) and c(v) and d(v)
    checks_t = tuple(checks)

    def every(v: Any) -> bool:
        for check in checks_t:
            if not check(v):
                return False
        return True

    return every


def _properties(items: tuple[tuple[str, Callable[[Any], bool]], ...]) -> Callable[[Any], bool]:
    """``properties``: each named property that is present satisfies its check."""

    def check_properties(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        for name, check in items:
            if name in v and not check(v[name]):
                return False
        return True

    return check_properties


def _declared_type(node: Any, defs: dict[str, Any]) -> str | None:
    """The single ``type`` a schema node requires, following ``$ref`` (None: none or several)."""
    for _ in range(16):
        if not isinstance(node, dict):
            return None
        if isinstance(node.get("type"), str):
            return node["type"]
        ref = node.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            return None
        node = defs.get(ref[len("#/$defs/") :])
    return None


@lru_cache(maxsize=1)
def compiled_document_validator() -> Callable[[Any], bool] | None:
    """The whole schema compiled to a predicate (see :func:`_compile_schema`), or None when it
    uses a keyword the compiler does not know. A document it accepts is valid without importing
    jsonschema; one it refuses goes to jsonschema, for the verdict and every message."""
    spec = schema()
    return _compile_schema(spec, spec.get("$defs", {}))


@lru_cache(maxsize=1)
def compiled_row_validator() -> tuple[Callable[[Any], bool], int] | None:
    """The schema's preference ``row`` definition compiled to a predicate, and the most rows a
    preference may have; None when the schema is not shaped as this fast path expects (then every
    document goes through jsonschema whole). The JSON Schema stays the published contract."""
    spec = schema()
    defs = spec.get("$defs", {})
    decision = defs.get("decision", {}).get("properties", {}).get("preference", {})
    rows = defs.get("preference", {}).get("properties", {}).get("rows", {})
    decisions = spec.get("properties", {}).get("decisions", {})
    if decision.get("$ref") != "#/$defs/preference" or set(decision) - _ANNOTATIONS - {"$ref"}:
        return None
    if any(sub != {"$ref": "#/$defs/decision"} for sub in decisions.get("properties", {}).values()):
        return None
    if set(rows) - _ANNOTATIONS - {"type", "items", "maxItems"} or rows.get("type") != "array":
        return None
    check = _compile_schema(rows.get("items"), defs)
    if check is None:
        return None
    return check, int(rows.get("maxItems", MAX_POLICY_BYTES))


def _without_valid_rows(data: Any) -> Any:
    """``data`` with every preference whose rows are all valid cut to its first row (copies only
    along the way; ``data`` is untouched). A preference with an invalid row keeps every row, so
    jsonschema reports it exactly as before, at the same path."""
    compiled = compiled_row_validator()
    if compiled is None or not isinstance(data, dict) or not isinstance(data.get("decisions"), dict):
        return data
    check, most = compiled
    decisions = dict(data["decisions"])
    for name, spec in decisions.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("preference"), dict):
            continue
        rows = spec["preference"].get("rows")
        if isinstance(rows, list) and len(rows) > 1 and len(rows) <= most and all(map(check, rows)):
            decisions[name] = {**spec, "preference": {**spec["preference"], "rows": rows[:1]}}
    return {**data, "decisions": decisions}


#: Unknown keys of one table named in a message; the rest are counted.
_NAMED_UNKNOWN_KEYS = 10


def _extra_keys(error: Any) -> list[str]:
    allowed = set(error.schema.get("properties", {}))
    return sorted(k for k in error.instance if k not in allowed) if isinstance(error.instance, dict) else []


def _schema_message(error: Any) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "the top level"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = _extra_keys(error)
        # A hostile file may hold a million unknown keys: name (and look up suggestions for) the
        # first few only, so that the message, and the time it takes, stay bounded.
        parts = [f"unknown key {key!r} in {where}{suggest(key, allowed)}" for key in extra[:_NAMED_UNKNOWN_KEYS]]
        if len(extra) > _NAMED_UNKNOWN_KEYS:
            parts.append(f"and {len(extra) - _NAMED_UNKNOWN_KEYS:,} more unknown keys in {where}")
        return "; ".join(parts) + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    if error.validator == "required":
        return f"{where}: {error.message}; add it"
    if error.validator == "oneOf":
        return f"{where}: {shown_value(error.instance)} is not a value, a list of values or {{ not = ... }}"
    if error.validator in {"enum", "const"}:
        options = error.validator_value if error.validator == "enum" else [error.validator_value]
        return f"{where}: {shown_value(error.instance)} is not one of {', '.join(map(repr, options))}"
    if error.validator == "pattern":
        description = error.schema.get("description", f"it must match {error.validator_value}")
        return f"{where}: {shown_value(error.instance)} is not valid: {description}"
    if error.validator in {"maxItems", "maxProperties", "minItems", "minProperties", "maxLength", "minLength"}:
        size = len(error.instance) if hasattr(error.instance, "__len__") else "?"
        bound = "at most" if error.validator.startswith("max") else "at least"
        return f"{where}: has {size} entries; {bound} {error.validator_value} allowed"
    if error.validator == "type":
        return f"{where}: expected {error.validator_value}, got {shown_value(error.instance)}"
    return f"{where}: {error.message}"


def shown_value(value: Any) -> str:
    """A value as a message shows it: a string quoted, anything else as JSON, cut to 60 characters."""
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
