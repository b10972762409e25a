"""What is true for every model a context may be about.

A resolution answers for one model. When the architecture is unknown (a config whose checkpoint
could not be read, an API call without one), "can start" would be a promise kvpolicy cannot keep:
the answer may depend on the model. A :class:`Verdict` resolves the context once per class of
models the policy tells apart (each architecture it names, with each model_type that matters for
it, and "any other"; :meth:`kvpolicy.evaluate.index.DecisionIndex.models`, the same partition the diff
enumerates) and groups the classes by outcome, so it can say "starts for every architecture", or
"depends on the model: cannot start for X, Y; starts for any other".

One representative per class is exact: within a class every model resolves alike, because the
policy reads nothing of the model but its architecture and model_type.
"""

from __future__ import annotations

from ..records import FrozenRecord

TYPE_CHECKING = False  # typing (and dataclasses) cost a cold `kvpolicy resolve` milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from .resolution import Resolution

__all__ = [
    "CANNOT_START",
    "DEPENDS",
    "EXIT_CODES",
    "OFF",
    "STARTS",
    "Outcome",
    "Verdict",
    "model_label",
    "resolve_model",
    "verdict_of",
    "verdict_of_sides",
]

STARTS = "starts"
CANNOT_START = "cannot start"
DEPENDS = "depends on the model"
OFF = "off"

#: The CLI's exit code per status: 0 starts for every possibility (or nothing to start),
#: 1 cannot start, 3 depends on the model (2 is bad input).
EXIT_CODES = {STARTS: 0, OFF: 0, CANNOT_START: 1, DEPENDS: 3}

if TYPE_CHECKING:
    Model = tuple[str | None, str | None]


def model_label(model: Model) -> str:
    """``LlamaForCausalLM``, ``DeepseekV3ForCausalLM (model_type glm_moe_dsa)``, ``any other architecture``."""
    architecture, model_type = model
    text = architecture or "any other architecture"
    return text + (f" (model_type {model_type})" if model_type else "")


class Outcome(FrozenRecord):
    """The models that resolve alike, and how: ``models``, one resolution per side in
    ``resolutions`` (one side for a context), and ``problem``: why the sides together cannot start
    though each can (e.g. they disagree on the runtime), or None."""

    __slots__ = ("models", "resolutions", "problem")
    _defaults = {"problem": None}
    models: tuple[Model, ...]
    resolutions: tuple[Resolution, ...]
    problem: str | None

    @property
    def ok(self) -> bool:
        """Whether every side starts (and the sides can talk)."""
        return self.problem is None and all(r.ok for r in self.resolutions)

    @property
    def resolution(self) -> Resolution:
        """The first side's resolution (the only one for a single context)."""
        return self.resolutions[0]

    @property
    def labels(self) -> list[str]:
        """The models as a person reads them; "any other architecture" last."""
        return [model_label(m) for m in sorted(self.models, key=lambda m: (m[0] is None, m[0] or "", m[1] or ""))]

    def error_ids(self) -> tuple[str, ...]:
        """The ids of the errors that stop it (``sides-disagree`` for a pairing problem)."""
        ids = sorted({d.id for r in self.resolutions for d in r.errors})
        return (*ids, "sides-disagree") if self.problem else tuple(ids)


