"""Compile a policy's decision index into one straight-line Python function.

Resolution must cost a few microseconds whatever the size of the policy, without caching earlier
answers. An interpreter over rule objects spends most of that budget on calls and attribute
lookups, so the fast path is generated code: one function per policy version in which every
condition is an inline comparison and every preference table a dict lookup.

Safety: nothing from a policy file is ever put into the generated source. Every policy string
(names, values, ids, messages) is bound to a generated constant name (``k12``) in the function's
namespace; the source holds only identifiers and operators written here. The input is the plain
data of a :class:`kvpolicy.evaluate.index.DecisionIndex` (possibly read back from the cache): only its
shape (how many rules, which subjects, which operators) decides the code. The interpreter in
:mod:`kvpolicy.evaluate.interpreter` stays the reference (it also produces traces); the test suite checks that
both agree on every context it generates.
"""

from __future__ import annotations

from _string import formatter_parser  # what string.Formatter().parse calls (string itself is not needed)
from collections.abc import Callable
from functools import partial
from types import MappingProxyType

from .index import DecisionIndex
from .resolution import Diagnostic, Resolution

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

    #: ``evaluate(ctx) -> (values, by, diagnostics)``; lean: the diagnostics unsorted and without messages.
    Evaluator = Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, str], tuple[Diagnostic, ...]]]
    LeanEvaluator = Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, str], list[Diagnostic]]]
    #: ``make(policy_set)``: that set's ``resolve(config=None, /, **fields)`` (the PolicySet as Any:
    #: this module imports nothing of .policyset, which imports it).
    Entry = Callable[[Any], Callable[..., Resolution]]

__all__ = ["CompiledIndex", "generate_evaluator"]


class _Source:
    def __init__(self, lean: bool = False, decisions: frozenset[str] = frozenset(), where: Callable[[str], str] = str) -> None:
        self.lean = lean
        self.where = where  # ``line:col`` -> ``file:line:col``
        self.decisions = decisions
        self.requested: dict[str, str] = {}  # decision -> the local holding the requested value
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self._ids: dict[int, str] = {}

    def const(self, value: Any) -> str:
        """Bind ``value`` to a constant name and return the name."""
        key = id(value) if not isinstance(value, (str, frozenset, tuple)) else hash((type(value), value))
        name = self._ids.get(key)
        if name is None or self.constants.get(name) != value:
            name = f"k{len(self.constants)}"
            self.constants[name] = value
            self._ids[key] = name
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)


_LOCALS = {"architecture": "arch", "model_type": "mtype"}


def _matcher(src: _Source, subject: str, values: list[str], negate: bool) -> str:
    if len(values) == 1:
        return f"{subject} {'!=' if negate else '=='} {src.const(values[0])}"
    return f"{subject} {'not in' if negate else 'in'} {src.const(frozenset(values))}"


def _condition(src: _Source, condition: dict[str, Any], decided: dict[str, str]) -> str:
    """A boolean expression over the locals of the generated function (``condition``: index data)."""
    terms: list[str] = []
    for subject, values, negate in condition["subjects"]:
        local = decided[subject] if subject in decided else _LOCALS[subject]
        terms.append(_matcher(src, local, values, negate))
    for subject, values, negate in condition["requested"]:
        terms.append(_matcher(src, src.requested[subject], values, negate))
    if condition["timeout"] is not None:
        terms.append("timeout is None" if condition["timeout"] == "null" else "timeout is not None")
    for feature, on in condition["features"]:
        terms.append(f"{src.const(feature)} {'in' if on else 'not in'} feats")
    for variable, values, negate in condition["env"]:
        terms.append(_matcher(src, f"env.get({src.const(variable)}, '')", values, negate))
    return " and ".join(f"({t})" for t in terms) if terms else "True"


