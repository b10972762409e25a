"""The typed policy model: what a policy file says, with the location of every part.

Built by :mod:`kvpolicy.read.loader` after the JSON Schema accepted the document, so the models here
assume well-formed input; the loader's semantic checks (names, cycles, duplicate ids) run on them.
All models are plain frozen dataclasses (keyword-only fields, slots), built by the loader from
values the JSON Schema and its checks already validated: nothing here validates again. (pydantic
is used where kvpolicy validates what upstream validates, the serving-config sections of
:mod:`kvpolicy.serving.llmargs`; here it only cost ~3x a bare interpreter start on every load.)
:func:`as_data` and :func:`as_json` give a model as plain data.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, Literal

from ..errors import Location

__all__ = [
    "DECISIONS",
    "NULL_REQUEST",
    "STAGES",
    "Condition",
    "Constraint",
    "Decision",
    "Feature",
    "Matcher",
    "Notice",
    "Omitted",
    "Policy",
    "Preference",
    "UpstreamBaseline",
    "Row",
    "Rule",
    "as_data",
    "as_json",
]

#: The decisions kvpolicy knows, each named after the serving-config field that holds the user's value.
DECISIONS: tuple[str, ...] = ("backend", "transceiver_runtime", "kv_cache_manager")

#: The precedence of a decision's stages, highest first.
STAGES: tuple[str, ...] = ("explicit", "requirement", "preference", "conditional", "default")
#: After every decision's stages: upstream's creation-time rewrites of values it did not take verbatim.
ADJUSTMENT = "adjustment"

Severity = Literal["info", "warning", "error"]

#: How a null request reads in a context and in conditions (``requested.NAME = "null"``) when the
#: decision declares ``null = "policy"``: null is then no explicit value but a request the policy
#: decides, as upstream treats ``transceiver_runtime: null`` ("C++ by default", switched to PYTHON
#: for pipelined transfer on NIXL).
NULL_REQUEST = "null"


if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # Python 3.10: only type checkers read it

    def dataclass_transform(**_: Any) -> Any:  # a stand-in for the 3.11 decorator
        return lambda f: f


@dataclass_transform(frozen_default=True, kw_only_default=True)
def _model(cls: type) -> type:
    """Every model: a frozen, keyword-only dataclass with slots (declared to type checkers as such)."""
    return dataclasses.dataclass(frozen=True, kw_only=True, slots=True)(cls)


def as_data(model: Any) -> dict[str, Any]:
    """A model as plain data: fields in declaration order, nested models as dicts, frozensets as
    sorted lists, locations as ``file:line:col``."""
    return {f.name: _plain(getattr(model, f.name)) for f in dataclasses.fields(model)}


def as_json(model: Any) -> str:
    """:func:`as_data` as JSON (keys sorted)."""
    return json.dumps(as_data(model), sort_keys=True)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return as_data(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, Location):
        return str(value)
    return value


@_model
class Matcher:
    """Values a subject may take (``negate``: any value but these)."""

    values: frozenset[str]
    negate: bool = False

    def matches(self, value: str | None) -> bool:
        """Whether ``value`` satisfies this matcher."""
        return (value in self.values) != self.negate

    def __str__(self) -> str:
        # The empty value (an environment variable set to "") is shown as "", never as nothing.
        listed = " or ".join(value if value else '""' for value in sorted(self.values))
        return f"not {listed}" if self.negate else listed


@_model
class Condition:
    """A conjunction of tests on the context and on decided values. Empty: always holds."""

    subjects: dict[str, Matcher] = dataclasses.field(default_factory=dict)
    timeout: Literal["finite", "null"] | None = None
    features: dict[str, bool] = dataclasses.field(default_factory=dict)
    env: dict[str, Matcher] = dataclasses.field(default_factory=dict)
    requested: dict[str, Matcher] = dataclasses.field(default_factory=dict)
    """Tests of the value the user *wrote* for a decision (e.g. the literal backend ``DEFAULT``),
    where ``subjects`` test the value decided."""

    @property
    def empty(self) -> bool:
        """True when the condition holds for every context."""
        return not (self.subjects or self.timeout or self.features or self.env or self.requested)

    def __str__(self) -> str:
        parts = [f"{name} is {matcher}" for name, matcher in sorted(self.subjects.items())]
        parts += [f"{name} is set to {matcher}" for name, matcher in sorted(self.requested.items())]
        if self.timeout:
            parts.append(f"kv_transfer_timeout_ms is {self.timeout}")
        parts += [f"feature {name} is {'on' if on else 'off'}" for name, on in sorted(self.features.items())]
        parts += [f"env {name} is {matcher}" for name, matcher in sorted(self.env.items())]
        return " and ".join(parts) if parts else "always"


@_model
class Notice:
    """A diagnostic a rule adds when it decides (or a preference when it is not adopted)."""

    id: str
    severity: Severity
    message: str
    location: Location


@_model
class Omitted:
    """What a config that leaves a decision's field out requests (upstream's field default, where
    it is not ``auto``), with why and where upstream says so."""

    value: str
    reason: str
    source: str
    location: Location


@_model
class Rule:
    """A requirement, conditional default, default or adjustment of one decision."""

    id: str
    decision: str
    stage: Literal["requirement", "conditional", "default", "adjustment"]
    when: Condition = Condition()
    value: str
    notice: Notice | None = None
    reason: str | None = None
    source: str | None = None
    location: Location
    path: tuple[str | int, ...]
    order: int = 0


@_model
class Row:
    """One architecture's preferred value in a preference table."""

    id: str
    architecture: str
    model_type: str | None = None
    value: str
    reason: str | None = None
    source: str | None = None
    location: Location
    path: tuple[str | int, ...]


