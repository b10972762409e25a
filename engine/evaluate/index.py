"""The decision index: a compiled policy as plain data, and what resolves contexts against it.

:func:`build_index` turns the typed model into lists, dicts, strings, numbers and booleans only
(JSON as it stands): every condition, requirement, preference row, notice, default, adjustment and
constraint, with the text its messages need and the ``file:line:col`` of each rule. A
:class:`DecisionIndex` is built from that data alone: it normalises contexts, generates the
straight-line evaluators (:mod:`kvpolicy.evaluate.compiler`) and formats diagnostics. It never touches the
model, so a policy whose index was stored by :mod:`kvpolicy.read.cache` resolves without importing
pydantic or jsonschema; the trace, lint and diff still use the model (:mod:`kvpolicy.evaluate.interpreter`).

Index data read back from the cache is untrusted: :func:`kvpolicy.evaluate.indexcheck.check_index`
checks its shape and types before anything is built from it, and the generated code never contains a
string from it (see :mod:`kvpolicy.evaluate.compiler`).
"""

from __future__ import annotations

from _string import formatter_parser  # what string.Formatter().parse calls
from collections.abc import Callable, Mapping
from types import MappingProxyType

from ..errors import ContextError
from ..read.fields import CACHE_TRANSCEIVER_FIELDS, DATED_FIELDS, MAPPING_FIELDS
from .resolution import Diagnostic

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING:
    from ..read.model import Condition, Notice, Policy, Rule

__all__ = [
    "CACHE_TRANSCEIVER_FIELDS",
    "CONTEXT_FIELDS",
    "FORMAT",
    "DecisionIndex",
    "build_index",
    "checkpoint_rule",
    "compile_message",
    "is_multimodal",
]

#: Bumped whenever the index data changes shape or meaning (part of the cache key).
FORMAT = 5

#: Context fields ``resolve`` accepts, besides the decisions' own fields and feature config flags.
CONTEXT_FIELDS = (
    "architecture",
    "pretrained_config",
    "kv_transfer_timeout_ms",
    "features",
    "env",
)
#: ``cache_transceiver_config`` fields that no rule reads; accepted so a whole config can be passed.
_PASSIVE_FIELDS = CACHE_TRANSCEIVER_FIELDS - {"backend", "transceiver_runtime", "kv_transfer_timeout_ms"} - DATED_FIELDS
#: Top-level keys of a TensorRT-LLM serving config (not context fields): a hint that the whole
#: config was passed to ``resolve``.
_SERVING_CONFIG_KEYS = frozenset({"cache_transceiver_config", "context_servers", "generation_servers", "model", "backend_config", "hostname", "port"})
_DEFAULT_TIMEOUT_MS = 60000
_NO_FEATURES: frozenset[str] = frozenset()
_NO_ENV: Mapping[str, str] = MappingProxyType({})
_SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
_NULL_REQUEST = "null"  # as model.NULL_REQUEST (not imported: the model pulls in pydantic)


# -- from the model --------------------------------------------------------------------------------


def _condition(condition: Condition) -> dict[str, Any]:
    return {
        "subjects": [[name, sorted(m.values), m.negate] for name, m in sorted(condition.subjects.items())],
        "requested": [[name, sorted(m.values), m.negate] for name, m in sorted(condition.requested.items())],
        "timeout": condition.timeout,
        "features": [[name, on] for name, on in sorted(condition.features.items())],
        "env": [[name, sorted(m.values), m.negate] for name, m in sorted(condition.env.items())],
    }


def _position(location: Any) -> str:
    """``line:column`` of a location. The file's name is not stored: messages name the file as
    the user named it in *this* run (relative to the working directory), so it is added when the
    index is used (:meth:`DecisionIndex.where`)."""
    return f"{location.line}:{location.column}"


def _notice(notice: Notice | None) -> list[str] | None:
    if notice is None:
        return None
    return [notice.id, notice.severity, _position(notice.location), notice.message]


