"""Exact analysis of a policy over every context it can tell apart, one decision at a time.

The lint rules about precedence (shadowed, unreachable, conflicting rules) and about ``auto``
choices that a constraint then rejects need to know, for every rule, whether some context makes
its condition hold and whether it ever decides. Enumerating the full product of inputs is exact
but costs ~10 us a context, and the product grows with every feature and architecture.

This module walks the decisions in evaluation order instead, keeping a set of *states*: the
inputs that a later decision or constraint still reads, the values decided so far and the rules
that decided them. Each decision assigns only the inputs its own rules read (when nothing earlier
assigned them), evaluates its stages exactly as the resolver does, and the states are then
projected onto what later steps read, so states that differ only in inputs nobody reads again
merge. Architectures are compressed into classes that every condition and preference table
treats alike (1,000 rows with two distinct values are a handful of classes), and the classes get
coarser step by step: after a decision, only the tables and conditions still to come tell
architectures apart. Each state keeps one
*witness*: the smallest full set of inputs that reaches it, which becomes the counterexample.
The constraints stage, last, does not enumerate the inputs it reads together either: it tests each
constraint over the few inputs it reads, and derives the rest (see "the constraints stage" below).

The result is exact for the classes of contexts :mod:`kvpolicy.evaluate.domain` defines; a test checks it
against the resolver on the full domain.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from ..read.model import Condition, Decision, Policy, Row
from ..evaluate.interpreter import RowIndex, compile_condition

__all__ = ["Analysis", "AnalysisLimit", "Witnesses", "analyse", "context_of", "describe_context"]

#: Most decision evaluations one step of an analysis may spend (~20 us each here): above any real
#: policy (the shipped ones need under 200,000), low enough that a pathological file (dozens of
#: features read together) fails fast instead of hanging CI.
EVALUATION_LIMIT = 400_000

#: Most rule tests one step may spend (an evaluation tests each of its step's requirements and
#: conditionals, the constraints step each constraint; ~0.1-0.3 us a test here): the shipped
#: policies need under 4,000,000. A policy of thousands of rules over thousands of architecture
#: classes is refused before the step runs, not analysed for minutes.
RULE_TEST_LIMIT = 20_000_000


class AnalysisLimit(Exception):
    """The policy reads too many inputs together for an exact analysis within the limit."""


_FINITE_TIMEOUT = 60000
_OTHER_ENV_VALUE = "\x00other"


def _condition_dims(condition: Condition, decisions: Iterable[str]) -> tuple[set[str], set[str]]:
    """(input dimensions, decision values) a condition reads."""
    names = set(decisions)
    dims: set[str] = set()
    values: set[str] = set()
    for subject in condition.subjects:
        (values if subject in names else dims).add(subject)
    dims.update(f"request:{name}" for name in condition.requested)
    if condition.timeout is not None:
        dims.add("kv_transfer_timeout_ms")
    dims.update(f"feature:{f}" for f in condition.features)
    dims.update(f"env:{v}" for v in condition.env)
    return dims, values


def context_of(witness: dict[str, Any], policy: Policy) -> dict[str, Any]:
    """The normalised context (as ``PolicySet.outcome`` takes it) of a witness assignment."""
    ctx: dict[str, Any] = {
        "architecture": witness.get("architecture"),
        "model_type": witness.get("model_type"),
        "kv_transfer_timeout_ms": witness.get("kv_transfer_timeout_ms", _FINITE_TIMEOUT),
        "features": frozenset(k[8:] for k, v in witness.items() if k.startswith("feature:") and v),
        "env": {k[4:]: v for k, v in witness.items() if k.startswith("env:") and v != ""},
    }
    for name, decision in policy.decisions.items():
        ctx[name] = witness.get(f"request:{name}", decision.auto)
    return ctx


def describe_context(ctx: dict[str, Any], policy: Policy) -> str:
    """A short, resolve-like description of a context: only what differs from the defaults."""
    parts: list[str] = []
    if ctx.get("architecture") is not None:
        parts.append(f"architecture={ctx['architecture']}")
    if ctx.get("model_type") is not None:
        parts.append(f"model_type={ctx['model_type']}")
    for name, decision in policy.decisions.items():
        if ctx.get(name, decision.left_out) != decision.left_out:  # a field left out requests left_out
            parts.append(f"{name}={ctx[name]}")
    if ctx.get("kv_transfer_timeout_ms", _FINITE_TIMEOUT) is None:
        parts.append("kv_transfer_timeout_ms=null")
    for feature in sorted(ctx.get("features", ())):
        parts.append(f"feature {feature}")
    for variable, value in sorted(ctx.get("env", {}).items()):
        shown = "<other>" if value == _OTHER_ENV_VALUE else value
        parts.append(f"env {variable}={shown}")
    return ", ".join(parts) or "every context"


def _size(witness: dict[str, Any]) -> int:
    """Order of counterexamples: fewest features, env variables and explicit settings first
    (kept up to date in the witness itself as dimensions are assigned)."""
    return witness.get("#size", 0)


def _weight(dim: str, value: Any, auto: Any) -> int:
    if dim.startswith("feature:"):
        return 1 if value else 0
    if dim.startswith("env:"):
        return 2 if value != "" else 0
    if dim == "kv_transfer_timeout_ms":
        return 1 if value is None else 0
    if dim.startswith("request:"):
        return 1 if value != auto else 0
    return 0


@dataclass
class RuleStats:
    """What the analysis saw of one rule or row."""

    held: dict[str, Any] | None = None
    """The smallest witness where its condition held with its decision left to the policy."""
    decided: dict[str, Any] | None = None
    """The smallest witness where it decided."""


@dataclass
class Analysis:
    """What every rule, row and constraint of a policy can do over all contexts."""

    policy: Policy
    rules: dict[str, RuleStats] = field(default_factory=dict)
    """Requirements, conditionals and defaults by id; rows by row id."""
    constraints: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Constraint id -> first witness where it fired."""
    conflicts: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(requirement id, requirement id) -> first witness where both held with different values."""
    rejected: dict[tuple[str, str, str, tuple[Any, ...]], Witnesses] = field(default_factory=dict)
    """(constraint id, decision, deciding rule, other values the constraint reads) -> witnesses of
    auto contexts whose decided value the error constraint rejects (all of them, built when read;
    :meth:`Witnesses.smallest` gives the smallest first)."""
    row_classes: dict[str, list[Row]] = field(default_factory=dict)
    """Row id of a class representative -> every row its class stands for."""
    representative: dict[str, str] = field(default_factory=dict)
    """Row id -> the row id of its class representative (whose statistics it shares)."""
    states: int = 0


class _Step:
    """One decision compiled for the analysis."""

    def __init__(self, decision: Decision, names: frozenset[str]) -> None:
        self.decision = decision
        self.name = decision.name
        self.auto = decision.auto
        self.undecided = decision.undecided
        self.requirements = [(r, compile_condition(r.when, names)) for r in sorted(decision.requirements, key=lambda r: r.id)]
        self.conditionals = [(r, compile_condition(r.when, names)) for r in decision.conditionals]
        self.default = decision.default
        pref = decision.preference
        self.adopt = compile_condition(pref.adopt_when, names) if pref else None
        self.rows = RowIndex(pref.rows if pref else ())

    def row_for(self, architecture: str | None, model_type: str | None) -> Row | None:
        return self.rows.get(architecture, model_type)


def _architecture_levels(policy: Policy, order: list[str]) -> tuple[list[dict[str | None, str | None]], list[dict[str | None, list[str]]]]:
    """Architecture classes per step: names that every condition and preference table of the
    decisions from step ``i`` on (and of the constraints) treats alike share a class.

    Returns, per level ``i`` (``len(order)`` is the constraints alone), a map name -> class
    representative (the smallest name; ``None`` for architectures no policy names) and a map
    representative -> member names. Later levels read less, so their classes are coarser:
    states that differ only in an architecture no later step tells apart merge."""
    names: list[str | None] = [None, *policy.architectures()]
    reps_at: list[dict[str | None, str | None]] = []
    members_at: list[dict[str | None, list[str]]] = []
    tables_of = {name: preference_table(policy.decisions[name]) for name in order}
    for level in range(len(order) + 1):
        conditions, tables = level_inputs(policy, order[level:], tables_of)
        # A name's signature: which conditions name it, and its rows per preference table. Built
        # from the conditions' and tables' own entries (linear in their size, not names x conditions).
        named_by: dict[str | None, list[Any]] = {}
        for i, condition in enumerate(c for c in conditions if "architecture" in c.subjects):
            for name in condition.subjects["architecture"].values:
                named_by.setdefault(name, []).append(i)
        for j, table in enumerate(tables):
            for name, entries in table.items():
                named_by.setdefault(name, []).append((j, tuple(sorted(entries, key=lambda e: (e[0] or "", e[1])))))
        classes: dict[tuple[Any, ...], list[str | None]] = {}
        for architecture in names:
            classes.setdefault(tuple(named_by.get(architecture, ())) if architecture is not None else (), []).append(architecture)
        reps: dict[str | None, str | None] = {}
        members: dict[str | None, list[str]] = {}
        for group in classes.values():
            rep = None if group[0] is None else min(n for n in group if n is not None)
            members[rep] = [n for n in group if n is not None]
            for member in group:
                reps[member] = rep
        reps_at.append(reps)
        members_at.append(members)
    return reps_at, members_at


def level_inputs(policy: Policy, decisions: list[str], tables_of: dict[str, Any]) -> tuple[list[Condition], list[Any]]:
    """What the constraints, the adjustments and ``decisions`` read of an architecture: their
    conditions, and the preference tables (from ``tables_of``, :func:`preference_table` by decision
    name). Adjustments run after every decision, beside the constraints: every level reads them."""
    conditions = [c.when for c in policy.constraints]
    conditions += [r.when for d in policy.decisions.values() for r in d.adjustments]
    tables = []
    for name in decisions:
        decision = policy.decisions[name]
        conditions += [r.when for r in (*decision.requirements, *decision.conditionals, decision.default)]
        if decision.preference is not None:
            conditions.append(decision.preference.adopt_when)
            tables.append(tables_of[name])
    return conditions, tables


def preference_table(decision: Decision) -> dict[str, list[tuple[str | None, str]]]:
    """A decision's preference rows by architecture: ``(model_type, value)`` of the rows used (the
    first plain row and the first row per model_type)."""
    table: dict[str, list[tuple[str | None, str]]] = {}
    for row in decision.preference.rows if decision.preference is not None else ():
        entry = table.setdefault(row.architecture, [])
        if all(m != row.model_type for m, _ in entry):
            entry.append((row.model_type, row.value))
    return table


def _env_options(named: set[str]) -> tuple[str, ...]:
    other = (_OTHER_ENV_VALUE,) if "" in named else ()
    return ("", *sorted(v for v in named if v != ""), *other)


def analyse(policy: Policy) -> Analysis:
    """Analyse every rule, row and constraint of ``policy`` over all its contexts."""
    names = frozenset(policy.decisions)
    result = Analysis(policy)
    order = _order(policy)
    steps = [_Step(policy.decisions[n], names) for n in order]
    reps_at, members_at = _architecture_levels(policy, order)
    representatives = list(members_at[0])

    # The alphabet of every input dimension.
    model_types = sorted({r.model_type for r in policy.rows() if r.model_type} | _named(policy, "model_type"))
    env_named: dict[str, set[str]] = {}
    conditions = [r.when for r in policy.rules()] + [c.when for c in policy.constraints]
    conditions += [d.preference.adopt_when for d in policy.decisions.values() if d.preference]
    for condition in conditions:
        for variable, matcher in condition.env.items():
            env_named.setdefault(variable, set()).update(matcher.values)
    alphabet: dict[str, tuple[Any, ...]] = {
        "architecture": tuple(representatives),
        "model_type": (None, *model_types),
        "kv_transfer_timeout_ms": (_FINITE_TIMEOUT, None),
    }
    for feature_name in policy.features:
        alphabet[f"feature:{feature_name}"] = (False, True)
    for variable, named in env_named.items():
        alphabet[f"env:{variable}"] = _env_options(named)
    for name, decision in policy.decisions.items():
        alphabet[f"request:{name}"] = decision.requests

    # What each step reads, and what is read after it.
    reads: list[tuple[set[str], set[str]]] = []
    for step in steps:
        dims, read_values = {f"request:{step.name}"}, set()
        decision = step.decision
        parts = [r.when for r in (*decision.requirements, *decision.conditionals)]
        if decision.preference is not None:
            parts.append(decision.preference.adopt_when)
            if decision.preference.rows:
                dims.add("architecture")
                if any(r.model_type for r in decision.preference.rows):
                    dims.add("model_type")
        for condition in parts:
            d, v = _condition_dims(condition, names)
            dims |= d
            read_values |= v
        reads.append((dims, read_values))
    constraint_tests = []
    final_dims: set[str] = set()
    # Adjustments run after every decision, just before the constraints: they belong to the last stage.
    adjustments = []
    for step in steps:
        rules = [(r, compile_condition(r.when, names)) for r in step.decision.adjustments]
        if rules:
            adjustments.append((step.name, step.undecided, rules))
            final_dims.add(f"request:{step.name}")
            for r, _ in rules:
                final_dims |= _condition_dims(r.when, names)[0]
    for constraint in sorted(policy.constraints, key=lambda c: c.id):
        d, v = _condition_dims(constraint.when, names)
        final_dims |= d
        constraint_tests.append((constraint, compile_condition(constraint.when, names), v))
    later: list[set[str]] = []
    needed = set(final_dims)
    for dims, _ in reversed(reads):
        later.append(set(needed))
        needed |= dims
    later.reverse()
    # A feature and the variable that turns it on constrain each other (see ``impossible``):
    # while one is still read, the other must not be projected away.
    partners = {}
    for feature in policy.features.values():
        if feature.env:
            partners[f"env:{feature.env}"] = f"feature:{feature.name}"
            partners[f"feature:{feature.name}"] = f"env:{feature.env}"
    for needed_later in later:
        needed_later |= {partners[d] for d in list(needed_later) if d in partners}

    row_classes: dict[str, list[Row]] = {}
    by_conditions = bool(_named(policy, "model_type"))
    types_of: dict[str | None, tuple[str | None, ...]] = {}
    qualified: dict[str, set[str]] = {}
    for row in policy.rows():
        if row.model_type:
            qualified.setdefault(row.architecture, set()).add(row.model_type)
    for rep in reps_at[0]:
        types_of[rep] = (None, *sorted(qualified.get(rep or "", ())))

    specs_cache: dict[tuple[tuple[str, ...], int], list[list[tuple[str, Any, int, int, str]]]] = {}

    def specs(fresh: tuple[str, ...], level: int) -> list[list[tuple[str, Any, int, int, str]]]:
        """Per fresh dimension, its options as (dim, value, weight, how to set it, field)."""
        found = specs_cache.get((fresh, level))
        if found is None:
            found = []
            for d in fresh:
                options = tuple(members_at[level]) if d == "architecture" else alphabet[d]
                how, name = _SETTERS.get(d.split(":", 1)[0], 0), d.split(":", 1)[-1]
                found.append([(d, v, _weight(d, v, alphabet[d][0]), how, name) for v in options])
            specs_cache[(fresh, level)] = found
        return found

    # A feature tied to an environment variable is on whenever the variable is "1" (``resolve``
    # normalises it so): combinations with the variable "1" and the feature off do not exist.
    implied = [(f"env:{f.env}", f"feature:{f.name}") for f in policy.features.values() if f.env]

    def impossible(w: dict[str, Any]) -> bool:
        return any(w.get(variable) == "1" and w.get(feature) is False for variable, feature in implied)

    def expand(witness: dict[str, Any], ctx: dict[str, Any], dims: set[str], level: int) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
        fresh = tuple(sorted(d for d in dims if d not in witness and d != "model_type"))
        lazy_type = "model_type" in dims and "model_type" not in witness
        start = witness.get("#size", 0)
        for combo in itertools.product(*specs(fresh, level)):
            w = witness.copy()
            c = ctx.copy()
            size = start
            for d, v, weight, how, name in combo:
                w[d] = v
                size += weight
                if how == 0:
                    c[name] = v
                elif how == 1:
                    if v:
                        c["features"] = c["features"] | {name}
                elif v != "":
                    c["env"] = {**c["env"], name: v}
            w["#size"] = size
            if implied and impossible(w):
                continue
            if not lazy_type:
                yield w, c
                continue
            options = alphabet["model_type"] if by_conditions else types_of.get(c["architecture"], (None,))
            for model_type in options:
                w2 = {**w, "model_type": model_type}
                c2 = {**c, "model_type": model_type}
                yield w2, c2

    # Which rule decided matters later only for decisions an error constraint judges (KVP030).
    judged: set[str] = set()
    for constraint, _, reads_values in constraint_tests:
        if constraint.severity == "error":
            judged |= {constraint.decision} & reads_values if constraint.decision else reads_values

    base = context_of({}, policy)
    # state key -> (witness, context); key = (kept dims, values, decided_by)
    states: dict[Any, tuple[dict[str, Any], dict[str, Any]]] = {((), (), ()): ({}, base)}
    for index, step in enumerate(steps):
        dims, _ = reads[index]
        keep = later[index]
        new_states: dict[Any, tuple[dict[str, Any], dict[str, Any]]] = {}
        _check_budget(states, dims, alphabet, step.name, 1 + len(step.requirements) + len(step.conditionals))
        for key, (witness, ctx0) in states.items():
            _, values_t, by_t = key
            values = dict(values_t)
            for w, ctx in expand(witness, ctx0, dims, index):
                value, rule_id = _decide(step, ctx, values, w, result, row_classes, members_at[index], reps_at[index])
                kept = tuple(sorted((d, reps_at[index + 1][w[d]] if d == "architecture" else w[d]) for d in keep if d in w))
                decided = by_t + ((step.name, rule_id),) if step.name in judged else by_t
                new_key = (kept, tuple(sorted({**values, step.name: value}.items())), decided)
                previous = new_states.get(new_key)
                if previous is None or _size(w) < _size(previous[0]):
                    new_states[new_key] = (w, ctx)
        states = new_states
        result.states += len(states)

    # Judged as for the full enumeration of the final states, which the stage no longer runs (it
    # costs a fraction): a policy refused before is refused still (KVP029 does not change).
    _check_budget(states, final_dims, alphabet, "constraints", 1 + len(constraint_tests) + sum(len(rules) for _, _, rules in adjustments))
    # Each input's options in the order the enumeration tried them (architecture classes of the
    # constraints' level), with their weights; model types are tried last, per architecture.
    options = {
        d: tuple((v, _weight(d, v, alphabet[d][0])) for v in (members_at[len(steps)] if d == "architecture" else alphabet[d]))
        for d in final_dims
        if d != "model_type"
    }

    def type_options(architecture: str | None) -> tuple[str | None, ...]:
        return alphabet["model_type"] if by_conditions else types_of.get(architecture, (None,))

    stage = _ConstraintsStage(result, _Inputs(options, type_options, not by_conditions, implied), final_dims, constraint_tests, adjustments, names)
    for key, (witness, ctx) in states.items():
        stage.run(key, witness, ctx)
    result.row_classes = row_classes
    result.representative = {row.id: rep for rep, rows in row_classes.items() for row in rows}
    return result


# -- the constraints stage -------------------------------------------------------------------------
#
# The constraints stage used to enumerate, in every final state, every combination of the inputs
# the constraints and adjustments read that the state leaves free (in sorted order, ``model_type``
# last), test every constraint in each, and keep every witness: 1.6 million contexts over the
# shipped policies, for constraints that each read one or two inputs. It now computes exactly what
# that enumeration produced (``tests/lint/test_analysis_oracle.py`` compares the two) without it:
#
# - The free inputs of a state split into independent *blocks*: every input is a block of its own,
#   except that a variable and the feature it turns on share one (the enumeration skips the
#   variable "1" with the feature off). Every combination of valid block assignments is a context
#   the enumeration meets, and it meets no other.
# - A constraint's outcome and its KVP030 family depend only on the inputs it reads and, through
#   the values they change, on those the adjustments read. So each constraint is tested over the
#   assignments of the blocks holding those (its *group*) only; it fires exactly in (its firing
#   assignments) x (every valid assignment of the other blocks).
# - The size of a witness is a sum over blocks, and the enumeration's order is lexicographic over
#   the free inputs. So the first smallest firing witness joins the first lightest firing
#   assignment with the first lightest assignment of every other block (the lexicographic minimum
#   of a product is made of the minima of its factors), and the number of witnesses is the number
#   of firing assignments times the other blocks' numbers of assignments.
# - Entries the enumeration would add to a dict (a constraint, a family, an adjustment) are added
#   in the order it would meet them: by the place of their first witness in the enumeration.
# - The witnesses of a family are built when read, in the enumeration's order, by :class:`Witnesses`
#   (which also gives them in a stable sort by size, building only those read).


class _Inputs:
    """The inputs of the constraints stage: each one's options in the order the enumeration tries
    them with their weights, which inputs constrain each other, and their valid assignments."""

    def __init__(
        self,
        options: dict[str, tuple[tuple[Any, int], ...]],
        type_options: Any,
        types_follow_architecture: bool,
        implied: list[tuple[str, str]],
    ) -> None:
        self.options = options
        """Input -> its (value, weight) options in enumeration order (``model_type``: see below)."""
        self.type_options = type_options
        """Architecture -> the model types tried with it."""
        self.types_follow_architecture = types_follow_architecture
        self.implied = implied
        """(variable input, feature input): the variable "1" turns the feature on."""
        self.weights = {d: dict(o) for d, o in options.items()}
        self.index = {d: {v: i for i, (v, _) in enumerate(o)} for d, o in options.items()}
        self.setters = {d: (_SETTERS.get(d.split(":", 1)[0], 0), d.split(":", 1)[-1]) for d in (*options, "model_type")}
        self._valid: dict[Any, list[tuple[tuple[Any, ...], int]]] = {}
        self._tries: dict[int, tuple[list[Any], tuple[Any, int]]] = {}
        self._outside: dict[tuple[str, ...], tuple[list[tuple[str, str]], tuple[str, ...], bool]] = {}

    def weight(self, dim: str, value: Any) -> int:
        return 0 if dim == "model_type" else self.weights[dim][value]

    def trie(self, dims: tuple[str, ...], assignments: list[tuple[tuple[Any, ...], int]]) -> tuple[Any, int]:
        """``assignments`` of ``dims`` as a trie (:func:`_trie`), built once per list."""
        found = self._tries.get(id(assignments))
        if found is None or found[0] is not assignments:  # (the list is kept: its id stays its own)
            found = self._tries[id(assignments)] = (assignments, _trie(dims, assignments, self.weight))
        return found[1]

    def blocks(self, dims: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        """``dims`` (a state's free inputs, in enumeration order) split into independent blocks,
        each in enumeration order: a variable and the feature it turns on share a block, and so
        would the architecture and the model type if the model types tried depended on the
        architecture (they do not in this stage: a constraint or adjustment that reads the model
        type names one, and then every architecture tries every named model type)."""
        group = {d: frozenset((d,)) for d in dims}
        links = [(a, b) for a, b in self.implied if a in group and b in group]
        if self.types_follow_architecture and "model_type" in group and "architecture" in group:
            links.append(("architecture", "model_type"))
        for a, b in links:
            merged = group[a] | group[b]
            for d in merged:
                group[d] = merged
        blocks: dict[frozenset[str], list[str]] = {}
        for d in dims:
            blocks.setdefault(group[d], []).append(d)
        return tuple(tuple(block) for block in blocks.values())

    def assignments(self, dims: tuple[str, ...], witness: dict[str, Any], ctx: dict[str, Any]) -> list[tuple[tuple[Any, ...], int]]:
        """Every assignment of ``dims`` (whole blocks of a state's free inputs, in enumeration
        order) that the enumeration meets from ``witness``, as (values, weight), in its order."""
        outside = self._outside.get(dims)
        if outside is None:
            pairs = [(a, b) for a, b in self.implied if a in dims or b in dims]
            partners = {x for pair in pairs for x in pair if x not in dims}
            typed = bool(dims) and dims[-1] == "model_type"
            outside = self._outside[dims] = (pairs, tuple(sorted(partners)), typed and "architecture" not in dims)
        pairs, reads, by_architecture = outside
        # Besides ``dims`` they depend on the partners the witness fixed, and on the architecture
        # where it chooses the model types.
        key = (dims, tuple(witness.get(x) for x in reads), ctx["architecture"] if by_architecture else None) if reads or by_architecture else dims
        found = self._valid.get(key)
        if found is not None:
            return found
        found = self._valid[key] = []
        typed = bool(dims) and dims[-1] == "model_type"
        plain = dims[:-1] if typed else dims
        position = {d: i for i, d in enumerate(plain)}
        for combo in itertools.product(*(self.options[d] for d in plain)):
            values = tuple(v for v, _ in combo)
            if pairs:
                get = lambda x, values=values: values[position[x]] if x in position else witness.get(x)  # noqa: E731  # binds this combination's values, in the innermost loop
                if any(get(a) == "1" and get(b) is False for a, b in pairs):
                    continue
            weight = sum(w for _, w in combo)
            if typed:
                arch = values[position["architecture"]] if "architecture" in position else ctx["architecture"]
                found.extend((values + (t,), weight) for t in self.type_options(arch))
            else:
                found.append((values, weight))
        return found


class _Plan:
    """How the constraints stage splits a state's free inputs ``dims``: the blocks, the group of
    blocks each constraint reads, and the group the adjustments read."""

    def __init__(self, inputs: _Inputs, dims: tuple[str, ...], reads: list[frozenset[str]], adjust_reads: frozenset[str]) -> None:
        self.blocks = inputs.blocks(dims)
        block_of = {d: i for i, block in enumerate(self.blocks) for d in block}

        def closure(read: frozenset[str]) -> tuple[str, ...]:
            touched = {block_of[d] for d in read if d in block_of}
            return tuple(d for d in dims if block_of[d] in touched)

        self.groups: dict[tuple[str, ...], list[int]] = {}
        """Free inputs of a group of blocks -> the constraints (by index) that read those blocks."""
        for index, read in enumerate(reads):
            self.groups.setdefault(closure(read), []).append(index)
        self.reads = {group: tuple(sorted(frozenset().union(*(reads[i] for i in members)))) for group, members in self.groups.items()}
        """Group -> every input its constraints read (free or fixed by the state)."""
        self.adjust = closure(adjust_reads)
        self.adjust_reads = tuple(sorted(adjust_reads))
        self.others = {group: tuple(b for b in self.blocks if b[0] not in group) for group in (*self.groups, self.adjust)}
        """Group -> the blocks outside it."""


class _Free:
    """One final state in the constraints stage: its witness, its context, its free inputs."""

    __slots__ = ("inputs", "plan", "witness", "ctx", "fresh", "dims", "typed", "start", "_blocks", "_others")

    def __init__(self, inputs: _Inputs, plan: _Plan, witness: dict[str, Any], ctx: dict[str, Any], fresh: tuple[str, ...], typed: bool) -> None:
        self.inputs = inputs
        self.plan = plan
        self.witness = witness
        self.ctx = ctx
        self.fresh = fresh
        """The free inputs but the model type, in enumeration order."""
        self.typed = typed
        """Whether the model type is free (assigned last, after the size, as the enumeration did)."""
        self.dims = fresh + ("model_type",) * typed
        self.start = witness.get("#size", 0)
        self._blocks: tuple[dict[str, Any], dict[str, Any], dict[str, int]] | None = None
        self._others: dict[tuple[str, ...], int] = {}

    def assignments(self, dims: tuple[str, ...]) -> list[tuple[tuple[Any, ...], int]]:
        return self.inputs.assignments(dims, self.witness, self.ctx)

    def context(self, dims: tuple[str, ...], values: tuple[Any, ...]) -> dict[str, Any]:
        """The state's context with ``dims`` set to ``values`` (as the enumeration set them; the
        other free inputs keep their defaults: no test run on this context reads them)."""
        if not dims:
            return self.ctx
        c = self.ctx.copy()
        setters = self.inputs.setters
        for d, v in zip(dims, values):
            how, name = setters[d]
            if how == 0:
                c[name] = v
            elif how == 1:
                if v:
                    c["features"] = c["features"] | {name}
            elif v != "":
                c["env"] = {**c["env"], name: v}
        return c

    def _defaults(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
        """Every free input at its block's first valid assignment; at its block's first of the
        least weight; and that least weight per block (by the block's first input)."""
        if self._blocks is None:
            first: dict[str, Any] = {}
            lightest: dict[str, Any] = {}
            weights: dict[str, int] = {}
            for block in self.plan.blocks:
                assignments = self.assignments(block)
                first.update(zip(block, assignments[0][0]))
                values, weight = min(assignments, key=lambda a: a[1])  # min keeps the first of equals
                lightest.update(zip(block, values))
                weights[block[0]] = weight
            self._blocks = (first, lightest, weights)
        return self._blocks

    def others_weight(self, group: tuple[str, ...]) -> int:
        """The least weight of the blocks outside ``group``."""
        found = self._others.get(group)
        if found is None:
            weights = self._defaults()[2]
            found = self._others[group] = sum(weights[block[0]] for block in self.plan.others[group])
        return found

    def lightest(self, group: tuple[str, ...], values: tuple[Any, ...]) -> dict[str, Any]:
        """The witness of ``group`` = ``values`` and every other block at its first lightest
        assignment: the first smallest witness of those values."""
        assigned = {**self._defaults()[1], **dict(zip(group, values))}
        return self.build(assigned, sum(self.inputs.weight(d, v) for d, v in zip(group, values)) + self.others_weight(group))

    def rank(self, group: tuple[str, ...], values: tuple[Any, ...]) -> tuple[int, ...]:
        """Where the enumeration meets ``group`` = ``values`` first: with every other block at its
        first assignment (as option indices, in enumeration order)."""
        assigned = {**self._defaults()[0], **dict(zip(group, values))}
        index = self.inputs.index
        found = [index[d][assigned[d]] for d in self.fresh]
        if self.typed:
            architecture = assigned["architecture"] if "architecture" in assigned else self.ctx["architecture"]
            found.append(self.inputs.type_options(architecture).index(assigned["model_type"]))
        return tuple(found)

    def build(self, assigned: dict[str, Any], weight: int) -> dict[str, Any]:
        """The witness of a combination of the free inputs, as the enumeration built it (key
        order included)."""
        w = self.witness.copy()
        for d in self.fresh:
            w[d] = assigned[d]
        w["#size"] = self.start + weight
        if self.typed:
            w = {**w, "model_type": assigned["model_type"]}
        return w

    def count(self, group: tuple[str, ...], found: list[Any]) -> int:
        """How many witnesses ``found`` (assignments of ``group``) stands for."""
        total = len(found)
        for block in self.plan.others[group]:
            total *= len(self.assignments(block))
        return total

    def sizes(self, group: tuple[str, ...], found: list[tuple[tuple[Any, ...], int]]) -> int:
        """The sizes of the witnesses ``found`` stands for, as a bit set."""
        mask = 0
        for _, w in found:
            mask |= 1 << w
        for block in self.plan.others[group]:
            other = 0
            for _, w in self.assignments(block):
                other |= 1 << w
            mask = _sumset(mask, other)
        return mask << self.start

    def walk(self, group: tuple[str, ...], found: list[tuple[tuple[Any, ...], int]], size: int | None = None) -> Iterator[dict[str, Any]]:
        """The witnesses ``found`` stands for (its assignments of ``group`` x every valid
        assignment of the other blocks), in enumeration order; with ``size``, only those of that size."""
        parts = [(group, found), *((block, self.assignments(block)) for block in self.plan.others[group])]
        if size is not None or "#size" not in self.witness:
            target = None if size is None else size - self.start
            for values, weight in _lex_product(self.dims, parts, self.inputs.trie, target):
                yield self.build(dict(zip(self.dims, values)), weight)
            return
        # The same, faster, for a consumer that reads them all. Before the first and after the
        # last input of a block of several, every input is a block of its own: the order there is
        # a plain product, around the walk of the blocks in between. The loops nest: the inputs
        # before, those blocks, the inputs after but the last three, the last three (and the size:
        # already a key of the witness, it keeps its place; the model type is the last input).
        parts = [part for part in parts if part[0]]  # a group of no free input: found is [((), 0)]
        position = {d: i for i, d in enumerate(self.dims)}
        joint = [position[d] for block, _ in parts if len(block) > 1 for d in block]
        first, last = (min(joint), max(joint) + 1) if joint else (0, 0)
        inner = max(last, len(self.dims) - 3)
        single = {block[0]: assignments for block, assignments in parts if len(block) == 1}
        levels = [
            (self.dims[:first], _flat(single[d] for d in self.dims[:first])),
            (self.dims[first:last], list(_lex_product(self.dims[first:last], [p for p in parts if first <= position[p[0][0]] < last], self.inputs.trie))),
            (self.dims[last:inner], _flat(single[d] for d in self.dims[last:inner])),
        ]
        (head, heads), (middle, middles), (outer, outers) = levels
        tail, tails = (*self.dims[inner:], "#size"), _flat(single[d] for d in self.dims[inner:])
        rows_at: dict[int, list[dict[str, Any]]] = {}
        for head_values, head_weight in heads:
            with_head = self.witness.copy()
            with_head.update(zip(head, head_values))
            for middle_values, middle_weight in middles:
                with_middle = with_head.copy()
                with_middle.update(zip(middle, middle_values))
                for outer_values, outer_weight in outers:
                    with_outer = with_middle.copy()
                    with_outer.update(zip(outer, outer_values))
                    base = self.start + head_weight + middle_weight + outer_weight
                    rows = rows_at.get(base)
                    if rows is None:
                        rows = rows_at[base] = [dict(zip(tail, values + (base + weight,))) for values, weight in tails]
                    for row in rows:
                        w = with_outer.copy()
                        w.update(row)
                        yield w


def _flat(lists: Iterable[list[tuple[tuple[Any, ...], int]]]) -> list[tuple[tuple[Any, ...], int]]:
    """The product of assignment lists, in order, as (values, weight)."""
    found: list[tuple[tuple[Any, ...], int]] = [((), 0)]
    for assignments in lists:
        found = [(values + more, weight + extra) for values, weight in found for more, extra in assignments]
    return found


def _lex_product(
    dims: tuple[str, ...], parts: list[tuple[tuple[str, ...], list[tuple[tuple[Any, ...], int]]]], tries: Any, target: int | None = None
) -> Iterator[tuple[tuple[Any, ...], int]]:
    """The product of ``parts`` ((block, its assignments), the blocks partitioning ``dims``), in
    lexicographic order over ``dims`` although blocks interleave, as (values, weight); with
    ``target``, only those of that weight (pruned: a branch is entered only if it holds one).
    ``tries(block, assignments)`` gives the assignments as a trie (see :func:`_trie`)."""
    owner = {d: k for k, (block, _) in enumerate(parts) for d in block}
    order = [owner[d] for d in dims]
    nodes = [tries(block, assignments) for block, assignments in parts]
    values: list[Any] = [None] * len(order)
    # The weights still reachable from position p: those of the blocks of one input from p on
    # (untouched), with those of the blocks of several inputs (as far as they have descended).
    several = [k for k, (block, _) in enumerate(parts) if len(block) > 1]
    reachable = [1] * (len(order) + 1)
    for p in range(len(order) - 1, -1, -1):
        k = order[p]
        reachable[p] = reachable[p + 1] if k in several else _sumset(reachable[p + 1], nodes[k][1])

    def feasible(p: int, need: int) -> bool:
        if need < 0:
            return False
        mask = reachable[p]
        for k in several:
            mask = _sumset(mask, nodes[k][1])
        return bool(mask >> need & 1)

    def visit(p: int, acc: int) -> Iterator[tuple[tuple[Any, ...], int]]:
        if p == len(order):
            yield tuple(values), acc
            return
        k = order[p]
        node = nodes[k]
        for value, w, child in node[0]:
            nodes[k] = child  # each block's trie descends as its inputs are assigned
            if target is None or feasible(p + 1, target - acc - w):
                values[p] = value
                yield from visit(p + 1, acc + w)
        nodes[k] = node

    if target is None or feasible(0, target):
        yield from visit(0, 0)


def _trie(dims: tuple[str, ...], assignments: list[tuple[tuple[Any, ...], int]], weight: Any) -> tuple[Any, int]:
    """Assignments of ``dims`` as a trie: (children as (value, weight, child) in enumeration
    order, bit set of the weights below)."""
    root: dict[Any, Any] = {}
    for values, _ in assignments:
        node = root
        for v in values:
            node = node.setdefault(v, {})

    def freeze(node: dict[Any, Any], depth: int) -> tuple[Any, int]:
        if depth == len(dims):
            return (), 1
        children = tuple((v, weight(dims[depth], v), freeze(child, depth + 1)) for v, child in node.items())
        mask = 0
        for _, w, (_, below) in children:
            mask |= below << w
        return children, mask

    return freeze(root, 0)


def _sumset(a: int, b: int) -> int:
    """{x + y} for x in bit set ``a``, y in bit set ``b``."""
    found = 0
    shift = 0
    while b:
        if b & 1:
            found |= a << shift
        b >>= 1
        shift += 1
    return found


class Witnesses(Sequence[dict[str, Any]]):
    """The witnesses of one KVP030 family, in the order the full enumeration meets them, built
    when read: a family can stand for a hundred thousand, of which KVP030 reads the few smallest.

    It behaves as the list the enumeration kept (length, iteration, indexing, equality with a
    list); :meth:`smallest` gives them in a stable sort by size, building only those read."""

    def __init__(self) -> None:
        self._segments: list[tuple[_Free, tuple[str, ...], list[tuple[tuple[Any, ...], int]]]] = []
        """Per final state, in order: the state, the group, its assignments in the family."""

    def _add(self, free: _Free, group: tuple[str, ...], found: list[tuple[tuple[Any, ...], int]]) -> None:
        self._segments.append((free, group, found))

    def __len__(self) -> int:
        return sum(free.count(group, found) for free, group, found in self._segments)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return itertools.chain.from_iterable(free.walk(group, found) for free, group, found in self._segments)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return list(self)[index]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(index)
        return next(itertools.islice(iter(self), position, None))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (Witnesses, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # compared by contents and mutable, as a list: unhashable

    def __repr__(self) -> str:
        return f"<Witnesses: {len(self)}>"

    def smallest(self, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The witnesses as ``sorted(self, key=lambda w: w["#size"])[:limit]`` gives them (equal
        sizes in enumeration order), built one at a time: size by size, state by state, only
        where a witness of that size exists."""
        if limit is not None and limit <= 0:
            return
        masks = [free.sizes(group, found) for free, group, found in self._segments]
        every = 0
        for mask in masks:
            every |= mask
        given = 0
        size = 0
        while every >> size:
            if every >> size & 1:
                for (free, group, found), mask in zip(self._segments, masks):
                    if not mask >> size & 1:
                        continue
                    for witness in free.walk(group, found, size):
                        yield witness
                        given += 1
                        if given == limit:
                            return
            size += 1


class _ConstraintsStage:
    """The constraints stage over the final states, one state at a time (see above)."""

    def __init__(
        self,
        result: Analysis,
        inputs: _Inputs,
        final_dims: set[str],
        constraint_tests: list[tuple[Any, Any, set[str]]],
        adjustments: list[tuple[str, Any, list[tuple[Any, Any]]]],
        names: frozenset[str],
    ) -> None:
        self.result = result
        self.inputs = inputs
        self.final_dims = final_dims
        self.tests = constraint_tests
        self.adjustments = adjustments
        adjust_reads: set[str] = set()
        adjust_values: set[str] = set()  # decided values the adjustments read or change
        for name, _, rules in adjustments:
            adjust_reads.add(f"request:{name}")
            adjust_values.add(name)
            for rule, _ in rules:
                dims, values = _condition_dims(rule.when, names)
                adjust_reads |= dims
                adjust_values |= values
        self.adjust_reads = frozenset(adjust_reads)
        # A constraint's outcome and family depend on the inputs it reads and, through the values
        # the adjustments change, on those the adjustments read.
        self.reads = [frozenset(_condition_dims(c.when, names)[0]) | self.adjust_reads for c, _, _ in constraint_tests]
        self.judged: list[list[tuple[str, tuple[str, ...]]]] = []
        """Per constraint: (decision it judges, the other decisions it reads)."""
        for constraint, _, reads_values in constraint_tests:
            if constraint.severity != "error":
                judged: list[str] = []
            elif constraint.decision is not None:  # a constraint that names its decision judges that decision only
                judged = [constraint.decision] if constraint.decision in reads_values else []
            else:
                judged = sorted(reads_values)
            self.judged.append([(d, tuple(v for v in sorted(reads_values) if v != d)) for d in judged])
        # ... and on the decided values it and the adjustments read, and on the rules that decided
        # the decisions it judges.
        self.reads_decided = [
            (frozenset(reads_values) | adjust_values, frozenset(d for d, _ in judged)) for (_, _, reads_values), judged in zip(constraint_tests, self.judged)
        ]
        self.plans: dict[tuple[str, ...], _Plan] = {}
        self._evaluated: dict[Any, tuple[list[Any], list[Any]]] = {}
        self._adjusted_in: dict[Any, dict[str, Any]] = {}
        self._decided_reads: dict[tuple[int, ...], tuple[frozenset[str], frozenset[str]]] = {}

    def run(self, key: Any, witness: dict[str, Any], ctx: dict[str, Any]) -> None:
        """Add what the enumeration of one final state added to the result: the smallest witness
        of every constraint that fires and of every adjustment that decides, and the witnesses of
        every KVP030 family (lazily); new dict entries in the order it added them."""
        _, values_t, by_t = key
        fresh = tuple(sorted(d for d in self.final_dims if d not in witness and d != "model_type"))
        typed = "model_type" in self.final_dims and "model_type" not in witness
        dims = fresh + ("model_type",) * typed
        plan = self.plans.get(dims)
        if plan is None:
            plan = self.plans[dims] = _Plan(self.inputs, dims, self.reads, self.adjust_reads)
        free = _Free(self.inputs, plan, witness, ctx, fresh, typed)
        if self.adjustments:
            self._adjust(free, values_t)
        result = self.result
        added: list[tuple[Any, ...]] = []  # (rank, constraint, decision, kind, key, entry) of new entries
        for group, members in plan.groups.items():
            fired, families = self._evaluate(free, group, members, values_t, by_t)
            for index, found, (values, weight) in fired:
                constraint_id = self.tests[index][0].id
                seen = result.constraints.get(constraint_id)
                if seen is None:
                    added.append((free.rank(group, found[0][0]), index, 0, 0, constraint_id, free.lightest(group, values)))
                elif free.start + weight < _size(seen) and free.start + weight + free.others_weight(group) < _size(seen):
                    result.constraints[constraint_id] = free.lightest(group, values)
            for family, index, number, found in families:
                witnesses = result.rejected.get(family)
                if witnesses is None:
                    witnesses = Witnesses()
                    added.append((free.rank(group, found[0][0]), index, number, 1, family, witnesses))
                witnesses._add(free, group, found)
        # The enumeration added entries as it met them: by context, then constraint, then decision.
        for _, _, _, kind, entry_key, entry in sorted(added, key=lambda a: a[:4]):
            (result.rejected if kind else result.constraints)[entry_key] = entry

    def _adjusted(self, ctx: dict[str, Any], values_t: tuple[Any, ...], by_t: tuple[Any, ...]) -> tuple[dict[str, Any], dict[str, str]]:
        values, by = dict(values_t), dict(by_t)
        for name, undecided, rules in self.adjustments:
            if ctx[name] not in undecided:
                continue
            for rule, test in rules:
                if test(ctx, values):
                    values[name] = rule.value
                    by[name] = rule.id
                    break
        return values, by

    def _evaluate(
        self, free: _Free, group: tuple[str, ...], members: list[int], values_t: tuple[Any, ...], by_t: tuple[Any, ...]
    ) -> tuple[list[Any], list[Any]]:
        """Test the constraints ``members`` over every valid assignment of ``group`` (the blocks
        they read) in one state. Returns, per constraint that fires, (index, its firing
        assignments in order, the first lightest); per KVP030 family, (family, constraint,
        decision, its assignments in order).

        That depends on the state only through what the constraints and adjustments read (the
        decided values, the rules that decided, the inputs the state fixed) and the assignments
        (which the state's fixed partners may restrict): states that agree on those share it."""
        assignments = free.assignments(group)
        decided = self._decided_reads.get(tuple(members))
        if decided is None:
            decided = self._decided_reads[tuple(members)] = (
                frozenset().union(*(self.reads_decided[i][0] for i in members)),
                frozenset().union(*(self.reads_decided[i][1] for i in members)),
            )
        key = (
            group,
            tuple(members),
            id(assignments),
            tuple(free.witness.get(d) for d in free.plan.reads[group]),
            tuple(pair for pair in values_t if pair[0] in decided[0]),
            tuple(pair for pair in by_t if pair[0] in decided[1]),
        )
        found = self._evaluated.get(key)
        if found is not None:
            return found
        fired: dict[int, list[tuple[tuple[Any, ...], int]]] = {}
        families: dict[Any, tuple[int, int, list[tuple[tuple[Any, ...], int]]]] = {}
        plain_values, plain_by = dict(values_t), dict(by_t)
        for assignment in assignments:
            c = free.context(group, assignment[0])
            values, by = self._adjusted(c, values_t, by_t) if self.adjustments else (plain_values, plain_by)
            for index in members:
                constraint, test, _ = self.tests[index]
                if not test(c, values):
                    continue
                fired.setdefault(index, []).append(assignment)
                for number, (decision, others) in enumerate(self.judged[index]):
                    if by.get(decision, "explicit") == "explicit":
                        continue
                    family = (constraint.id, decision, by[decision], tuple((d, values[d]) for d in others))
                    entry = families.get(family)
                    if entry is None:
                        entry = families[family] = (index, number, [])
                    entry[2].append(assignment)
        found = self._evaluated[key] = (
            [(index, fire, min(fire, key=lambda a: a[1])) for index, fire in fired.items()],  # min keeps the first of equals
            [(family, index, number, fire) for family, (index, number, fire) in families.items()],
        )
        return found

    def _adjust(self, free: _Free, values_t: tuple[Any, ...]) -> None:
        """Note the smallest witness of every adjustment that decides in one state."""
        group = free.plan.adjust
        assignments = free.assignments(group)
        key = (group, id(assignments), tuple(free.witness.get(d) for d in free.plan.adjust_reads), values_t)
        decided = self._adjusted_in.get(key)
        if decided is None:
            decided = self._adjusted_in[key] = {}
            for assignment in assignments:
                c = free.context(group, assignment[0])
                values = dict(values_t)
                for number, (name, undecided, rules) in enumerate(self.adjustments):
                    if c[name] not in undecided:
                        continue
                    for rule, test in rules:
                        if test(c, values):
                            values[name] = rule.value
                            first, _, lightest = decided.get(rule.id) or (assignment, number, assignment)
                            decided[rule.id] = (first, number, lightest if lightest[1] <= assignment[1] else assignment)
                            break
        # New entries are added in the order the enumeration meets them, by context then decision.
        stats = self.result.rules
        ranked = sorted((free.rank(group, first[0]), number, rule_id, lightest) for rule_id, (first, number, lightest) in decided.items())
        for _, _, rule_id, (values, weight) in ranked:
            entry = stats.get(rule_id)
            size = free.start + weight + free.others_weight(group)
            if entry is None or entry.held is None or entry.decided is None or size < max(_size(entry.held), _size(entry.decided)):
                _note(stats, rule_id, free.lightest(group, values), decided=True)


def _check_budget(states: dict[Any, Any], dims: set[str], alphabet: dict[str, tuple[Any, ...]], step: str, rules: int) -> None:
    """Refuse a step before it runs if its evaluations, or the rule tests they make (``rules`` per
    evaluation), would pass their limits."""
    total = 0
    for witness, _ in states.values():
        count = 1
        for dim in dims:
            if dim not in witness:
                count *= len(alphabet[dim]) if dim != "model_type" else max(2, len(alphabet[dim]))
        total += count
        if total > EVALUATION_LIMIT:
            raise AnalysisLimit(f"{step} would need over {EVALUATION_LIMIT:,} evaluations (it reads {len(dims)} inputs together); split conditions or features")
        if total * rules > RULE_TEST_LIMIT:
            raise AnalysisLimit(
                f"{step} would need over {RULE_TEST_LIMIT:,} rule tests ({rules - 1:,} rules, each tested in "
                f"over {RULE_TEST_LIMIT // rules:,} contexts); a policy this large is beyond exact analysis"
            )


#: How an input dimension is set in a context: 0 a field, 1 a feature, 2 an env variable.
_SETTERS = {"feature": 1, "env": 2}


def _named(policy: Policy, subject: str) -> set[str]:
    found: set[str] = set()
    conditions = [r.when for r in policy.rules()] + [c.when for c in policy.constraints]
    conditions += [d.preference.adopt_when for d in policy.decisions.values() if d.preference]
    for condition in conditions:
        matcher = condition.subjects.get(subject)
        if matcher is not None:
            found |= matcher.values
    return found


def _order(policy: Policy) -> list[str]:
    return policy.decision_order()


def _note(stats: dict[str, RuleStats], rule_id: str, witness: dict[str, Any], *, decided: bool) -> None:
    entry = stats.get(rule_id)
    if entry is None:
        entry = stats[rule_id] = RuleStats()
    if entry.held is None or _size(witness) < _size(entry.held):
        entry.held = witness
    if decided and (entry.decided is None or _size(witness) < _size(entry.decided)):
        entry.decided = witness


def _decide(
    step: _Step,
    ctx: dict[str, Any],
    values: dict[str, Any],
    witness: dict[str, Any],
    result: Analysis,
    row_classes: dict[str, list[Row]],
    members: dict[str | None, list[str]],
    reps: dict[str | None, str | None],
) -> tuple[str | None, str]:
    """Decide one decision as the resolver does, noting which rules held and which decided."""
    stats = result.rules
    requested = ctx[step.name]
    auto = requested in step.undecided
    value: str | None = None
    rule_id = ""
    held = [r for r, test in step.requirements if test(ctx, values)]
    for first, second in itertools.combinations(held, 2):
        if first.value != second.value:
            pair = (first.id, second.id) if first.id <= second.id else (second.id, first.id)
            seen = result.conflicts.get(pair)
            if seen is None or _size(witness) < _size(seen):
                result.conflicts[pair] = witness
    if not auto:
        value, rule_id = requested, "explicit"
        for r in held:
            _note(stats, r.id, witness, decided=False)
    elif held:
        if len({r.value for r in held}) == 1:  # agreeing requirements decide together (see the resolver)
            value, rule_id = held[0].value, "+".join(r.id for r in held)
        for r in held:
            _note(stats, r.id, witness, decided=value is not None)
    if not auto:
        return value, rule_id
    # The row of the class representative stands for the rows of every member of the class, so
    # that statistics gathered through different members add up under one id.
    row = step.row_for(reps.get(ctx["architecture"], ctx["architecture"]), ctx["model_type"]) if step.rows else None
    if row is not None:
        if row.id not in row_classes:
            rows = [step.row_for(m, ctx["model_type"]) for m in members.get(reps[ctx["architecture"]], [])]
            row_classes[row.id] = [r for r in rows if r is not None and r.value == row.value]
        assert step.adopt is not None
        if step.adopt(ctx, values):
            if value is None:
                value, rule_id = row.value, row.id
            _note(stats, row.id, witness, decided=rule_id == row.id)
    for r, test in step.conditionals:
        if test(ctx, values):
            if value is None:
                value, rule_id = r.value, r.id
            _note(stats, r.id, witness, decided=rule_id == r.id)
    if value is None:
        value, rule_id = step.default.value, step.default.id
    _note(stats, step.default.id, witness, decided=rule_id == step.default.id)
    return value, rule_id
