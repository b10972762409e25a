"""The reference interpreter: a policy's typed model evaluated rule by rule, with traces.

:class:`Program` turns each condition into a small closure and each preference table into a dict
keyed by architecture (:class:`RowIndex`: a lookup costs the same for 10 rows as for 10,000), with
the decisions ordered by their declared inputs. ``resolve`` does not run it: it runs the evaluator
generated from the decision index (:mod:`kvpolicy.evaluate.compiler`). The interpreter is the
reference that evaluator is tested against, and it writes the trace of a resolution
(``Resolution.trace``, what ``kvpolicy explain`` prints); lint's precedence analysis builds on its
conditions and row index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .compiler import CompiledIndex
from .index import CONTEXT_FIELDS, build_index, compile_message, conflict_diagnostic
from ..read.model import Condition, Constraint, Decision, Matcher, Notice, Policy, Row, Rule
from .resolution import Diagnostic, Trace, TraceStep

__all__ = ["CONTEXT_FIELDS", "Program", "RowIndex"]

Test = Callable[[dict[str, Any], dict[str, Any]], bool]

_SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}


def _always(ctx: dict[str, Any], values: dict[str, Any]) -> bool:
    return True


def compile_condition(condition: Condition, decisions: frozenset[str]) -> Test:
    """Turn a condition into a predicate over (context, decided values)."""
    tests: list[Test] = []
    for subject, matcher in condition.subjects.items():
        tests.append(_subject_test(subject, matcher, subject in decisions))
    for subject, matcher in condition.requested.items():
        # The context holds what the user requested under the decision's own name.
        tests.append(_subject_test(subject, matcher, False))
    if condition.timeout is not None:
        want_null = condition.timeout == "null"
        tests.append(lambda c, v: (c["kv_transfer_timeout_ms"] is None) is want_null)
    for feature, on in condition.features.items():
        tests.append(_feature_test(feature, on))
    for variable, matcher in condition.env.items():
        tests.append(_env_test(variable, matcher))
    if not tests:
        return _always
    if len(tests) == 1:
        return tests[0]
    if len(tests) == 2:
        first, second = tests
        return lambda c, v: first(c, v) and second(c, v)
    frozen = tuple(tests)

    def conjunction(c: dict[str, Any], v: dict[str, Any]) -> bool:
        for test in frozen:
            if not test(c, v):
                return False
        return True

    return conjunction


def _subject_test(subject: str, matcher: Matcher, is_decision: bool) -> Test:
    accepted = matcher.values
    if len(accepted) == 1:
        (only,) = accepted
        if is_decision:
            return (lambda c, v: v[subject] != only) if matcher.negate else (lambda c, v: v[subject] == only)
        return (lambda c, v: c[subject] != only) if matcher.negate else (lambda c, v: c[subject] == only)
    if is_decision:
        return (lambda c, v: v[subject] not in accepted) if matcher.negate else (lambda c, v: v[subject] in accepted)
    return (lambda c, v: c[subject] not in accepted) if matcher.negate else (lambda c, v: c[subject] in accepted)


def _feature_test(feature: str, on: bool) -> Test:
    if on:
        return lambda c, v: feature in c["features"]
    return lambda c, v: feature not in c["features"]


def _env_test(variable: str, matcher: Matcher) -> Test:
    accepted, negate = matcher.values, matcher.negate
    return lambda c, v: (c["env"].get(variable, "") in accepted) != negate


class RowIndex:
    """A preference table by architecture: the row for a checkpoint, in O(1) whatever the size.

    A row qualified by ``model_type`` wins over the architecture's plain row when the checkpoint's
    model_type matches; among equal duplicates the first is kept (the loader refuses conflicting
    ones), so the answer never depends on row order.
    """

    __slots__ = ("plain", "qualified")

    def __init__(self, rows: Iterable[Row]) -> None:
        self.plain: dict[str, Row] = {}
        self.qualified: dict[tuple[str, str], Row] = {}
        for row in rows:
            if row.model_type is None:
                self.plain.setdefault(row.architecture, row)
            else:
                self.qualified.setdefault((row.architecture, row.model_type), row)

    def __bool__(self) -> bool:
        return bool(self.plain or self.qualified)

    def get(self, architecture: str | None, model_type: str | None) -> Row | None:
        """The row that applies to this checkpoint, or None."""
        if architecture is None:
            return None
        if model_type is not None and self.qualified:
            row = self.qualified.get((architecture, model_type))
            if row is not None:
                return row
        return self.plain.get(architecture)


class _CompiledRule:
    __slots__ = ("rule", "test", "value", "id", "notice")

    def __init__(self, rule: Rule, decisions: frozenset[str]) -> None:
        self.rule = rule
        self.test = compile_condition(rule.when, decisions)
        self.value = rule.value
        self.id = rule.id
        self.notice = rule.notice


class _CompiledDecision:
    __slots__ = (
        "decision",
        "name",
        "auto",
        "undecided",
        "requirements",
        "rows",
        "preference",
        "adopt",
        "conditionals",
        "default",
    )

    def __init__(self, decision: Decision, decisions: frozenset[str]) -> None:
        self.decision = decision
        self.name = decision.name
        self.auto = decision.auto
        self.undecided = decision.undecided
        # Sorted by id: when several requirements agree, all of them are named (``a+b``), in an
        # order that does not depend on the file.
        self.requirements = tuple(_CompiledRule(r, decisions) for r in sorted(decision.requirements, key=lambda r: r.id))
        self.conditionals = tuple(_CompiledRule(r, decisions) for r in decision.conditionals)
        self.default = _CompiledRule(decision.default, decisions)
        self.preference = decision.preference
        self.adopt = compile_condition(decision.preference.adopt_when, decisions) if decision.preference else _always
        self.rows = RowIndex(decision.preference.rows if decision.preference else ())

    def row_for(self, architecture: str | None, model_type: str | None) -> Row | None:
        return self.rows.get(architecture, model_type)


class _CompiledConstraint:
    __slots__ = ("constraint", "test")

    def __init__(self, constraint: Constraint, decisions: frozenset[str]) -> None:
        self.constraint = constraint
        self.test = compile_condition(constraint.when, decisions)


class Program:
    """A policy compiled for resolution: decisions in dependency order, indexed rules, context schema."""

    def __init__(self, policy: Policy, index: CompiledIndex | None = None) -> None:
        self.policy = policy
        names = frozenset(policy.decisions)
        self.decision_names = names
        order = policy.decision_order()
        self.order = tuple(order)
        self.decisions = tuple(_CompiledDecision(policy.decisions[n], names) for n in order)
        self.constraints = tuple(_CompiledConstraint(c, names) for c in sorted(policy.constraints, key=lambda c: c.id))
        self.adjustments = tuple(
            (d.name, d.undecided, tuple(_CompiledRule(r, names) for r in d.decision.adjustments)) for d in self.decisions if d.decision.adjustments
        )
        self._rank: dict[str | None, int] = {name: index for index, name in enumerate(order)}  # None: no decision
        self.features = frozenset(policy.features)
        # Caches of the interpreter's diagnostics; keyed by parts of this (immutable) policy only.
        self._renderers: dict[str, Callable[..., str]] = {}
        self._facts: dict[int, tuple[Any, ...]] = {}
        #: The plain-data decision index: normalisation and the generated evaluators (the
        #: interpreter below is the reference they are tested against, and it writes traces).
        self.index = index if index is not None else CompiledIndex(build_index(policy, order), policy.path)
        self.default_timeout_ms = self.index.default_timeout_ms

    def outcome(self, ctx: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], list[Diagnostic]]:
        """What a normalised context resolves to, as comparable data: the values, the deciding
        rules and the diagnostics *without messages or locations* (``Diagnostic(id, severity,
        "", decision, "")``), in evaluation order. Analyses over a whole domain (diff, lint) use
        it: nothing is formatted, so it costs about what ``resolve`` does. ``ctx`` must be
        normalised already (as :class:`kvpolicy.evaluate.domain.Domain` yields them)."""
        return self.index.outcome(ctx)

    def normalise(self, config: Mapping[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
        """Check and complete a context (see :meth:`kvpolicy.evaluate.index.DecisionIndex.normalise`)."""
        return self.index.normalise(config, fields)

    # -- resolution ----------------------------------------------------------------------------

    def trace(self, ctx: dict[str, Any]) -> Trace:
        """The full trace of a normalised context."""
        if ctx["backend"] is None:
            return Trace([TraceStep("backend", "explicit", "explicit", "off", "backend is null: disaggregation off")])
        steps: list[TraceStep] = []
        self.evaluate(ctx, steps)
        return Trace(steps)

    def evaluate(self, ctx: dict[str, Any], trace: list[TraceStep] | None) -> tuple[dict[str, Any], dict[str, str], tuple[Diagnostic, ...]]:
        """Decide every decision, then check the constraints. With ``trace``, record every step.

        Without a trace this runs the generated evaluator; with one, the reference interpreter.
        """
        if trace is None:
            return self.index.evaluate(ctx)
        return self.interpret(ctx, trace)

    def interpret(self, ctx: dict[str, Any], trace: list[TraceStep] | None) -> tuple[dict[str, Any], dict[str, str], tuple[Diagnostic, ...]]:
        """The reference interpreter of the decision index (records ``trace`` when given)."""
        values: dict[str, Any] = {}
        decided_by: dict[str, str] = {}
        diagnostics: list[Diagnostic] = []
        for decision in self.decisions:
            self._decide(decision, ctx, values, decided_by, diagnostics, trace)
        for name, undecided, rules in self.adjustments:
            self._adjust(name, undecided, rules, ctx, values, decided_by, diagnostics, trace)
        for compiled in self.constraints:
            if compiled.test(ctx, values):
                constraint = compiled.constraint
                diagnostics.append(self.constraint_diagnostic(constraint, ctx, values))
                if trace is not None:
                    text = self._format(constraint.message, ctx, values)
                    trace.append(TraceStep("constraints", "constraint", constraint.id, constraint.severity, text))
            elif trace is not None:
                trace.append(TraceStep("constraints", "constraint", compiled.constraint.id, "passed", f"not ({compiled.constraint.when})"))
        if len(diagnostics) > 1:
            diagnostics.sort(key=self.diagnostic_order)
        return values, decided_by, tuple(diagnostics)

    def diagnostic_order(self, diagnostic: Diagnostic) -> tuple[int, int, str]:
        """Errors first, then by decision order, then by id: independent of rule order."""
        return (_SEVERITY_RANK[diagnostic.severity], self._rank.get(diagnostic.decision, 99), diagnostic.id)

    def _decide(
        self,
        decision: _CompiledDecision,
        ctx: dict[str, Any],
        values: dict[str, Any],
        decided_by: dict[str, str],
        diagnostics: list[Diagnostic],
        trace: list[TraceStep] | None,
    ) -> None:
        name = decision.name
        requested = ctx[name]
        value: str | None = None
        rule_id = ""

        # 1. explicit
        if requested not in decision.undecided:
            value, rule_id = requested, "explicit"
            if trace is not None:
                said = f"the user set {name} = {requested}"
                if decision.decision.omitted is not None and requested == decision.decision.omitted.value:
                    # The context cannot tell a written value from the field's default: say both.
                    said = f"{name} = {requested}: set, or the config field's default when left out"
                trace.append(TraceStep(name, "explicit", "explicit", "decided", said))
        elif trace is not None:
            trace.append(TraceStep(name, "explicit", "explicit", "skipped", f"{name} is {requested}: the policy decides"))

        # 2. requirements
        if decision.requirements:
            held = [r for r in decision.requirements if r.test(ctx, values)]
            if trace is not None:
                for r in decision.requirements:
                    if r not in held:
                        trace.append(TraceStep(name, "requirement", r.id, "skipped", f"not ({r.rule.when})"))
            if held:
                if value is not None:
                    self.settle_requirements(decision, ctx, values, diagnostics, value, tuple(held))
                    if trace is not None:
                        for r in held:
                            outcome = "error" if r.value != value else "lost"
                            trace.append(TraceStep(name, "requirement", r.id, outcome, f"requires {r.value}: {r.rule.reason or ''}"))
                else:
                    decided, winner_id = self.settle_requirements(decision, ctx, values, diagnostics, None, tuple(held))
                    if decided is not None:
                        value, rule_id = decided, winner_id
                    if trace is not None:
                        for r in held:
                            if decided is None:
                                outcome = "error"
                            else:
                                outcome = "decided" if r.id in winner_id.split("+") else "agreed"
                            trace.append(TraceStep(name, "requirement", r.id, outcome, f"requires {r.value}: {r.rule.reason or ''}"))
        if value is not None and trace is None:
            values[name] = value
            decided_by[name] = rule_id
            return

        # 3. preference
        row = decision.row_for(ctx["architecture"], ctx["model_type"]) if decision.rows else None
        if row is not None:
            if value is not None:
                trace.append(TraceStep(name, "preference", row.id, "lost", f"prefers {row.value}"))  # type: ignore[union-attr]  # decided before and still here: tracing
            elif decision.adopt(ctx, values):
                value, rule_id = row.value, row.id
                if trace is not None:
                    how = f"adopted since {decision.preference.adopt_when}" if not decision.preference.adopt_when.empty else "adopted verbatim"  # type: ignore[union-attr]  # rows exist only under a preference
                    trace.append(TraceStep(name, "preference", row.id, "decided", f"prefers {row.value}, {how}"))
            else:
                preference = decision.preference
                assert preference is not None
                if preference.on_not_adopted is not None:
                    diagnostics.append(self.notice_diagnostic(preference.on_not_adopted, name, ctx, values, None, row.value))
                if trace is not None:
                    trace.append(TraceStep(name, "preference", row.id, "not adopted", f"prefers {row.value}, but not ({preference.adopt_when})"))
        elif trace is not None and decision.preference is not None:
            trace.append(TraceStep(name, "preference", decision.preference.id, "skipped", f"no row for {ctx['architecture'] or 'this architecture'}"))

        # 4. conditional defaults, in order
        for r in decision.conditionals:
            if value is not None and trace is None:
                break
            if r.test(ctx, values):
                if value is None:
                    value, rule_id = r.value, r.id
                    if r.notice is not None:
                        diagnostics.append(self.notice_diagnostic(r.notice, name, ctx, values, value, None))
                    if trace is not None:
                        trace.append(TraceStep(name, "conditional", r.id, "decided", f"{r.rule.when}: {r.value}"))
                else:
                    trace.append(TraceStep(name, "conditional", r.id, "lost", f"{r.rule.when}: {r.value}"))  # type: ignore[union-attr]  # untraced, the loop broke once decided
            elif trace is not None:
                trace.append(TraceStep(name, "conditional", r.id, "skipped", f"not ({r.rule.when})"))

        # 5. default
        if value is None:
            d = decision.default
            value, rule_id = d.value, d.id
            if d.notice is not None:
                diagnostics.append(self.notice_diagnostic(d.notice, name, ctx, values, value, None))
            if trace is not None:
                trace.append(TraceStep(name, "default", d.id, "decided", f"{d.value}: {d.rule.reason or ''}"))
        elif trace is not None:
            trace.append(TraceStep(name, "default", decision.default.id, "lost", f"would be {decision.default.value}"))
        values[name] = value
        decided_by[name] = rule_id

    def _adjust(
        self,
        name: str,
        undecided: frozenset[str],
        rules: tuple[_CompiledRule, ...],
        ctx: dict[str, Any],
        values: dict[str, Any],
        decided_by: dict[str, str],
        diagnostics: list[Diagnostic],
        trace: list[TraceStep] | None,
    ) -> None:
        """Upstream's creation-time rewrites: the first adjustment that holds changes the value,
        unless the user set it explicitly."""
        if ctx[name] not in undecided:
            if trace is not None:
                for r in rules:
                    trace.append(TraceStep(name, "adjustment", r.id, "skipped", f"{name} was set explicitly"))
            return
        adjusted = False
        for r in rules:
            if not adjusted and r.test(ctx, values):
                adjusted = True
                before = values[name]
                values[name] = r.value
                decided_by[name] = r.id
                if r.notice is not None:
                    diagnostics.append(self.notice_diagnostic(r.notice, name, ctx, values, r.value, None))
                if trace is not None:
                    trace.append(TraceStep(name, "adjustment", r.id, "decided", f"{r.rule.when}: {before} -> {r.value}"))
            elif trace is not None:
                outcome = "lost" if adjusted else "skipped"
                trace.append(TraceStep(name, "adjustment", r.id, outcome, f"not ({r.rule.when})" if not adjusted else f"{r.rule.when}: {r.value}"))

    # -- diagnostics ---------------------------------------------------------------------------

    def _format(self, template: str, ctx: dict[str, Any], values: dict[str, Any], preferred: str | None = None) -> str:
        render = self._renderers.get(template)
        if render is None:
            render = self._renderers[template] = compile_message(template, self.decision_names)
        return render(ctx, values, preferred)

    def settle_requirements(
        self,
        decision: _CompiledDecision,
        ctx: dict[str, Any],
        values: dict[str, Any],
        diagnostics: list[Diagnostic],
        explicit: str | None,
        held: tuple[_CompiledRule, ...] | None = None,
    ) -> tuple[str | None, str]:
        """Apply the requirements that hold: against an explicit value, report each one it breaks;
        under auto, decide when they agree and report a conflict (naming each) when they do not."""
        if held is None:
            held = tuple(r for r in decision.requirements if r.test(ctx, values))
        name = decision.name
        if explicit is not None:
            for r in held:
                if r.value != explicit:
                    diagnostics.append(self._explicit_conflict(decision, r, explicit))
            return explicit, "explicit"
        if len({r.value for r in held}) > 1:
            diagnostics.append(self._requirement_conflict(decision, list(held)))
            return None, ""
        winner = held[0]
        for agreeing in held:  # agreeing requirements: each one's notice, none dropped
            notice = agreeing.notice
            if notice is not None:
                diagnostics.append(self.notice_diagnostic(notice, name, ctx, values, winner.value, None))
        # Agreeing requirements decide together: naming only one would make decided_by depend on
        # which id sorts first (a rename would change it) and hide the others.
        return winner.value, winner.id if len(held) == 1 else "+".join(r.id for r in held)

    def constraint_diagnostic(self, constraint: Constraint, ctx: dict[str, Any], values: dict[str, Any]) -> Diagnostic:
        """The diagnostic of a constraint that fired."""
        facts = self._facts.get(id(constraint))
        if facts is None:
            facts = self._facts[id(constraint)] = (
                constraint.id,
                constraint.severity,
                constraint.decision,
                str(constraint.location),
                compile_message(constraint.message, self.decision_names),
                compile_message(constraint.fix, self.decision_names),
            )
        rule_id, severity, decision, where, message, fix = facts
        fixed = fix(ctx, values, None)
        return _new_diagnostic(Diagnostic, (rule_id, severity, f"{message(ctx, values, None)} To fix: {fixed}.", decision, where, fixed))

    def notice_diagnostic(
        self, notice: Notice, decision: str, ctx: dict[str, Any], values: dict[str, Any], value: str | None, preferred: str | None
    ) -> Diagnostic:
        """The diagnostic of a rule's notice (``value``: the value it decided, if any)."""
        facts = self._facts.get(id(notice))
        if facts is None:
            facts = self._facts[id(notice)] = (notice.id, notice.severity, str(notice.location), compile_message(notice.message, self.decision_names))
        rule_id, severity, where, message = facts
        if value is not None and values.get(decision) != value:
            values = {**values, decision: value}
        return _new_diagnostic(Diagnostic, (rule_id, severity, message(ctx, values, preferred), decision, where, ""))

    @staticmethod
    def _explicit_conflict(decision: _CompiledDecision, rule: _CompiledRule, value: str) -> Diagnostic:
        name = decision.name
        fix = f"set {name} to {rule.value} or {decision.auto}"
        why = f" ({rule.rule.reason.rstrip('.')})" if rule.rule.reason else ""
        return Diagnostic(
            rule.id,
            "error",
            f"{name} is explicitly {value}, but rule {rule.id} requires {rule.value} when {rule.rule.when}{why}. To fix: {fix}.",
            name,
            str(rule.rule.location),
            fix,
        )

    @staticmethod
    def _requirement_conflict(decision: _CompiledDecision, held: list[_CompiledRule]) -> Diagnostic:
        return conflict_diagnostic(decision.name, [(r.id, r.value, r.rule.when) for r in held], str(held[0].rule.location))


#: Top-level keys of a TensorRT-LLM serving config (not context fields): a hint that the whole
#: config was passed to ``resolve``.
_new_diagnostic = tuple.__new__