def _rule(rule: Rule) -> dict[str, Any]:
    return {
        "id": rule.id,
        "value": rule.value,
        "when": _condition(rule.when),
        "text": str(rule.when),
        "reason": rule.reason,
        "location": _position(rule.location),
        "notice": _notice(rule.notice),
    }


def build_index(policy: Policy, order: list[str] | tuple[str, ...] | None = None) -> dict[str, Any]:
    """The decision index of a policy, as plain data (JSON-ready)."""
    decisions = []
    for name in order or policy.decision_order():
        decision = policy.decisions[name]
        preference = decision.preference
        rows: dict[str, Any] | None = None
        if preference is not None and preference.rows:
            plain: dict[str, list[str]] = {}
            qualified: dict[tuple[str, str], list[str]] = {}
            for row in preference.rows:  # the first of equal duplicates (the loader refuses conflicting ones)
                if row.model_type is None:
                    plain.setdefault(row.architecture, [row.value, row.id])
                else:
                    qualified.setdefault((row.architecture, row.model_type), [row.value, row.id])
            rows = {"plain": plain, "qualified": [[a, m, v, i] for (a, m), (v, i) in qualified.items()]}
        decisions.append(
            {
                "name": name,
                "auto": decision.auto,
                # What a context that leaves the field out requests (auto unless the policy says).
                "omitted": decision.left_out,
                "omitted_source": decision.omitted.source if decision.omitted is not None else None,
                "values": list(decision.values),
                "null": decision.null,
                "null_decides": decision.null_decides,
                # Sorted by id: agreeing requirements are all named (``a+b``), in an order that does
                # not depend on the file.
                "requirements": [_rule(r) for r in sorted(decision.requirements, key=lambda r: r.id)],
                "rows": rows,
                "adopt": _condition(preference.adopt_when) if preference is not None and rows else None,
                "on_not_adopted": _notice(preference.on_not_adopted) if preference is not None and rows else None,
                "conditionals": [_rule(r) for r in decision.conditionals],
                "default": _rule(decision.default),
                "adjustments": [_rule(r) for r in decision.adjustments],
            }
        )
    from .hints import known_env

    return {
        "format": FORMAT,
        "version": policy.version,
        "digest": policy.digest,
        "decisions": decisions,
        "constraints": [
            {
                "id": c.id,
                "severity": c.severity,
                "decision": c.decision,
                "location": _position(c.location),
                "message": c.message,
                "fix": c.fix,
                "when": _condition(c.when),
            }
            for c in sorted(policy.constraints, key=lambda c: c.id)
        ],
        "features": sorted(policy.features),
        "env_features": [[f.env, f.name] for f in policy.features.values() if f.env],
        "flag_features": [[f.config_field, f.name] for f in policy.features.values() if f.config_field],
        "architectures": policy.architectures(),
        "checkpoint_rules": [[r.id, sorted(r.model_type), r.multimodal, r.architecture, _position(r.location)] for r in policy.checkpoint_rules],
        "known_env": [[name, sorted(values)] for name, values in sorted(known_env(policy).items())],
    }


# -- resolving -------------------------------------------------------------------------------------


class Requirement(tuple):
    """A requirement as the generated code sees it: ``(id, value, notice, text, reason, location)``,
    read by position (the generated code and :meth:`DecisionIndex.settle` index it)."""

    __slots__ = ()