@_model
class Preference:
    """A decision's per-architecture table and when its rows are adopted."""

    id: str
    decision: str
    adopt_when: Condition = Condition()
    on_not_adopted: Notice | None = None
    rows: tuple[Row, ...] = ()
    reason: str | None = None
    source: str | None = None
    location: Location


@_model
class Decision:
    """One decision: its values, the user value meaning "decide for me", its inputs and rules."""

    name: str
    description: str = ""
    values: tuple[str, ...]
    auto: str
    null: str | None = None
    """The explicit value a null request stands for (None: null is not a value, or see below)."""
    null_decides: bool = False
    """``null = "policy"``: a null request is decided by the policy like ``auto``; conditions tell
    the two apart with ``requested.NAME``."""
    omitted: Omitted | None = None
    """What a context that leaves the field out requests (None: ``auto``)."""
    inputs: tuple[str, ...] = ()
    requirements: tuple[Rule, ...] = ()
    preference: Preference | None = None
    conditionals: tuple[Rule, ...] = ()
    default: Rule
    adjustments: tuple[Rule, ...] = ()
    """Applied after every decision is made, in order, the first that holds; never to an explicit value."""
    location: Location

    @property
    def left_out(self) -> str:
        """The request of a context that leaves the field out: ``omitted``'s value, else ``auto``."""
        return self.omitted.value if self.omitted is not None else self.auto

    @property
    def undecided(self) -> frozenset[str]:
        """The requests that leave this decision to the policy: auto, and null where it decides."""
        return frozenset((self.auto, NULL_REQUEST)) if self.null_decides else frozenset((self.auto,))

    @property
    def requests(self) -> tuple[str, ...]:
        """Every value a context may request: auto first, then null where it decides, then values."""
        return (self.auto, *((NULL_REQUEST,) if self.null_decides else ()), *self.values)


@_model
class Constraint:
    """A check of the final values that adds an error or a warning."""

    id: str
    decision: str | None = None
    severity: Literal["warning", "error"]
    when: Condition
    message: str
    fix: str
    reason: str | None = None
    source: str | None = None
    location: Location
    path: tuple[str | int, ...]


@_model
class Feature:
    """A feature flag a context may carry, and what else turns it on."""

    name: str
    description: str = ""
    env: str | None = None
    config_field: str | None = None
    location: Location


@_model
class CheckpointRule:
    """How TensorRT-LLM reads a checkpoint whose ``model_type`` it rewrites at load
    (``load_pretrained_config``): the architecture it then runs, whatever ``architectures[0]`` says.
    The first rule that matches wins, in file order, as upstream's branches do."""

    id: str
    model_type: tuple[str, ...]
    multimodal: bool | None = None
    """True: only a checkpoint with non-empty ``text_config`` and ``vision_config`` and without
    ``language_model_only: true``; False: only one without; None: either."""
    architecture: str
    reason: str | None = None
    source: str | None = None
    location: Location


@_model
class UpstreamBaseline:
    """What a version was checked against upstream beyond its rows (``[upstream]``): the decision
    area's environment names and the fingerprints of the functions that are the rules, in the tree
    named by ``read``. ``kvpolicy upstream check`` compares a tree with it."""

    read: str
    env: tuple[str, ...]
    fingerprints: dict[str, str]
    location: Location


@_model
class Policy:
    """One version of the policy, as written in one file."""

    schema_version: int
    version: str
    summary: str
    source: str
    path: str
    digest: str
    features: dict[str, Feature]
    decisions: dict[str, Decision]
    constraints: tuple[Constraint, ...] = ()
    checkpoint_rules: tuple[CheckpointRule, ...] = ()
    upstream: UpstreamBaseline | None = None

    def decision_order(self) -> list[str]:
        """Decision names in evaluation order: inputs first, ties by name (never by file order).

        The loader refuses cycles, so every declared decision appears exactly once.
        """
        import graphlib

        sorter = graphlib.TopologicalSorter({n: set(d.inputs) for n, d in self.decisions.items()})
        sorter.prepare()
        order: list[str] = []
        while sorter.is_active():
            ready = sorted(sorter.get_ready())
            order += ready
            sorter.done(*ready)
        return order

    def rules(self) -> list[Rule]:
        """Every requirement, conditional and default, decision by decision."""
        found: list[Rule] = []
        for decision in self.decisions.values():
            found += [*decision.requirements, *decision.conditionals, decision.default, *decision.adjustments]
        return found

    def architectures(self) -> list[str]:
        """Every architecture the policy names (preference rows and conditions), sorted."""
        names = {row.architecture for row in self.rows()}
        conditions = [r.when for r in self.rules()] + [c.when for c in self.constraints]
        conditions += [d.preference.adopt_when for d in self.decisions.values() if d.preference]
        for condition in conditions:
            matcher = condition.subjects.get("architecture")
            if matcher is not None:
                names |= matcher.values
        return sorted(names)

    def rows(self) -> list[Row]:
        """Every preference row."""
        return [row for d in self.decisions.values() if d.preference for row in d.preference.rows]