def generate_evaluator(index: DecisionIndex, *, lean: bool = False, entry: bool = False) -> Any:
    """Generate the fast evaluator of a decision index: ``evaluate(ctx) -> (values, by, diags)``.

    ``lean`` evaluators skip formatting messages: their diagnostics carry id, severity and
    decision only. Analyses that evaluate every context of a domain (diff, lint) use them.

    ``entry`` generates ``make(policy_set)`` instead, which returns that set's
    ``resolve(config=None, /, **fields) -> Resolution``: the whole public call in one function. The common case (keyword fields
    among architecture, the decisions
    and the timeout, all plainly valid) is normalised inline; anything else goes through
    :meth:`DecisionIndex.normalise`, which checks and explains.
    """
    src = _Source(lean, index.decision_names, index.where)
    src.requested = {decision["name"]: f"r{number}" for number, decision in enumerate(index.decisions)}
    if entry:
        _entry_prologue(src, index)
    else:
        src.emit(0, "def evaluate(ctx):")
        _locals_from(src, 1, index)
    src.emit(1, "values = {}")
    src.emit(1, "by = {}")
    src.emit(1, "diags = []")
    decided: dict[str, str] = {}
    for number, decision in enumerate(index.decisions):
        _decision(src, index, number, decision, decided)
        decided[decision["name"]] = f"v{number}"
    for number, decision in enumerate(index.decisions):
        if decision["adjustments"]:
            _adjustments(src, number, decision["name"], index.undecided(decision["name"]), decision["adjustments"], decided)
    for constraint in index.data["constraints"]:
        src.emit(1, f"if {_condition(src, constraint['when'], decided)}:")
        _constraint(src, 2, constraint, decided)
    if entry:
        # A name the policy does not name that is one typo away from one it does: say so (an
        # error unless ``strict=False``); the set test is all a named architecture pays.
        src.emit(1, f"if arch is not None and arch not in {src.const(index.named)}:")
        src.emit(2, "miss = name_diagnostic(arch, strict)")
        src.emit(2, "if miss is not None:")
        src.emit(3, "diags.append(miss)")
    if lean:
        # Diagnostics come in a fixed order already (decision order, constraints by id); the
        # sort only moves errors first, which comparisons do not need.
        src.emit(1, "return values, by, diags")
    else:
        src.emit(1, "if len(diags) > 1:")
        src.emit(2, "diags.sort(key=diagnostic_order)")
        if entry:
            src.emit(1, "return new_resolution(Resolution, (values, by, tuple(diags), ctx, policy_set))")
        else:
            src.emit(1, "return values, by, tuple(diags)")
    namespace: dict[str, Any] = dict(src.constants)
    namespace.update(
        constraint_diagnostic=_lean_constraint if lean else index.constraint_diagnostic,
        notice_diagnostic=index.notice_diagnostic,  # lean code appends notices as constants
        settle=partial(index.settle, lean=True) if lean else index.settle,
        explicit_conflict=_lean_explicit if lean else index.explicit_conflict,
        diagnostic_order=index._order_key,
        normalise=index.normalise,
        name_diagnostic=index.name_diagnostic,
        strict_flag=index.strict_flag,
        new_resolution=tuple.__new__,
        new_diagnostic=tuple.__new__,
        Diagnostic=Diagnostic,
        Resolution=Resolution,
        NO_FEATURES=frozenset(),
        NO_ENV=MappingProxyType({}),
    )
    lines = src.lines
    if entry:
        # ``make(policy_set)`` returns that set's ``resolve``: a closure, so that a call is one
        # Python call with the caller's own keywords, not a method that calls this function.
        lines = ["def make(policy_set):", *("    " + line for line in lines), "    return resolve"]
    code = compile("\n".join(lines) + "\n", f"<kvpolicy {index.path}>", "exec")
    exec(code, namespace)  # noqa: S102 - generated from identifiers above, never from policy text
    function = namespace["make" if entry else "evaluate"]  # an Evaluator, a LeanEvaluator or an Entry
    function.__source__ = "\n".join(src.lines)
    return function


