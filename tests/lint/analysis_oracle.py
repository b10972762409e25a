"""FROZEN ORACLE: ``kvpolicy.lint.precedence`` (then ``kvpolicy.lint.analysis``) as it was before the
constraints stage was made lazy (commit 5d58bd6), kept verbatim but for this docstring and the name
``oracle_analyse``.

Its constraints stage enumerates every combination of the free inputs of every final state and
keeps every witness: slow (~10 s over the shipped policies), but obviously exact. The production
analysis must return exactly what this returns (``tests/lint/test_analysis_oracle.py``). Do not
edit this file to follow a change of the production code: a change of behaviour must be argued
against it, not copied into it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvpolicy.read.model import Condition, Decision, Policy, Row
from kvpolicy.evaluate.interpreter import RowIndex, compile_condition

__all__ = ["oracle_analyse"]

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
        if ctx.get(name, decision.auto) != decision.auto:
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
    rejected: dict[tuple[str, str, str, tuple[Any, ...]], list[dict[str, Any]]] = field(default_factory=dict)
    """(constraint id, decision, deciding rule, other values the constraint reads) -> witnesses of
    auto contexts whose decided value the error constraint rejects."""
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


def _architecture_levels(
    policy: Policy, order: list[str]
) -> tuple[list[dict[str | None, str | None]], list[dict[str | None, list[str]]]]:
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
        for name in names:
            classes.setdefault(tuple(named_by.get(name, ())) if name is not None else (), []).append(name)
        reps: dict[str | None, str | None] = {}
        members: dict[str | None, list[str]] = {}
        for group in classes.values():
            rep = None if group[0] is None else min(n for n in group if n is not None)
            members[rep] = [n for n in group if n is not None]
            for name in group:
                reps[name] = rep
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


def oracle_analyse(policy: Policy) -> Analysis:
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
    for feature in policy.features:
        alphabet[f"feature:{feature}"] = (False, True)
    for variable, named in env_named.items():
        alphabet[f"env:{variable}"] = _env_options(named)
    for name, decision in policy.decisions.items():
        alphabet[f"request:{name}"] = decision.requests

    # What each step reads, and what is read after it.
    reads: list[tuple[set[str], set[str]]] = []
    for step in steps:
        dims, values = {f"request:{step.name}"}, set()
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
            values |= v
        reads.append((dims, values))
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
    for name in reps_at[0]:
        types_of[name] = (None, *sorted(qualified.get(name or "", ())))

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

    def expand(
        witness: dict[str, Any], ctx: dict[str, Any], dims: set[str], level: int
    ) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
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

    _check_budget(states, final_dims, alphabet, "constraints", 1 + len(constraint_tests) + sum(len(rules) for _, _, rules in adjustments))
    for key, (witness0, ctx0) in states.items():
        _, values_t, by_t = key
        values = dict(values_t)
        by = dict(by_t)
        for witness, ctx in expand(witness0, ctx0, final_dims, len(steps)):
            if adjustments:
                values = dict(values_t)
                by = dict(by_t)
                for name, undecided, rules in adjustments:
                    if ctx[name] not in undecided:
                        continue
                    for rule, test in rules:
                        if test(ctx, values):
                            values[name] = rule.value
                            by[name] = rule.id
                            _note(result.rules, rule.id, witness, decided=True)
                            break
            for constraint, test, reads_values in constraint_tests:
                if not test(ctx, values):
                    continue
                seen = result.constraints.get(constraint.id)
                if seen is None or _size(witness) < _size(seen):
                    result.constraints[constraint.id] = witness
                if constraint.severity != "error":
                    continue
                # A constraint that names its decision judges that decision only.
                if constraint.decision is not None:
                    judged = [constraint.decision] if constraint.decision in reads_values else []
                else:
                    judged = sorted(reads_values)
                for decision in judged:
                    if by.get(decision, "explicit") == "explicit":
                        continue
                    others = tuple((d, values[d]) for d in sorted(reads_values) if d != decision)
                    family = (constraint.id, decision, by[decision], others)
                    result.rejected.setdefault(family, []).append(witness)
    result.row_classes = row_classes
    result.representative = {row.id: rep for rep, rows in row_classes.items() for row in rows}
    return result


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
            raise AnalysisLimit(
                f"{step} would need over {EVALUATION_LIMIT:,} evaluations "
                f"(it reads {len(dims)} inputs together); split conditions or features"
            )
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
            pair = tuple(sorted((first.id, second.id)))
            seen = result.conflicts.get(pair)  # type: ignore[arg-type]
            if seen is None or _size(witness) < _size(seen):
                result.conflicts[pair] = witness  # type: ignore[index]
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
