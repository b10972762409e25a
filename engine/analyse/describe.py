"""A diff in words: cubes, clauses and resolutions as a person reads them, and the checkpoint
rules two versions read differently.

Every description names exactly the contexts of what it describes: every context it names lies in
the cube (or clauses, or resolutions), and no other does. Dimensions on which a cube holds every
value are left out; models are named by architecture, environment variables by the values that
matter, features as "with" and "without".
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from ..evaluate.domain import Dimension
from ..read.model import Policy
from .cubes import Cube, merge
from .outcomes import ARCHITECTURE_SLOT, ByValues, Clause, Group, Section

__all__ = [
    "Seen",
    "architectures_of",
    "checkpoint_rule_changes",
    "describe_clauses",
    "describe_cube",
    "describe_group",
    "describe_resolved",
]

#: Per decision, every (value, deciding rule) either version decides anywhere in a diff's domain;
#: and per (decision, value), the rules that decide it (what
#: :meth:`kvpolicy.analyse.diff.Diff.resolutions_seen` gives).
Seen = tuple[dict[str, set[Any]], dict[tuple[str, Any], set[Any]]]

_REQUEST_LABELS = {"transceiver_runtime": "runtime"}


def describe_cube(cube: Cube, dimensions: tuple[Dimension, ...]) -> str:
    """A cube (one set of values per dimension, aligned with ``dimensions``) in words; every
    context it names lies in the cube and no other does. Dimensions on which the cube holds every
    value are left out: any value will do."""
    parts: list[str] = []
    env_parts: dict[str, list[str]] = {}
    features_on: list[str] = []
    features_off: list[str] = []
    for dimension, values in zip(dimensions, cube):
        if len(values) == len(dimension.values):
            continue
        name = dimension.name
        if name == "model":
            parts.append(_describe_models(values, dimension.values))
        elif name == "kv_transfer_timeout_ms":
            parts.append("null timeout" if values == frozenset([None]) else "finite timeout")
        elif name.startswith("feature:"):
            (features_on if True in values else features_off).append(name[8:])
        elif name.startswith("env:"):
            text = _describe_env(values, dimension.values)
            env_parts.setdefault(text, []).append(name[4:])
        else:
            label = _REQUEST_LABELS.get(name, name)
            ordered = [v for v in dimension.values if v in values]
            parts.append(f"{label} {_or(ordered)}")
    # Variables set to a value first: they say which route DEFAULT takes.
    for text, variables in sorted(env_parts.items(), key=lambda item: not item[0].startswith("=")):
        parts.append(f"{_and(variables)}{text}")
    all_features = sum(1 for d in dimensions if d.name.startswith("feature:"))
    if features_off and not features_on and len(features_off) == all_features > 1:
        parts.append("no features")
    else:
        if features_on:
            parts.append(f"with {_and(features_on)}")
        if features_off:
            parts.append(f"without {_or(features_off)}")
    return ", ".join(parts) if parts else "any"


def describe_group(group: Group | Section, dimensions: tuple[Dimension, ...]) -> list[list[str]]:
    """A group (or section) as clauses, each a list of alternatives in words (a context is in
    the group when it matches one alternative of every clause)."""
    return describe_clauses(group.clauses, dimensions)


def describe_clauses(clauses: tuple[Clause, ...], dimensions: tuple[Dimension, ...]) -> list[list[str]]:
    """Clauses, each a list of alternatives in words."""
    described = []
    for clause in clauses:
        dims = tuple(dimensions[i] for i in clause.dims)
        texts = [describe_cube(alternative, dims) for alternative in clause.alternatives]
        if texts != ["any"]:
            described.append(texts)
    return described or [["any context"]]


def describe_resolved(by_values: ByValues, seen: Seen) -> list[str]:
    """The resolutions of a :class:`~kvpolicy.analyse.outcomes.ByValues`, as alternatives in words.
    A value is named with the rules that decided it, unless every rule that ever decides that value
    is among them (``seen``: what the diff's versions decide anywhere, with the rules as
    ``by_values.with_rules`` says; :meth:`kvpolicy.analyse.diff.Diff.resolutions_seen`)."""
    names = [name for name, _, _ in by_values.resolved[0]]
    every, rules_of = seen
    cubes = merge([tuple(frozenset([(value, rule)]) for _, value, rule in key) for key in by_values.resolved])
    texts = []
    for cube in cubes:
        parts = []
        for name, pairs in zip(names, cube):
            if pairs == every[name]:
                continue
            by_value: dict[Any, set[Any]] = {}
            for value, rule in pairs:
                by_value.setdefault(value, set()).add(rule)
            plain, qualified = [], []
            for value in sorted(by_value, key=str):
                rules = by_value[value]
                if not by_values.with_rules or rules >= rules_of[(name, value)]:
                    plain.append(str(value))
                else:
                    shown = sorted(str(r).replace(ARCHITECTURE_SLOT, "<architecture>") for r in rules)
                    qualified.append(f"{value} (by {_or(shown)})")
            # Values decided by named rules first, so that no "(by ...)" reads as if it held for all.
            parts.append(f"{name} {_or(qualified + plain)}")
        texts.append(", ".join(parts) if parts else "anything")
    return sorted(texts)


def architectures_of(group: Group | Section, dimensions: tuple[Dimension, ...]) -> list[str | None]:
    """The architectures a group's contexts may have."""
    index = [d.name for d in dimensions].index("model")
    return sorted({model[0] for cube in group.cubes for model in cube[index]}, key=lambda a: (a is None, a or ""))