def _entry_prologue(src: _Source, index: DecisionIndex) -> None:
    """``resolve(config=None, /, **fields)``: inline normalisation of the common case."""
    fast_keys = frozenset({"architecture", "kv_transfer_timeout_ms", "features", *index.decision_names})
    src.emit(0, "def resolve(config=None, /, **fields):")
    src.emit(1, f"if config is None and fields.keys() <= {src.const(fast_keys)}:")
    src.emit(2, "get = fields.get")
    src.emit(2, "arch = get('architecture')")
    src.emit(2, f"timeout = get('kv_transfer_timeout_ms', {src.const(index.default_timeout_ms)})")
    src.emit(2, "feats = get('features', NO_FEATURES)")
    checks = [
        "(arch is None or (arch.__class__ is str and arch != ''))",
        "(timeout is None or (timeout.__class__ is int and timeout > 0))",
        f"(feats.__class__ is frozenset or feats.__class__ is set) and feats <= {src.const(index.features)}",
    ]
    requested = []
    for number, decision in enumerate(index.decisions):
        name = src.const(decision["name"])
        accepted = src.const(frozenset(index.requests(decision["name"])))
        src.emit(2, f"r{number} = get({name}, {src.const(decision['omitted'])})")  # a left-out field
        checks.append(f"r{number}.__class__ is str and r{number} in {accepted}")
        requested.append(f"{name}: r{number}")
    src.emit(2, f"if {' and '.join(checks)}:")
    # The common case keeps what it read in locals: the body reads no field back from ``ctx``.
    src.emit(3, "mtype = None")
    src.emit(3, "env = NO_ENV")
    src.emit(3, "strict = True")
    src.emit(3, "if feats.__class__ is not frozenset:")
    src.emit(4, "feats = frozenset(feats)")
    src.emit(
        3,
        f"ctx = {{'architecture': arch, 'model_type': None, 'kv_transfer_timeout_ms': timeout, 'features': feats, 'env': NO_ENV, {', '.join(requested)}}}",
    )
    src.emit(2, "else:")
    src.emit(3, "strict = strict_flag(fields)")
    src.emit(3, "ctx = normalise(None, fields)")
    _off_or_locals(src, 3, index)
    src.emit(1, "else:")
    src.emit(2, "strict = strict_flag(fields)")
    src.emit(2, "ctx = normalise(config, fields)")
    _off_or_locals(src, 2, index)


def _off_or_locals(src: _Source, depth: int, index: DecisionIndex) -> None:
    """After a checked normalisation: the answer when disaggregation is off, else the locals."""
    src.emit(depth, "if ctx['backend'] is None:")
    src.emit(depth + 1, "return new_resolution(Resolution, ({}, {}, (), ctx, policy_set))")
    _locals_from(src, depth, index)


def _locals_from(src: _Source, depth: int, index: DecisionIndex) -> None:
    """The locals the body reads, from a normalised context."""
    src.emit(depth, "arch = ctx['architecture']")
    src.emit(depth, "mtype = ctx['model_type']")
    src.emit(depth, "timeout = ctx['kv_transfer_timeout_ms']")
    src.emit(depth, "feats = ctx['features']")
    src.emit(depth, "env = ctx['env']")
    for number, decision in enumerate(index.decisions):
        src.emit(depth, f"r{number} = ctx[{src.const(decision['name'])}]")


def _lean_constraint(constraint: Any, ctx: Any, values: Any) -> Diagnostic:
    return Diagnostic(constraint["id"], constraint["severity"], "", constraint["decision"], "")


def _lean_explicit(name: str, rule: Any, value: str) -> Diagnostic:
    return Diagnostic(rule[0], "error", "", name, "")


