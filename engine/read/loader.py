"""Policy files to the typed model: TOML, then the JSON Schema (:mod:`kvpolicy.read.schema`), then
semantic checks.

Every stage collects all of its problems before raising, so one run shows everything wrong with a
file. Problems carry ``file:line:col`` and a check id (``toml``, ``schema``, ``unknown-name``,
``cycle``, ``duplicate-id``, ``conflicting-rows``, ``placeholder``, ``version``) that the linter maps
to its rule codes.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import string
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
from .schema import schema, schema_bytes, schema_problems, shown_value
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
        problems = schema_problems(document)
        if problems:
            raise PolicyError(problems)
        _remember_document(raw, document)
    builder = _Builder(document)
    policy = builder.build()
    if builder.problems:
        raise PolicyError(sorted(builder.problems, key=lambda p: (p.location.line, p.location.column)))
    return policy


# -- documents parsed and checked before --------------------------------------------------------


def _document_key(raw: bytes) -> str:
    from ..version import __version__
    from . import cache

    return cache.document_key(raw, schema_bytes(), __version__)


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
        constraints = tuple(self._constraint(index, spec) for index, spec in enumerate(data.get("constraints", [])))
        checkpoint_rules = tuple(self._checkpoint_rule(index, spec) for index, spec in enumerate(data.get("checkpoint_rules", [])))
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
            self.problems.append(PolicyProblem(location, "duplicate-id", f"rule id {rule_id!r} is already used at {first}; rename one"))
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
            self.problem(base + ("auto",), "unknown-name", f"auto = {spec['auto']!r} must differ from the decided values")
        null_decides = spec.get("null") == "policy"
        if "null" in spec and not null_decides and spec["null"] not in values:
            self.problem(
                base + ("null",),
                "unknown-name",
                f'null = {spec["null"]!r} is not one of this decision\'s values ({", ".join(values)}) nor "policy" (null is a request the policy decides)',
            )
        omitted = None
        if "omitted" in spec:
            spec_omitted = spec["omitted"]
            if spec_omitted["value"] != spec["auto"] and spec_omitted["value"] not in values:
                self.problem(
                    base + ("omitted", "value"),
                    "unknown-name",
                    f"omitted value {spec_omitted['value']!r} is neither auto ({spec['auto']!r}) nor one of this decision's values ({', '.join(values)})",
                )
            omitted = Omitted(
                value=spec_omitted["value"],
                reason=spec_omitted["reason"],
                source=spec_omitted["source"],
                location=self.doc.locate(base + ("omitted",)),
            )
        scope = set(inputs)
        requirements = tuple(
            self._rule(name, "requirement", base + ("requirement", i), r, values, scope, order=i) for i, r in enumerate(spec.get("requirement", []))
        )
        conditionals = tuple(
            self._rule(name, "conditional", base + ("conditional", i), r, values, scope, order=i) for i, r in enumerate(spec.get("conditional", []))
        )
        default = self._rule(name, "default", base + ("default",), spec["default"], values, scope)
        # Adjustments run once every decision is made, so they may read all of them.
        adjustments = tuple(
            self._rule(name, "adjustment", base + ("adjustment", i), r, values, set(self.declared), order=i) for i, r in enumerate(spec.get("adjustment", []))
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
            stage=stage,  # type: ignore[arg-type]  # one of the schema's stage names, as the callers pass
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
                    f"{row.architecture} is listed twice with different values ({first.value} at {first.location}, {row.value} here); keep one row",
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
                    f"placeholder {shown_value(shown)} is not a plain {{name}}: messages take no format spec, "
                    "conversion, attribute or index; write {name} (or {{ and }} for braces)",
                )
                continue
            fields.append(name)
        for name in fields:
            if name not in PLACEHOLDERS:
                self.problem(
                    path,
                    "placeholder",
                    f"unknown placeholder {{{name}}}{suggest(name, PLACEHOLDERS)} (known: {', '.join(sorted(PLACEHOLDERS))})",
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