class DecisionIndex:
    """A policy's decision index, built from :func:`build_index` data: normalisation and
    diagnostics, with no reference to the typed model. What evaluates contexts against it is
    generated from it: :class:`kvpolicy.evaluate.compiler.CompiledIndex`."""

    def __init__(self, data: dict[str, Any], path: str) -> None:
        self.data = data
        self.path = path
        self.version: str = data["version"]
        self.digest: str = data["digest"]
        self.decisions: list[dict[str, Any]] = data["decisions"]
        self.order = tuple(d["name"] for d in self.decisions)
        self.decision_names = frozenset(self.order)
        self.features = frozenset(data["features"])
        self.default_timeout_ms = _DEFAULT_TIMEOUT_MS
        self._env_features = tuple((env, name) for env, name in data["env_features"])
        self._flag_features = {field: name for field, name in data["flag_features"]}
        self._known_fields = frozenset({*CONTEXT_FIELDS, *self.decision_names, *self._flag_features, *_PASSIVE_FIELDS})
        self._by_name = {d["name"]: d for d in self.decisions}
        self.named = frozenset(data["architectures"])
        self._models: tuple[tuple[str | None, str | None], ...] | None = None
        self._near_misses: dict[str, str | None] = {}
        self._requests = tuple((d["name"], d["omitted"], frozenset(self.requests(d["name"]))) for d in self.decisions)
        self._rank: dict[str | None, int] = {name: index for index, name in enumerate(self.order)}  # None: no decision
        self._order_key = self._sort_key(self._rank)
        self._renderers: dict[str, Callable[..., str]] = {}

    # -- per decision --

    def undecided(self, name: str) -> frozenset[str]:
        """The requests that leave decision ``name`` to the policy: auto, and null where it decides."""
        d = self._by_name[name]
        return frozenset((d["auto"], _NULL_REQUEST)) if d["null_decides"] else frozenset((d["auto"],))

    def requests(self, name: str) -> tuple[str, ...]:
        """Every value a context may request: auto first, then null where it decides, then values."""
        d = self._by_name[name]
        return (d["auto"], *((_NULL_REQUEST,) if d["null_decides"] else ()), *d["values"])

    def where(self, position: str) -> str:
        """``file:line:col`` of a stored ``line:col`` in this index's file."""
        return f"{self.path}:{position}"

    def notice(self, notice: list[str]) -> tuple[str, str, str, str]:
        """A notice's runtime form ``(id, severity, file:line:col, message)``."""
        rule_id, severity, position, message = notice
        return (rule_id, severity, self.where(position), message)

    def requirement(self, rule: dict[str, Any]) -> Requirement:
        """A requirement's runtime form."""
        notice = self.notice(rule["notice"]) if rule["notice"] is not None else None
        return Requirement((rule["id"], rule["value"], notice, rule["text"], rule["reason"], self.where(rule["location"])))

    # -- architectures --

    def models(self) -> tuple[tuple[str | None, str | None], ...]:
        """The (architecture, model_type) classes this policy tells apart, as
        :func:`kvpolicy.evaluate.domain.domain_of` finds them for one policy: every architecture it names and
        ``None`` ("any other"), each without a model_type and with every model_type that can matter
        for it. One representative per class answers for every model in it."""
        if self._models is None:
            conditions = [constraint["when"] for constraint in self.data["constraints"]]
            qualified: dict[str, set[str]] = {}
            for decision in self.decisions:
                for rule in (*decision["requirements"], *decision["conditionals"], decision["default"], *decision["adjustments"]):
                    conditions.append(rule["when"])
                if decision["adopt"] is not None:
                    conditions.append(decision["adopt"])
                for architecture, model_type, _, _ in (decision["rows"] or {}).get("qualified", ()):
                    qualified.setdefault(architecture, set()).add(model_type)
            read: set[str] = set()
            reads_model_type = False
            for condition in conditions:
                for subject, values, _ in condition["subjects"]:
                    if subject == "model_type":
                        reads_model_type = True
                        read.update(values)
            all_types = read | {t for types in qualified.values() for t in types}
            models: list[tuple[str | None, str | None]] = []
            for architecture in [*sorted(self.named), None]:
                types = all_types if reads_model_type else qualified.get(architecture or "", set())
                models.append((architecture, None))
                models += [(architecture, t) for t in sorted(types)]
            self._models = tuple(models)
        return self._models

    def name_diagnostic(self, architecture: str, strict: bool) -> Diagnostic | None:
        """A diagnostic for an architecture this policy does not name that looks like a typo of one
        it does (see :mod:`kvpolicy.evaluate.names`), or None."""
        cache = self._near_misses
        if architecture in cache:
            close = cache[architecture]
        else:
            from .names import near_miss

            close = near_miss(architecture, self.named)
            if len(cache) < 4096:  # names a serving process meets; a flood of new ones is just not cached
                cache[architecture] = close
        if close is None:
            return None
        fix = f"use {close!r} (or a name this policy does not name on purpose)"
        return _new_diagnostic(
            Diagnostic,
            (
                "architecture-near-miss",
                "error" if strict else "warning",
                f"architecture {architecture!r} is not named by policy {self.version}; did you mean {close!r}? "
                f"It resolves as a model with no preference, which {close} is not. To fix: {fix}.",
                None,
                self.path,
                fix,
            ),
        )

    @staticmethod
    def strict_flag(fields: dict[str, Any]) -> bool:
        """Pop ``strict`` from the caller's fields: True (the default) makes a near-miss architecture an
        error; ``strict=False`` keeps it a warning (the model then resolves as one without preferences)."""
        strict = fields.pop("strict", True)
        if strict.__class__ is not bool:
            raise ContextError("strict", f"expected true or false, got {strict!r}")
        return strict

    # -- context --

    def normalise(self, config: Mapping[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
        """Check and complete a context; raise :class:`ContextError` on anything unknown or invalid.

        ``fields`` is consumed (the caller's ``**kwargs`` dict): popping the known fields and
        checking what is left over is the cheapest way to validate on the hot path.
        """
        if config is not None:
            if not isinstance(config, Mapping):
                raise ContextError(
                    "config",
                    f"expected a cache_transceiver_config mapping, got {type(config).__name__}; pass a dict or keyword fields",
                )
            fields = {**config, **fields}
            # As upstream's CacheTransceiverConfig: a config without a backend starts no transceiver.
            fields.setdefault("backend", None)
        pop = fields.pop
        ctx = {
            "architecture": pop("architecture", None),
            "model_type": None,
            "kv_transfer_timeout_ms": pop("kv_transfer_timeout_ms", _DEFAULT_TIMEOUT_MS),
            "features": pop("features", _NO_FEATURES),
            "env": pop("env", _NO_ENV),
        }
        for name, left_out, accepted in self._requests:
            value = pop(name, left_out)
            ctx[name] = value if (value.__class__ is str and value in accepted) else self._requested(name, value)
        architecture = ctx["architecture"]
        if architecture is not None and (type(architecture) is not str or not architecture):
            raise ContextError("architecture", f"expected an architecture name such as 'LlamaForCausalLM', got {architecture!r}")
        timeout = ctx["kv_transfer_timeout_ms"]
        if timeout is not None and (type(timeout) is not int or timeout <= 0):
            raise ContextError("kv_transfer_timeout_ms", f"expected a positive number of milliseconds or null, got {timeout!r}")
        if ctx["features"] is not _NO_FEATURES:
            ctx["features"] = self._features(ctx["features"])
        if ctx["env"] is not _NO_ENV:
            ctx["env"] = _env(ctx["env"])
        if fields:
            self._rest(ctx, fields)
        elif ctx["env"] is not _NO_ENV and self._env_features:
            self._enable_features(ctx, ())
        return ctx

    def _rest(self, ctx: dict[str, Any], fields: dict[str, Any]) -> None:
        """The fields the fast path does not pop: pretrained_config, feature flags, passive fields."""
        flags: list[str] = []
        for key, value in fields.items():
            if key == "pretrained_config":
                _pretrained(ctx, value, self.data["checkpoint_rules"])
            elif key in self._flag_features:
                if key in MAPPING_FIELDS:
                    if value is not None and not isinstance(value, Mapping):
                        raise ContextError(key, f"expected a mapping of parameters (or null), got {value!r}")
                elif type(value) is not bool:
                    raise ContextError(key, f"expected true or false, got {value!r}")
                if value:
                    flags.append(self._flag_features[key])
            elif key in DATED_FIELDS:
                raise ContextError(
                    key,
                    f"policy {self.data['version']} models an upstream state before this cache_transceiver_config field "
                    "existed; TensorRT-LLM's strict config refuses it there (a later policy version accepts it)",
                )
            elif key not in _PASSIVE_FIELDS:
                if key in _SERVING_CONFIG_KEYS:
                    # A whole serving config was passed where its cache_transceiver_config belongs.
                    raise ContextError(
                        key,
                        "this is a key of a whole serving config, not of its cache_transceiver_config; pass "
                        "config['cache_transceiver_config'] (for a disaggregated config, each of "
                        "context_servers / generation_servers has its own), or use `kvpolicy impact`",
                    )
                raise ContextError(
                    key,
                    f"unknown context field{_suggest(key, self._known_fields)} (known: {', '.join(sorted(self._known_fields))})",
                )
        self._enable_features(ctx, flags)

    def _enable_features(self, ctx: dict[str, Any], flags: Any) -> None:
        extra = set(flags)
        env = ctx["env"]
        for variable, feature in self._env_features:
            if env.get(variable) == "1":
                extra.add(feature)
        if not extra <= ctx["features"]:
            ctx["features"] = ctx["features"] | extra

    def _requested(self, name: str, value: Any) -> Any:
        decision = self._by_name[name]
        requests = self.requests(name)
        if value is None:
            if name == "backend":
                return None  # disaggregation off
            if decision["null_decides"]:
                return _NULL_REQUEST
            if decision["null"] is not None:
                return decision["null"]
            raise ContextError(name, f"null is not a value of {name}; use {decision['auto']!r} to let the policy decide")
        if value in requests:
            return value
        choices = tuple(v for v in requests if v != _NULL_REQUEST)
        hint = _suggest(str(value), choices)
        null = f", or null for {decision['null']}" if decision["null"] else ""
        raise ContextError(name, f"{value!r} is not a value of {name}{hint} (one of {', '.join(choices)}{null})")

    def _features(self, value: Any) -> frozenset[str]:
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise ContextError("features", f"expected a set of feature names, got {value!r}")
        try:
            features = frozenset(value)
        except TypeError:
            raise ContextError("features", f"expected a set of feature names, got {value!r}") from None
        unknown = features - self.features
        if unknown:
            name = sorted(map(str, unknown))[0]
            raise ContextError(
                "features",
                f"unknown feature {name!r}{_suggest(name, self.features)} (known: {', '.join(sorted(self.features))})",
            )
        return features

    # -- diagnostics --

    def diagnostic_order(self, diagnostic: Diagnostic) -> tuple[int, int, str]:
        """Errors first, then by decision order, then by id: independent of rule order."""
        return self._order_key(diagnostic)

    @staticmethod
    def _sort_key(rank: dict[str | None, int]) -> Callable[[Diagnostic], tuple[int, int, str]]:
        # A closure over plain dicts, indexing the tuple: the sort runs on every resolution with
        # two diagnostics or more, and attribute lookups on a named tuple cost a call each.
        severity = _SEVERITY_RANK
        get = rank.get
        return lambda d: (severity[d[1]], get(d[3], 99), d[0])

    def _render(self, template: str) -> Callable[[dict[str, Any], dict[str, Any], str | None], str]:
        render = self._renderers.get(template)
        if render is None:
            render = self._renderers[template] = compile_message(template, self.decision_names)
        return render

    def notice_diagnostic(
        self, notice: tuple[str, str, str, str], decision: str, ctx: dict[str, Any], values: dict[str, Any], value: str | None, preferred: str | None
    ) -> Diagnostic:
        """The diagnostic of a rule's notice ``(id, severity, location, message)`` (``value``: the
        value it decided, if any)."""
        rule_id, severity, where, message = notice
        if value is not None and values.get(decision) != value:
            values = {**values, decision: value}
        return _new_diagnostic(Diagnostic, (rule_id, severity, self._render(message)(ctx, values, preferred), decision, where, ""))

    def constraint_diagnostic(self, constraint: dict[str, Any], ctx: dict[str, Any], values: dict[str, Any]) -> Diagnostic:
        """The diagnostic of a constraint that fired."""
        fixed = self._render(constraint["fix"])(ctx, values, None)
        message = f"{self._render(constraint['message'])(ctx, values, None)} To fix: {fixed}."
        return _new_diagnostic(
            Diagnostic, (constraint["id"], constraint["severity"], message, constraint["decision"], self.where(constraint["location"]), fixed)
        )

    def settle(
        self, name: str, ctx: dict[str, Any], values: dict[str, Any], diagnostics: list[Diagnostic], held: tuple[Requirement, ...], lean: bool = False
    ) -> tuple[str | None, str]:
        """Requirements that hold under auto: decide when they agree, report a conflict (naming
        each) when they do not. ``lean``: diagnostics without messages."""
        if len({r[1] for r in held}) > 1:
            diagnostics.append(Diagnostic("requirements-conflict", "error", "", name, "") if lean else self.requirement_conflict(name, held))
            return None, ""
        winner = held[0]
        for agreeing in held:  # agreeing requirements: each one's notice, none dropped
            notice = agreeing[2]
            if notice is not None:
                diagnostics.append(
                    Diagnostic(notice[0], notice[1], "", name, "") if lean else self.notice_diagnostic(notice, name, ctx, values, winner[1], None)
                )
        # Agreeing requirements decide together: naming only one would make decided_by depend on
        # which id sorts first (a rename would change it) and hide the others.
        return winner[1], winner[0] if len(held) == 1 else "+".join(r[0] for r in held)

    def explicit_conflict(self, name: str, rule: Requirement, value: str) -> Diagnostic:
        """An explicit value a requirement that holds does not allow."""
        rule_id, required, _, text, reason, where = rule
        fix = f"set {name} to {required} or {self._by_name[name]['auto']}"
        why = f" ({reason.rstrip('.')})" if reason else ""
        return Diagnostic(
            rule_id,
            "error",
            f"{name} is explicitly {value}, but rule {rule_id} requires {required} when {text}{why}. To fix: {fix}.",
            name,
            where,
            fix,
        )

    @staticmethod
    def requirement_conflict(name: str, held: tuple[Requirement, ...]) -> Diagnostic:
        """Requirements that hold and disagree."""
        return conflict_diagnostic(name, [(r[0], r[1], r[3]) for r in held], held[0][5])


def _suggest(name: str, known: Any) -> str:
    from ..wording import suggest

    return suggest(name, known)


def checkpoint_rule(rules: list[list[Any]], model_type: str | None, multimodal: bool) -> list[Any] | None:
    """The first of a policy's checkpoint rules (index data) that rewrites this checkpoint, or None."""
    if model_type is None:
        return None
    for rule in rules:
        if model_type in rule[1] and (rule[2] is None or rule[2] == multimodal):
            return rule
    return None


def is_multimodal(get: Callable[..., Any]) -> bool:
    """Upstream's composite-checkpoint test: non-empty ``text_config`` and ``vision_config``, and
    not ``language_model_only: true``."""
    text, vision = get("text_config", None), get("vision_config", None)
    return bool(text) and bool(vision) and get("language_model_only", None) is not True


def _pretrained(ctx: dict[str, Any], value: Any, rules: list[list[Any]] | tuple[()] = ()) -> None:
    if value is None:
        return
    get = value.get if isinstance(value, Mapping) else lambda k, d=None: getattr(value, k, d)
    architectures = get("architectures", None)
    model_type = get("model_type", None)
    if architectures is not None and (
        isinstance(architectures, str) or not isinstance(architectures, (list, tuple)) or not all(isinstance(a, str) for a in architectures)
    ):
        raise ContextError("pretrained_config", f"architectures must be a list of names, got {architectures!r}")
    if model_type is not None and not isinstance(model_type, str):
        raise ContextError("pretrained_config", f"model_type must be a string, got {model_type!r}")
    architecture = architectures[0] if architectures else None
    if ctx["architecture"] is not None and architecture is not None and architecture != ctx["architecture"]:
        raise ContextError("architecture", f"{ctx['architecture']!r} contradicts pretrained_config's {architecture!r}; pass one")
    if architecture is not None:
        ctx["architecture"] = architecture
    ctx["model_type"] = model_type
    # Upstream rewrites some checkpoints by model_type at load, whatever architectures[0] says.
    rule = checkpoint_rule(rules, model_type, is_multimodal(get)) if rules else None
    if rule is not None:
        ctx["architecture"] = rule[3]


#: What a variable set to the empty string reads as in conditions. A policy writes ``""`` for
#: *unset*; a variable set to ``""`` is another value, as upstream reads it: its
#: ``getenv("TRTLLM_NIXL_KVCACHE_BACKEND", "UCX")`` returns ``""`` then, which the in-flight-cancel
#: gate refuses (#15238). No real environment value holds a NUL, so this cannot be a value someone set.
SET_EMPTY = "\x00set-empty"


class EnvView(dict):
    """A context's environment in which a variable set to ``""`` reads as :data:`SET_EMPTY` through
    ``get`` (what conditions use), while items, iteration and ``dict(...)`` show it as written."""

    __slots__ = ()

    def get(self, key: Any, default: Any = None) -> Any:
        value = dict.get(self, key, default)
        return SET_EMPTY if value == "" and key in self else value


def _env(value: Any) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise ContextError("env", f"expected a mapping of environment variables, got {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ContextError("env", f"environment variables and values must be strings, got {key!r}={item!r}")
    if "" in value.values():
        return EnvView(value)
    return value


_new_diagnostic = tuple.__new__


def compile_message(template: str, decisions: frozenset[str]) -> Callable[[dict[str, Any], dict[str, Any], str | None], str]:
    """Turn a message with ``{placeholders}`` into a function of (context, values, preferred).

    Messages are formatted on the hot path whenever a rule fires; splitting the template once
    into literal text and value getters makes that a concatenation instead of a ``format_map``.
    """
    pieces: list[tuple[str, Callable[[dict[str, Any], dict[str, Any], str | None], str] | None, str]] = []
    for literal, field, spec, _ in formatter_parser(template):
        pieces.append((literal, _getter(field, decisions) if field else None, spec or ""))
    if all(getter is None for _, getter, _ in pieces):
        text = "".join(literal for literal, _, _ in pieces)
        return lambda ctx, values, preferred: text
    if len(pieces) <= 2 and pieces[0][1] is not None and not pieces[0][2] and all(g is None for _, g, _ in pieces[1:]):
        head, getter, _ = pieces[0]
        tail = pieces[1][0] if len(pieces) == 2 else ""
        return lambda ctx, values, preferred: head + getter(ctx, values, preferred) + tail  # type: ignore[misc]  # getter is one of the callables in pieces, typed object there

    def render(ctx: dict[str, Any], values: dict[str, Any], preferred: str | None) -> str:
        out = []
        for literal, getter, spec in pieces:
            out.append(literal)
            if getter is not None:
                out.append(format(getter(ctx, values, preferred), spec) if spec else getter(ctx, values, preferred))
        return "".join(out)

    return render


def _getter(field: str, decisions: frozenset[str]) -> Callable[[dict[str, Any], dict[str, Any], str | None], str]:
    if field in decisions:
        return lambda ctx, values, preferred: values.get(field) or "none"
    if field == "architecture":
        return lambda ctx, values, preferred: ctx["architecture"] or "this architecture"
    if field == "model_type":
        return lambda ctx, values, preferred: ctx["model_type"] or "none"
    if field == "kv_transfer_timeout_ms":
        return lambda ctx, values, preferred: "null" if ctx["kv_transfer_timeout_ms"] is None else str(ctx["kv_transfer_timeout_ms"])
    if field == "preferred":
        return lambda ctx, values, preferred: preferred or "none"
    return lambda ctx, values, preferred: "none"  # the loader refuses unknown placeholders


def conflict_diagnostic(name: str, held: list[tuple[str, Any, Any]], location: str) -> Diagnostic:
    """The error for requirements of ``name`` that hold and disagree: (rule id, value, when) each."""
    parts = [f"{rule_id} requires {value} ({when})" for rule_id, value, when in held]
    fix = "turn off one of the features or settings that these rules name"
    return Diagnostic(
        "requirements-conflict",
        "error",
        f"{name} cannot satisfy every requirement: {'; '.join(parts)}. To fix: {fix}.",
        name,
        location,
        fix,
    )