class Verdict(FrozenRecord):
    """Whether a context (or a config's sides) starts, for every model it may be about: ``outcomes``,
    one per distinct outcome (a single one when the model is known), and ``known``, whether the
    architecture was known."""

    __slots__ = ("outcomes", "known")
    outcomes: tuple[Outcome, ...]
    known: bool

    @property
    def status(self) -> str:
        """``starts``, ``cannot start``, ``depends on the model`` or ``off`` (disaggregation off)."""
        if all(not r.enabled for o in self.outcomes for r in o.resolutions):
            return OFF
        oks = {o.ok for o in self.outcomes}
        if oks == {True}:
            return STARTS
        if oks == {False}:
            return CANNOT_START
        return DEPENDS

    @property
    def exit_code(self) -> int:
        """0 starts for every possibility, 1 cannot start, 3 depends on the model."""
        return EXIT_CODES[self.status]

    @property
    def failing(self) -> tuple[Outcome, ...]:
        """The outcomes that cannot start."""
        return tuple(o for o in self.outcomes if not o.ok)

    @property
    def starting(self) -> tuple[Outcome, ...]:
        """The outcomes that start."""
        return tuple(o for o in self.outcomes if o.ok)

    def summary(self) -> str:
        """One line: what is true for every possibility."""
        status = self.status
        if status == OFF:
            return "disaggregation is off: nothing to start"
        if self.known:
            return "ok: this configuration can start" if status == STARTS else "this configuration cannot start"
        if status == STARTS:
            return "the architecture is unknown, but this configuration starts for every architecture"
        if status == CANNOT_START:
            return "the architecture is unknown, and this configuration cannot start for any architecture"
        fails = _names([label for o in self.failing for label in o.labels])
        starts = _names([label for o in self.starting for label in o.labels])
        return f"depends on the model: cannot start for {fails}; starts for {starts}"

    def to_dict(self, *, resolutions: bool = False, explain: bool = False) -> dict[str, Any]:
        """A JSON-ready form: status, whether the architecture was known, one entry per outcome;
        with ``resolutions``, each outcome's resolutions too (with ``explain``, their traces)."""
        data = self._summary_dict()
        if resolutions:
            for entry, outcome in zip(data["outcomes"], self.outcomes):
                entry["resolutions"] = [r.to_dict() for r in outcome.resolutions]
                if explain:
                    for item, r in zip(entry["resolutions"], outcome.resolutions):
                        item["trace"] = [step._asdict() for step in r.trace]
        return data

    def _summary_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "architecture_known": self.known,
            "summary": self.summary(),
            "outcomes": [
                {
                    "architectures": [{"architecture": a, "model_type": t} for a, t in o.models],
                    "ok": o.ok,
                    "error_ids": list(o.error_ids()),
                    **({"problem": o.problem} if o.problem else {}),
                }
                for o in self.outcomes
            ],
        }


def _names(labels: list[str]) -> str:
    other = [label for label in labels if label.startswith("any other")]
    named = sorted(label for label in labels if not label.startswith("any other"))
    return ", ".join(named + other)


def resolve_model(policy_set: Any, resolution: Resolution, model: Model) -> Resolution:
    """``resolution``'s context answered for another model by ``policy_set``."""
    context = dict(resolution.context)
    context["architecture"], context["model_type"] = model
    return policy_set.resolve_normalised(context)


def verdict_of(policy_set: Any, resolution: Resolution) -> Verdict:
    """The verdict on one resolved context: itself when its architecture is known, else over every
    class of models ``policy_set`` tells apart."""
    return verdict_of_sides(policy_set, [resolution])


def verdict_of_sides(policy_set: Any, resolutions: Sequence[Resolution], pairing: Callable[[Sequence[Resolution]], str | None] | None = None) -> Verdict:
    """The verdict on the sides of one config (one model): each side resolved, then ``pairing``
    (which may say why the sides cannot talk). With an unknown architecture every class of models
    is resolved on every side; classes with the same values and errors on every side are grouped."""
    pair = pairing or (lambda _: None)
    if all(r.architecture_known for r in resolutions):
        models = tuple((r.context.get("architecture"), r.context.get("model_type")) for r in resolutions[:1])
        return Verdict((Outcome(models, tuple(resolutions), pair(resolutions)),), True)
    groups: dict[Any, tuple[list[Model], tuple[Resolution, ...], str | None]] = {}
    for model in policy_set.models():
        answered = tuple(r if r.architecture_known else resolve_model(policy_set, r, model) for r in resolutions)
        problem = pair(answered)
        key = (
            tuple((tuple(r.values.items()), tuple(sorted(d.id for d in r.errors))) for r in answered),
            problem is not None,
        )
        if key in groups:
            groups[key][0].append(model)
            if model == (None, None):  # "any other" speaks for its group: its rules are the defaults
                groups[key] = (groups[key][0], answered, problem)
        else:
            groups[key] = ([model], answered, problem)
    outcomes = tuple(Outcome(tuple(models_), answered, problem) for models_, answered, problem in groups.values())
    return Verdict(outcomes, False)