def _decision(src: _Source, index: DecisionIndex, number: int, decision: dict[str, Any], decided: dict[str, str]) -> None:
    var = f"v{number}"
    rule = f"b{number}"
    name = src.const(decision["name"])
    requirements = [(r, index.requirement(r)) for r in decision["requirements"]]
    undecided = index.undecided(decision["name"])
    src.emit(1, f"{var} = r{number}")
    if len(undecided) == 1:
        src.emit(1, f"if {var} != {src.const(decision['auto'])}:")
    else:
        src.emit(1, f"if {var} not in {src.const(undecided)}:")
    src.emit(2, f"{rule} = 'explicit'")
    for r, compiled in requirements:  # each requirement that holds and disagrees, in id order
        src.emit(2, f"if ({_condition(src, r['when'], decided)}) and {var} != {src.const(r['value'])}:")
        src.emit(3, f"diags.append(explicit_conflict({name}, {src.const(compiled)}, {var}))")
    src.emit(1, "else:")
    src.emit(2, f"{var} = None")
    depth = 2
    if requirements:
        src.emit(2, "held = None")
        for r, compiled in requirements:
            src.emit(2, f"if {_condition(src, r['when'], decided)}:")
            src.emit(3, f"held = (held or ()) + ({src.const(compiled)},)")
        src.emit(2, "if held is not None:")
        src.emit(3, f"{var}, {rule} = settle({name}, ctx, values, diags, held)")
        src.emit(2, f"if {var} is None:")
        depth = 3
    rows = decision["rows"]
    if rows:
        plain = {architecture: (value, row_id) for architecture, (value, row_id) in rows["plain"].items()}
        if rows["qualified"]:
            qualified = {(a, m): (value, row_id) for a, m, value, row_id in rows["qualified"]}
            src.emit(depth, f"row = {src.const(qualified)}.get((arch, mtype)) or {src.const(plain)}.get(arch)")
        else:
            src.emit(depth, f"row = {src.const(plain)}.get(arch)")
        src.emit(depth, "if row is not None:")
        adopt = _condition(src, decision["adopt"], decided)
        if adopt == "True":
            src.emit(depth + 1, f"{var}, {rule} = row")
        else:
            src.emit(depth + 1, f"if {adopt}:")
            src.emit(depth + 2, f"{var}, {rule} = row")
            if decision["on_not_adopted"] is not None:
                src.emit(depth + 1, "else:")
                _notice_statement(src, depth + 2, decision["on_not_adopted"], decision["name"], var, decided, None, "row[0]")
        src.emit(depth, f"if {var} is None:")
        depth += 1
    keyword = "if"
    for r in decision["conditionals"]:
        src.emit(depth, f"{keyword} {_condition(src, r['when'], decided)}:")
        _settle(src, depth + 1, var, rule, r, decision["name"], decided)
        keyword = "elif"
    if decision["conditionals"]:
        src.emit(depth, "else:")
        depth += 1
    _settle(src, depth, var, rule, decision["default"], decision["name"], decided)
    src.emit(1, f"values[{name}] = {var}")
    src.emit(1, f"by[{name}] = {rule}")


def _adjustments(src: _Source, number: int, name: str, undecided: frozenset[str], rules: Any, decided: dict[str, str]) -> None:
    """Creation-time rewrites: the first that holds, unless the decision was explicit."""
    var, key = f"v{number}", src.const(name)
    src.emit(1, f"if {src.requested[name]} in {src.const(undecided)}:")
    keyword = "if"
    for r in rules:
        src.emit(2, f"{keyword} {_condition(src, r['when'], decided)}:")
        _settle(src, 3, var, f"b{number}", r, name, decided)
        src.emit(3, f"values[{key}] = {var}")
        src.emit(3, f"by[{key}] = b{number}")
        keyword = "elif"


def _settle(src: _Source, depth: int, var: str, rule: str, compiled: dict[str, Any], name: str, decided: dict[str, str]) -> None:
    key = src.const(name)
    src.emit(depth, f"{var} = {src.const(compiled['value'])}")
    src.emit(depth, f"{rule} = {src.const(compiled['id'])}")
    if compiled["notice"] is not None:
        src.emit(depth, f"values[{key}] = {var}")
        _notice_statement(src, depth, compiled["notice"], name, var, decided, var, None)


# -- diagnostics, formatted inline ---------------------------------------------------------------------
#
# A diagnostic's message is built where the rule fires, from the locals of the generated function
# (``v0``, ``arch``, ...), by concatenation: no call to a formatter. A message without placeholders
# makes the whole diagnostic one constant. The result is the same as DecisionIndex.notice_diagnostic
# and constraint_diagnostic give (the interpreter, which uses its own formatter, is checked against
# it), and those stay the path for a template this form does not cover.


def _field(src: _Source, field: str, current: str, var: str, decided: dict[str, str], preferred: str | None) -> str:
    """The expression of one placeholder, as :func:`kvpolicy.evaluate.index.compile_message` reads it."""
    if field in src.decisions:
        local = var if field == current else decided.get(field)
        return f"({local} or 'none')" if local else "'none'"  # not decided yet: absent from the values
    if field == "architecture":
        return "(arch or 'this architecture')"
    if field == "model_type":
        return "(mtype or 'none')"
    if field == "kv_transfer_timeout_ms":
        return "('null' if timeout is None else str(timeout))"
    if field == "preferred":
        return f"({preferred} or 'none')" if preferred else "'none'"
    return "'none'"


