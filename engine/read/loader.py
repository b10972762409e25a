"""Policy files to the typed model: TOML, then the JSON Schema, then semantic checks.

Every stage collects all of its problems before raising, so one run shows everything wrong with a
file. Problems carry ``file:line:col`` and a check id (``toml``, ``schema``, ``unknown-name``,
``cycle``, ``duplicate-id``, ``conflicting-rows``, ``placeholder``, ``version``) that the linter maps
to its rule codes.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import string
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import PolicyError, PolicyProblem
from ..wording import suggest
from .policyfile import CASES_SUFFIX, MAX_POLICY_BYTES, display_path, policy_files, read_policy_bytes, shipped_root, version_key
from .fields import DATED_FIELDS
from .model import (
    DECISIONS,
    Condition,
    CheckpointRule,
    Constraint,
    Decision,
    Feature,
    Matcher,
    Notice,
    Omitted,
    Policy,
    Preference,
    Row,
    Rule,
    UpstreamBaseline,
)
from .source import Location, SourceDocument, TomlSyntaxError, parse_document

__all__ = [
    "CASES_SUFFIX",
    "CONFIG_FLAGS",
    "MAX_POLICY_BYTES",
    "display_path",
    "PLACEHOLDERS",
    "load_policy_file",
    "parse_policy",
    "policy_files",
    "schema",
    "shipped_root",
    "version_key",
]


#: The ``cache_transceiver_config`` fields a feature may be tied to (``config_field``): the dated ones.
CONFIG_FLAGS = DATED_FIELDS

#: Names a notice or constraint message may use in ``{...}``.
PLACEHOLDERS = frozenset({*DECISIONS, "architecture", "model_type", "kv_transfer_timeout_ms", "preferred"})

#: A placeholder is a bare name: no format spec (``{x:>99999999}`` would write 100 MB), no
#: conversion, no attribute or index.
_PLACEHOLDER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_CONTEXT_SUBJECTS = frozenset({"architecture", "model_type"})


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema of the policy format (shipped as ``policies/policy.schema.json``)."""
    return json.loads((shipped_root() / "policy.schema.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(schema())


def load_policy_file(path: Path, *, root: Path | None = None) -> Policy:
    """Read, parse and check one policy file; raise :class:`PolicyError` listing every problem.

    ``root`` is the policy folder the file was found in (default: the file's folder); see
    :func:`kvpolicy.read.policyfile.read_policy_bytes` for what is refused before parsing."""
    shown = display_path(path)
    return parse_policy(read_policy_bytes(path, shown, root=root), shown)


def parse_policy(raw: bytes, path: str) -> Policy:
    """Parse and check policy bytes; ``path`` names the file in messages.

    Policy files are data only: nothing in them is executed, they include nothing, and their
    size is bounded (``MAX_POLICY_BYTES`` here, row and rule counts in the schema).
    """
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(
            PolicyProblem(
                Location(path),
                "size",
                f"the file is {len(raw):,} bytes; policy files are limited to {MAX_POLICY_BYTES:,} bytes",
            )
        )
    document = _cached_document(raw, path)
    if document is None:
        try:
            document = parse_document(raw, path)
        except TomlSyntaxError as exc:
            raise PolicyError(PolicyProblem(exc.location, exc.check, exc.reason)) from None
        problems = _schema_problems(document)
        if problems:
            raise PolicyError(problems)
        _remember_document(raw, document)
    builder = _Builder(document)
    policy = builder.build()
    if builder.problems:
        raise PolicyError(sorted(builder.problems, key=lambda p: (p.location.line, p.location.column)))
    return policy


# -- schema ------------------------------------------------------------------------------------


def _document_key(raw: bytes) -> str:
    from ..version import __version__
    from . import cache

    return cache.document_key(raw, _schema_bytes(), __version__)


def _cached_document(raw: bytes, path: str) -> SourceDocument | None:
    """The document of bytes that parsed and passed the same schema before under the same
    kvpolicy version (see :mod:`kvpolicy.read.cache`), without parsing or validating them again:
    jsonschema is then not even imported. None on a miss."""
    from . import cache

    if cache.cache_dir() is None:  # caching is off: not even the key (a SHA-256 of the file) is needed
        return None
    found = cache.cached_document(_document_key(raw))
    if found is None:
        return None
    data, positions, inline = found
    text = raw.decode("utf-8")
    source_map = None
    if inline:  # the rows' keys, located when something asks, as after parsing
        from .scan import SourceMap

        source_map = SourceMap()
        source_map.text, source_map.positions, source_map.inline = text, positions, inline
    return SourceDocument(path=path, raw=raw, text=text, data=data, positions=positions, source_map=source_map)


def _remember_document(raw: bytes, document: SourceDocument) -> None:
    from . import cache

    if cache.cache_dir() is None:  # caching is off: the source map stays as lazy as it is
        return
    positions, inline = document.recorded_map()
    cache.remember_document(_document_key(raw), document.data, positions, inline)


@lru_cache(maxsize=1)
def _schema_bytes() -> bytes:
    return (shipped_root() / "policy.schema.json").read_bytes()


def _schema_problems(document: SourceDocument, *, compiled_rows: bool = True) -> list[PolicyProblem]:
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


def _compile_schema(
    node: Any, defs: dict[str, Any], compiled_defs: dict[str, Callable[[Any], bool] | None] | None = None
) -> Callable[[Any], bool] | None:
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
            if not isinstance(argument, str) or not argument.startswith(prefix) or argument[len(prefix):] not in defs:
                return None
            name = argument[len(prefix):]
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
            checks.append(
                lambda v, named=named, check=check: not isinstance(v, dict)
                or all(check(item) for key, item in v.items() if key not in named)
            )
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
                checks.append(
                    lambda v: not isinstance(v, list) or (all(isinstance(x, str) for x in v) and len(set(v)) == len(v))
                )
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
        node = defs.get(ref[len("#/$defs/"):])
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
        return f"{where}: {_short(error.instance)} is not a value, a list of values or {{ not = ... }}"
    if error.validator in {"enum", "const"}:
        options = error.validator_value if error.validator == "enum" else [error.validator_value]
        return f"{where}: {_short(error.instance)} is not one of {', '.join(map(repr, options))}"
    if error.validator == "pattern":
        description = error.schema.get("description", f"it must match {error.validator_value}")
        return f"{where}: {_short(error.instance)} is not valid: {description}"
    if error.validator in {"maxItems", "maxProperties", "minItems", "minProperties", "maxLength", "minLength"}:
        size = len(error.instance) if hasattr(error.instance, "__len__") else "?"
        bound = "at most" if error.validator.startswith("max") else "at least"
        return f"{where}: has {size} entries; {bound} {error.validator_value} allowed"
    if error.validator == "type":
        return f"{where}: expected {error.validator_value}, got {_short(error.instance)}"
    return f"{where}: {error.message}"


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- model -------------------------------------------------------------------------------------


class _Builder:
    """Turns schema-valid data into the typed model, collecting every semantic problem."""

    def __init__(self, document: SourceDocument) -> None:
        self.doc = document
        self.data = document.data
        self.problems: list[PolicyProblem] = []
        self._ids: dict[str, Location] = {}

    def problem(self, path: tuple[Any, ...], check: str, message: str) -> None:
        self.problems.append(PolicyProblem(self.doc.locate(path), check, message))

    def build(self) -> Policy:
        data = self.data
        self._check_version(data["version"])
        features = {
            name: Feature(
                name=name,
                description=spec.get("description", ""),
                env=spec.get("env"),
                config_field=spec.get("config_field"),
                location=self.doc.locate(("features", name)),
            )
            for name, spec in data["features"].items()
        }
        for feature in features.values():
            if feature.config_field and feature.config_field not in CONFIG_FLAGS:
                self.problem(
                    ("features", feature.name, "config_field"),
                    "unknown-name",
                    f"config_field {feature.config_field!r} is not a cache_transceiver_config flag "
                    f"field{suggest(feature.config_field, CONFIG_FLAGS)} (known: {', '.join(sorted(CONFIG_FLAGS))})",
                )
        self.features = features
        self.declared = data["decisions"]
        decisions = {name: self._decision(name, spec) for name, spec in self.declared.items()}
        for name in DECISIONS:
            if name not in decisions:
                self.problem(("decisions",), "unknown-name", f"decision {name!r} is missing; declare [decisions.{name}]")
        self._check_cycles(decisions)
        constraints = tuple(
            self._constraint(index, spec) for index, spec in enumerate(data.get("constraints", []))
        )
        checkpoint_rules = tuple(
            self._checkpoint_rule(index, spec) for index, spec in enumerate(data.get("checkpoint_rules", []))
        )
        return Policy(
            schema_version=data["schema"],
            version=data["version"],
            summary=data["summary"],
            source=data["source"],
            path=self.doc.path,
            digest=hashlib.sha256(self.doc.raw).hexdigest(),
            features=features,
            decisions=decisions,
            constraints=constraints,
            checkpoint_rules=checkpoint_rules,
            upstream=self._upstream(data.get("upstream")),
        )

    # -- pieces --

    def _upstream(self, spec: dict[str, Any] | None) -> UpstreamBaseline | None:
        if spec is None:
            return None
        return UpstreamBaseline(
            read=spec["read"],
            env=tuple(spec["env"]),
            fingerprints=dict(spec["fingerprints"]),
            location=self.doc.locate(("upstream",)),
        )

    def _check_version(self, version: str) -> None:
        """The schema checks the shape YYYY.MM.DD; here, that it is a real date."""
        year, month, day = (int(part) for part in version.split(".")[:3])
        try:
            datetime.date(year, month, day)
        except ValueError as exc:
            self.problem(("version",), "schema", f"version {version} is not a date (YYYY.MM.DD): {exc}")

    def _claim(self, rule_id: str, path: tuple[Any, ...]) -> None:
        location = self.doc.locate(path)
        first = self._ids.get(rule_id)
        if first is not None:
            self.problems.append(
                PolicyProblem(location, "duplicate-id", f"rule id {rule_id!r} is already used at {first}; rename one")
            )
        else:
            self._ids[rule_id] = location

    def _decision(self, name: str, spec: dict[str, Any]) -> Decision:
        base = ("decisions", name)
        values = tuple(spec["values"])
        inputs = tuple(spec.get("inputs", ()))
        for index, other in enumerate(inputs):
            if other not in self.declared:
                self.problem(
                    base + ("inputs", index),
                    "unknown-name",
                    f"input {other!r} is not a decision{suggest(other, self.declared)}",
                )
            elif other == name:
                self.problem(base + ("inputs", index), "cycle", f"decision {name!r} cannot read itself")
        if spec["auto"] in values:
            self.problem(
                base + ("auto",), "unknown-name", f"auto = {spec['auto']!r} must differ from the decided values"
            )
        null_decides = spec.get("null") == "policy"
        if "null" in spec and not null_decides and spec["null"] not in values:
            self.problem(
                base + ("null",),
                "unknown-name",
                f"null = {spec['null']!r} is not one of this decision's values ({', '.join(values)}) "
                'nor "policy" (null is a request the policy decides)',
            )
        omitted = None
        if "omitted" in spec:
            spec_omitted = spec["omitted"]
            if spec_omitted["value"] != spec["auto"] and spec_omitted["value"] not in values:
                self.problem(
                    base + ("omitted", "value"),
                    "unknown-name",
                    f"omitted value {spec_omitted['value']!r} is neither auto ({spec['auto']!r}) nor one of "
                    f"this decision's values ({', '.join(values)})",
                )
            omitted = Omitted(
                value=spec_omitted["value"], reason=spec_omitted["reason"], source=spec_omitted["source"],
                location=self.doc.locate(base + ("omitted",)),
            )
        scope = set(inputs)
        requirements = tuple(
            self._rule(name, "requirement", base + ("requirement", i), r, values, scope, order=i)
            for i, r in enumerate(spec.get("requirement", []))
        )
        conditionals = tuple(
            self._rule(name, "conditional", base + ("conditional", i), r, values, scope, order=i)
            for i, r in enumerate(spec.get("conditional", []))
        )
        default = self._rule(name, "default", base + ("default",), spec["default"], values, scope)
        # Adjustments run once every decision is made, so they may read all of them.
        adjustments = tuple(
            self._rule(name, "adjustment", base + ("adjustment", i), r, values, set(self.declared), order=i)
            for i, r in enumerate(spec.get("adjustment", []))
        )
        preference = None
        if "preference" in spec:
            preference = self._preference(name, spec["preference"], values, scope)
        return Decision(
            name=name,
            description=spec.get("description", ""),
            values=values,
            auto=spec["auto"],
            null=None if null_decides else spec.get("null"),
            null_decides=null_decides,
            omitted=omitted,
            inputs=inputs,
            requirements=requirements,
            preference=preference,
            conditionals=conditionals,
            default=default,
            adjustments=adjustments,
            location=self.doc.locate(base),
        )

    def _rule(
        self,
        decision: str,
        stage: str,
        path: tuple[Any, ...],
        spec: dict[str, Any],
        values: tuple[str, ...],
        scope: set[str],
        order: int = 0,
    ) -> Rule:
        self._claim(spec["id"], path + ("id",))
        self._check_value(spec["value"], values, path + ("value",), decision)
        when = self._condition(spec.get("when", {}), path + ("when",), scope)
        return Rule(
            id=spec["id"],
            decision=decision,
            stage=stage,  # type: ignore[arg-type]
            when=when,
            value=spec["value"],
            notice=self._notice(spec.get("notice"), path + ("notice",), spec["id"]),
            reason=spec.get("reason"),
            source=spec.get("source"),
            location=self.doc.locate(path),
            path=path,
            order=order,
        )

    def _preference(self, decision: str, spec: dict[str, Any], values: tuple[str, ...], scope: set[str]) -> Preference:
        path = ("decisions", decision, "preference")
        self._claim(spec["id"], path + ("id",))
        rows = []
        seen: dict[tuple[str, str | None], Row] = {}
        table_id = spec["id"]
        locate = self.doc.locate
        # Up to 100,000 rows: the loop makes no more objects than the row needs.
        for index, row_spec in enumerate(spec["rows"]):
            row_path = path + ("rows", index)
            value = row_spec["value"]
            if values and value not in values:
                self._check_value(value, values, row_path + ("value",), decision)
            model_type = row_spec.get("model_type")
            architecture = row_spec["architecture"]
            row = Row(
                id=f"{table_id}[{architecture}]" if model_type is None else f"{table_id}[{architecture},model_type={model_type}]",
                architecture=architecture,
                model_type=model_type,
                value=value,
                reason=row_spec.get("reason"),
                source=row_spec.get("source"),
                location=locate(row_path),
                path=row_path,
            )
            key = (row.architecture, row.model_type)
            first = seen.get(key)
            if first is not None and first.value != row.value:
                self.problem(
                    row_path,
                    "conflicting-rows",
                    f"{row.architecture} is listed twice with different values ({first.value} at "
                    f"{first.location}, {row.value} here); keep one row",
                )
            seen.setdefault(key, row)
            rows.append(row)
        return Preference(
            id=spec["id"],
            decision=decision,
            adopt_when=self._condition(spec.get("adopt_when", {}), path + ("adopt_when",), scope),
            on_not_adopted=self._notice(spec.get("on_not_adopted"), path + ("on_not_adopted",), spec["id"]),
            rows=tuple(rows),
            reason=spec.get("reason"),
            source=spec.get("source"),
            location=self.doc.locate(path),
        )

    def _constraint(self, index: int, spec: dict[str, Any]) -> Constraint:
        path = ("constraints", index)
        self._claim(spec["id"], path + ("id",))
        decision = spec.get("decision")
        if decision is not None and decision not in self.declared:
            self.problem(
                path + ("decision",),
                "unknown-name",
                f"decision {decision!r} is not declared{suggest(decision, self.declared)}",
            )
        for key in ("message", "fix"):
            self._check_placeholders(spec[key], path + (key,))
        return Constraint(
            id=spec["id"],
            decision=decision,
            severity=spec["severity"],
            when=self._condition(spec["when"], path + ("when",), set(self.declared)),
            message=spec["message"],
            fix=spec["fix"],
            reason=spec.get("reason"),
            source=spec.get("source"),
            location=self.doc.locate(path),
            path=path,
        )

    def _checkpoint_rule(self, index: int, spec: dict[str, Any]) -> CheckpointRule:
        path = ("checkpoint_rules", index)
        self._claim(spec["id"], path + ("id",))
        return CheckpointRule(
            id=spec["id"],
            model_type=tuple(spec["model_type"]),
            multimodal=spec.get("multimodal"),
            architecture=spec["architecture"],
            reason=spec.get("reason"),
            source=spec.get("source"),
            location=self.doc.locate(path),
        )

    def _notice(self, spec: dict[str, Any] | None, path: tuple[Any, ...], rule_id: str) -> Notice | None:
        if spec is None:
            return None
        self._check_placeholders(spec["message"], path + ("message",))
        return Notice(
            id=spec.get("id", rule_id),
            severity=spec["severity"],
            message=spec["message"],
            location=self.doc.locate(path),
        )

    def _condition(self, spec: dict[str, Any], path: tuple[Any, ...], scope: set[str]) -> Condition:
        subjects: dict[str, Matcher] = {}
        requested: dict[str, Matcher] = {}
        for key, raw in spec.get("requested", {}).items():
            matcher = _matcher(raw)
            decision = self.declared.get(key)
            if decision is None:
                self.problem(
                    path + ("requested", key),
                    "unknown-name",
                    f"requested.{key}: {key!r} is not a decision{suggest(key, self.declared)}",
                )
            else:
                known = (decision["auto"], *(("null",) if decision.get("null") == "policy" else ()), *decision["values"])
                for value in sorted(matcher.values):
                    self._check_value(value, known, path + ("requested", key), f"requested {key}")
            requested[key] = matcher
        for key, raw in spec.items():
            if key in ("kv_transfer_timeout_ms", "features", "env", "requested"):
                continue
            matcher = _matcher(raw)
            if key in DECISIONS:
                if key not in scope:
                    self.problem(
                        path + (key,),
                        "unknown-name",
                        f"this rule reads decision {key!r}; add it to the decision's inputs",
                    )
                known = self.declared.get(key, {}).get("values", ())
                for value in sorted(matcher.values):
                    self._check_value(value, tuple(known), path + (key,), key)
            subjects[key] = matcher
        for feature in spec.get("features", {}):
            if feature not in self.features:
                self.problem(
                    path + ("features", feature),
                    "unknown-name",
                    f"feature {feature!r} is not declared in [features]{suggest(feature, self.features)}",
                )
        return Condition(
            subjects=subjects,
            timeout=spec.get("kv_transfer_timeout_ms"),
            features=dict(spec.get("features", {})),
            env={name: _matcher(raw) for name, raw in spec.get("env", {}).items()},
            requested=requested,
        )

    def _check_value(self, value: str, values: tuple[str, ...], path: tuple[Any, ...], decision: str) -> None:
        if values and value not in values:
            self.problem(
                path,
                "unknown-name",
                f"{value!r} is not a value of {decision}{suggest(value, values)} (values: {', '.join(values)})",
            )

    def _check_placeholders(self, text: str, path: tuple[Any, ...]) -> None:
        try:
            parsed = [(f, spec, conversion) for _, f, spec, conversion in string.Formatter().parse(text) if f is not None]
        except ValueError as exc:
            self.problem(path, "placeholder", f"bad placeholder syntax: {exc}; write {{{{ and }}}} for braces")
            return
        fields = []
        for name, spec, conversion in parsed:
            if spec or conversion or not _PLACEHOLDER_NAME.fullmatch(name):
                shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                self.problem(
                    path,
                    "placeholder",
                    f"placeholder {_short(shown)} is not a plain {{name}}: messages take no format spec, "
                    "conversion, attribute or index; write {name} (or {{ and }} for braces)",
                )
                continue
            fields.append(name)
        for name in fields:
            if name not in PLACEHOLDERS:
                self.problem(
                    path,
                    "placeholder",
                    f"unknown placeholder {{{name}}}{suggest(name, PLACEHOLDERS)} "
                    f"(known: {', '.join(sorted(PLACEHOLDERS))})",
                )

    def _check_cycles(self, decisions: dict[str, Decision]) -> None:
        state: dict[str, int] = {}

        def visit(name: str, trail: list[str]) -> None:
            if state.get(name) == 2 or name not in decisions:
                return
            if state.get(name) == 1:
                loop = trail[trail.index(name) :] + [name]
                self.problem(
                    ("decisions", name, "inputs"),
                    "cycle",
                    f"decision inputs form a cycle: {' -> '.join(loop)}; remove one of these inputs",
                )
                return
            state[name] = 1
            for other in decisions[name].inputs:
                if other != name:
                    visit(other, trail + [name])
            state[name] = 2

        for name in sorted(decisions):
            visit(name, [])


def _matcher(raw: Any) -> Matcher:
    if isinstance(raw, dict):
        inner = raw["not"]
        return Matcher(values=frozenset([inner] if isinstance(inner, str) else inner), negate=True)
    return Matcher(values=frozenset([raw] if isinstance(raw, str) else raw))