def _or(items: list[Any]) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _and(items: list[Any]) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _describe_env(values: frozenset, options: tuple[str, ...]) -> str:
    named = [o for o in options if o not in ("", _OTHER)]
    shown = [("unset" if v == "" else "another value" if v == _OTHER else repr(v)) for v in options if v in values]
    missing = [o for o in options if o not in values]
    if "" in options and _OTHER not in options and "" in values and len(missing) == 1 and missing[0] != "":
        return f" not {missing[0]}"  # '' stands for unset and every unnamed value
    if "" in values and _OTHER not in options and named:
        shown[shown.index("unset")] = f"not {_or(named)}"
    only = [v for v in options if v in values]
    if len(only) == 1 and only[0] not in ("", _OTHER):
        return f"={only[0]}"
    return " is " + _or(shown)


def _describe_models(values: frozenset, models: tuple[tuple[str | None, str | None], ...]) -> str:
    """Architectures by name; a qualified architecture says which model_type it covers."""
    by_architecture = _by_architecture(models)

    def name(architecture: str | None, model_types: list[str | None]) -> str:
        all_types = by_architecture[architecture]
        label = architecture or "any other architecture"
        if len(model_types) == len(all_types):
            return label
        named = [t for t in all_types if t is not None]
        if model_types == [None]:
            return f"{label} (model_type not {_or(named)})"
        return f"{label} (model_type {_or([t or 'another' for t in model_types])})"

    # Only the architectures of ``values`` are named, unless the set holds "any other
    # architecture" and may read shorter as its complement: then every architecture counts.
    if (None, None) in values:
        architectures: Iterable[str | None] = by_architecture
    else:
        position = _positions(models)
        architectures = sorted({a for a, _ in values}, key=position.__getitem__)
    inside: list[str] = []
    outside: list[str] = []
    for architecture in architectures:
        all_types = by_architecture[architecture]
        kept = [t for t in all_types if (architecture, t) in values]
        if kept:
            inside.append(name(architecture, kept))
        if len(kept) < len(all_types):
            outside.append(name(architecture, [t for t in all_types if (architecture, t) not in values]))
    if (None, None) in values and len(outside) < len(inside):
        return f"every architecture except {_or(outside)}"
    return _or(inside)


@lru_cache(maxsize=16)
def _by_architecture(models: tuple[tuple[str | None, str | None], ...]) -> dict[str | None, list[str | None]]:
    """The model_types of each architecture, in the order of ``models`` (one dimension's values:
    the same tuple for every description of a diff)."""
    by_architecture: dict[str | None, list[str | None]] = {}
    for architecture, model_type in models:
        by_architecture.setdefault(architecture, []).append(model_type)
    return by_architecture


@lru_cache(maxsize=16)
def _positions(models: tuple[tuple[str | None, str | None], ...]) -> dict[str | None, int]:
    return {architecture: i for i, architecture in enumerate(_by_architecture(models))}


_OTHER = "\x00other"


def checkpoint_rule_changes(old: Policy, new: Policy) -> tuple[tuple[str, str], ...]:
    """The checkpoint rules of two versions, compared by id: ``(sign, description)`` pairs."""

    def text(rule: Any) -> str:
        kind = {True: " (composite checkpoints)", False: " (text-only checkpoints)", None: ""}[rule.multimodal]
        return f"{rule.id}: model_type {' or '.join(rule.model_type)}{kind} loads as {rule.architecture}"

    before = {r.id: r for r in old.checkpoint_rules}
    after = {r.id: r for r in new.checkpoint_rules}
    found: list[tuple[str, str]] = []
    for rule_id in sorted(before.keys() | after.keys()):
        a, b = before.get(rule_id), after.get(rule_id)
        if a is None:
            found.append(("+", text(b)))
        elif b is None:
            found.append(("-", text(a)))
        elif (a.model_type, a.multimodal, a.architecture) != (b.model_type, b.multimodal, b.architecture):
            found.append(("~", f"{text(a)} -> {text(b)}"))
    if [r.id for r in old.checkpoint_rules if r.id in after] != [r.id for r in new.checkpoint_rules if r.id in before]:
        found.append(("~", "the order in which checkpoint rules are tried changed (the first that matches wins)"))
    return tuple(found)