def _message(src: _Source, template: str, current: str, var: str, decided: dict[str, str], preferred: str | None) -> tuple[str, str | None] | None:
    """``(expression, text)`` of a message: ``text`` when it has no placeholder (a constant);
    None when it uses a format spec or conversion (the loader refuses those; the runtime path
    then formats it)."""
    try:
        pieces = list(formatter_parser(template))
    except ValueError:
        return None
    parts: list[str] = []
    literal_only = True
    for literal, field, spec, conversion in pieces:
        if literal:
            parts.append(src.const(literal))
        if field is None:
            continue
        if spec or conversion:
            return None
        literal_only = False
        parts.append(_field(src, field, current, var, decided, preferred))
    if literal_only:
        text = "".join(literal for literal, _, _, _ in pieces)
        return src.const(text), text
    return " + ".join(parts), None


def _notice_statement(
    src: _Source, depth: int, notice: list[str], decision: str, var: str, decided: dict[str, str], value: str | None, preferred: str | None
) -> None:
    """Append the diagnostic of a notice (``value``/``preferred``: expressions, or None)."""
    rule_id, severity, position, template = notice
    where = src.where(position)
    if src.lean:
        src.emit(depth, f"diags.append({src.const(Diagnostic(rule_id, severity, '', decision, ''))})")
        return
    message = _message(src, template, decision, var, decided, preferred)
    if message is None:
        src.emit(
            depth,
            f"diags.append(notice_diagnostic({src.const((rule_id, severity, where, template))}, {src.const(decision)}, ctx, values, "
            f"{value or 'None'}, {preferred or 'None'}))",
        )
    elif message[1] is not None:
        src.emit(depth, f"diags.append({src.const(Diagnostic(rule_id, severity, message[1], decision, where, ''))})")
    else:
        head = f"{src.const(rule_id)}, {src.const(severity)}"
        src.emit(depth, f"diags.append(new_diagnostic(Diagnostic, ({head}, {message[0]}, {src.const(decision)}, {src.const(where)}, '')))")


def _constraint(src: _Source, depth: int, constraint: dict[str, Any], decided: dict[str, str]) -> None:
    """Append the diagnostic of a constraint that fired (every decision is made by now)."""
    if src.lean:
        diagnostic = Diagnostic(constraint["id"], constraint["severity"], "", constraint["decision"], "")
        src.emit(depth, f"diags.append({src.const(diagnostic)})")
        return
    message = _message(src, constraint["message"], "", "", decided, None)
    fix = _message(src, constraint["fix"], "", "", decided, None)
    if message is None or fix is None:
        src.emit(depth, f"diags.append(constraint_diagnostic({src.const(constraint)}, ctx, values))")
        return
    location = src.where(constraint["location"])
    rule_id, severity, decision = (src.const(constraint[k]) for k in ("id", "severity", "decision"))
    where = src.const(location)
    if message[1] is not None and fix[1] is not None:
        diagnostic = Diagnostic(constraint["id"], constraint["severity"], f"{message[1]} To fix: {fix[1]}.", constraint["decision"], location, fix[1])
        src.emit(depth, f"diags.append({src.const(diagnostic)})")
        return
    src.emit(depth, f"fx = {fix[0]}")
    src.emit(
        depth,
        f"diags.append(new_diagnostic(Diagnostic, ({rule_id}, {severity}, {message[0]} + ' To fix: ' + fx + '.', {decision}, {where}, fx)))",
    )


class CompiledIndex(DecisionIndex):
    """A decision index with its generated evaluators: :attr:`entry` (the whole ``resolve``
    call, built at once), and :meth:`evaluate` and :meth:`outcome` (built on first use)."""

    def __init__(self, data: dict[str, Any], path: str) -> None:
        super().__init__(data, path)
        self._fast: Evaluator | None = None
        self._lean: LeanEvaluator | None = None
        self.entry: Entry = generate_evaluator(self, entry=True)

    def evaluate(self, ctx: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], tuple[Diagnostic, ...]]:
        """Values, deciding rules and diagnostics of a normalised context."""
        if self._fast is None:
            self._fast = generate_evaluator(self)
        return self._fast(ctx)

    def outcome(self, ctx: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], list[Diagnostic]]:
        """As :meth:`evaluate`, with diagnostics without messages or locations, unsorted."""
        if self._lean is None:
            self._lean = generate_evaluator(self, lean=True)
        return self._lean(ctx)
