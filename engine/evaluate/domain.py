"""The finite input domain that one or more policies can tell apart.

Policies read a handful of inputs, each compared against values the policy names, so every
context falls into one of finitely many classes: the architectures the policies name plus "any
other", each backend (``DEFAULT`` with each environment situation), explicit and ``auto`` values
of every decision, a finite or ``null`` timeout, and the feature combinations the policies read.
Enumerating one representative per class answers questions about *all* contexts exactly: which
contexts two versions resolve differently (``diff``), which ``auto`` contexts a constraint then
rejects (``lint``).

The product is kept small by asking where each environment variable and feature is read: one
read only by a decision's auto stages (preference, conditional defaults, default) cannot matter
when the user set that decision explicitly, so it is enumerated only where that decision is auto.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..read.model import Condition, Policy

__all__ = ["OTHER_ARCHITECTURE", "Dimension", "Domain", "domain_of"]

#: The representative of every architecture no policy names.
OTHER_ARCHITECTURE: None = None
_FINITE_TIMEOUT = 60000
_OTHER_ENV_VALUE = "\x00other"


@dataclass(frozen=True)
class Dimension:
    """One input of the domain and its classes: every context falls into exactly one value.

    ``name`` is ``model`` (values are ``(architecture, model_type)`` pairs, see :attr:`Domain.models`),
    a decision name (the value the user requested, auto first), ``kv_transfer_timeout_ms``
    (``60000`` stands for every finite timeout, ``None`` is null), ``feature:NAME`` (off, on) or
    ``env:VARIABLE`` (``''`` stands for unset and every value no policy names, unless a policy
    names ``''`` itself; then a separate value stands for the unnamed ones).
    """

    name: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Domain:
    """The classes of contexts that a set of policies can tell apart."""

    models: tuple[tuple[str | None, str | None], ...]
    """(architecture, model_type) pairs; ``(None, None)`` is every architecture no policy names."""
    requests: dict[str, tuple[Any, ...]]
    """Per decision: its auto value first, then null where the policy decides it, then every
    explicit value."""
    autos: dict[str, frozenset[Any]]
    """Per decision: the requests that leave it to the policy (auto, and null where it decides)."""
    timeouts: tuple[int | None, ...] = (_FINITE_TIMEOUT, None)
    features_always: tuple[str, ...] = ()
    features_when_auto: dict[str, tuple[str, ...]] = field(default_factory=dict)
    env_always: dict[str, tuple[str, ...]] = field(default_factory=dict)
    env_when_auto: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    env_order: tuple[str, ...] = ()
    """Environment variables in the order the policies first read them (e.g. DEFAULT's priority)."""

    def contexts(self) -> Iterator[dict[str, Any]]:
        """Every representative context, normalised as ``resolve`` would normalise it."""
        names = list(self.requests)
        for (architecture, model_type), requested, timeout in itertools.product(self.models, itertools.product(*self.requests.values()), self.timeouts):
            chosen = dict(zip(names, requested))
            features = list(self.features_always)
            env = dict(self.env_always)
            for name in names:
                if chosen[name] in self.autos[name]:
                    features += [f for f in self.features_when_auto.get(name, ()) if f not in features]
                    for variable, options in self.env_when_auto.get(name, {}).items():
                        env.setdefault(variable, options)
            for feature_set in _subsets(sorted(features)):
                for env_values in itertools.product(*env.values()):
                    yield {
                        "architecture": architecture,
                        "model_type": model_type,
                        "kv_transfer_timeout_ms": timeout,
                        "features": feature_set,
                        "env": {k: v for k, v in zip(env, env_values) if v != ""},
                        **chosen,
                    }

    def dimensions(self) -> tuple[Dimension, ...]:
        """The domain as a full product of independent dimensions (for symbolic analyses such as
        :mod:`kvpolicy.analyse.evaluators`): every dimension is listed whether or not a decision is auto; where a
        dimension cannot matter, all of its values behave alike."""
        dims = [Dimension("model", self.models)]
        dims += [Dimension(name, values) for name, values in self.requests.items()]
        dims.append(Dimension("kv_transfer_timeout_ms", self.timeouts))
        env: dict[str, set[str]] = {v: set(o) for v, o in self.env_always.items()}
        for per_decision in self.env_when_auto.values():
            for variable, options in per_decision.items():
                env.setdefault(variable, set()).update(options)
        rank = {v: i for i, v in enumerate(self.env_order)}
        ordered = sorted(env, key=lambda v: (rank.get(v, len(rank)), v))
        dims += [Dimension(f"env:{v}", _ordered_options(env[v])) for v in ordered]
        features = set(self.features_always)
        for names in self.features_when_auto.values():
            features.update(names)
        dims += [Dimension(f"feature:{f}", (False, True)) for f in sorted(features)]
        return tuple(dims)

    def size(self) -> int:
        """How many representative contexts :meth:`contexts` yields."""
        return sum(1 for _ in self.contexts())


def _subsets(items: list[str]) -> Iterator[frozenset[str]]:
    for count in range(len(items) + 1):
        for chosen in itertools.combinations(items, count):
            yield frozenset(chosen)


def domain_of(*policies: Policy) -> Domain:
    """The joint domain of one or more policies (two, for a diff)."""
    architectures: set[str] = set()
    model_types: set[str] = set()
    qualified: dict[str, set[str]] = {}
    reads_model_type = False
    requests: dict[str, list[Any]] = {}
    autos: dict[str, frozenset[Any]] = {}
    features_always: set[str] = set()
    features_when_auto: dict[str, set[str]] = {}
    env_always: dict[str, set[str]] = {}
    env_when_auto: dict[str, dict[str, set[str]]] = {}
    env_order: list[str] = []

    def read(condition: Condition, decision: str | None) -> None:
        nonlocal reads_model_type
        matcher = condition.subjects.get("architecture")
        if matcher is not None:
            architectures.update(matcher.values)
        matcher = condition.subjects.get("model_type")
        if matcher is not None:
            reads_model_type = True
            model_types.update(matcher.values)
        target_features = features_always if decision is None else features_when_auto.setdefault(decision, set())
        target_features.update(condition.features)
        target_env = env_always if decision is None else env_when_auto.setdefault(decision, {})
        for variable, matcher in condition.env.items():
            if variable not in env_order:
                env_order.append(variable)
            options = target_env.setdefault(variable, set())
            options.update(matcher.values)

    for policy in policies:
        for name, decision in policy.decisions.items():
            autos[name] = autos.get(name, frozenset()) | decision.undecided
            values = requests.setdefault(name, [decision.auto])
            values += [v for v in decision.requests if v not in values]
            for rule in decision.requirements:
                read(rule.when, None)
            for rule in (*decision.conditionals, decision.default):
                read(rule.when, name)
            for rule in decision.adjustments:
                read(rule.when, None)
            if decision.preference is not None:
                read(decision.preference.adopt_when, name)
                for row in decision.preference.rows:
                    architectures.add(row.architecture)
                    if row.model_type is not None:
                        model_types.add(row.model_type)
                        qualified.setdefault(row.architecture, set()).add(row.model_type)
        for constraint in policy.constraints:
            read(constraint.when, None)

    models: list[tuple[str | None, str | None]] = []
    for architecture in [*sorted(architectures), OTHER_ARCHITECTURE]:
        types = model_types if reads_model_type else qualified.get(architecture or "", set())
        models.append((architecture, None))
        models += [(architecture, t) for t in sorted(types)]
    # Features read always need not be enumerated again where a decision is auto.
    when_auto = {d: tuple(sorted(f - features_always)) for d, f in features_when_auto.items() if f - features_always}
    # A variable read both always and where a decision is auto needs the values named by either.
    for per_decision in env_when_auto.values():
        for variable, named in per_decision.items():
            if variable in env_always:
                env_always[variable].update(named)
    return Domain(
        models=tuple(models),
        requests={name: tuple(values) for name, values in requests.items()},
        autos=autos,
        features_always=tuple(sorted(features_always)),
        features_when_auto=when_auto,
        env_always={v: _env_options(o) for v, o in sorted(env_always.items())},
        env_when_auto={d: {v: _env_options(o) for v, o in sorted(env.items()) if v not in env_always} for d, env in env_when_auto.items()},
        env_order=tuple(env_order),
    )


def _ordered_options(options: set[str]) -> tuple[str, ...]:
    """Unset first, then named values, then the stand-in for unnamed values."""
    return tuple(sorted(options, key=lambda o: (o != "", o == _OTHER_ENV_VALUE, o)))


def _env_options(named: set[str]) -> tuple[str, ...]:
    """Unset (''), every value a policy names, and, where a policy names unset itself, one value
    no policy names (otherwise such a value behaves exactly like unset)."""
    other = (_OTHER_ENV_VALUE,) if "" in named else ()
    return ("", *sorted(v for v in named if v != ""), *other)
