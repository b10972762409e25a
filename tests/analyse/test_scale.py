"""The diff evaluates one representative per class of models both versions treat alike, so its
work does not grow with the number of preference rows; expanding the classes back stays exact."""

from __future__ import annotations

import random

from kvpolicy.analyse.diff import diff_policies
from kvpolicy.analyse.evaluators import outcome_of
from kvpolicy.analyse.partition import model_classes
from kvpolicy.evaluate.domain import domain_of
from kvpolicy.read.loader import parse_policy, shipped_root
from kvpolicy.evaluate.policyset import PolicySet


def with_rows(rows: int, flipped: set[int]) -> PolicySet:
    """The newest shipped policy with ``rows`` generated runtime rows, ``flipped`` ones changed."""
    text = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")
    extra = "".join(
        f'  {{ architecture = "Synth{i}ForCausalLM", value = "{"PYTHON" if (i % 2) != (i in flipped) else "CPP"}" }},\n'
        for i in range(rows)
    )
    header = text.index("[decisions.transceiver_runtime.preference]")
    anchor = text.index("rows = [\n", header) + len("rows = [\n")
    return PolicySet(parse_policy((text[:anchor] + extra + text[anchor:]).encode(), "generated.toml"))


def test_model_classes_do_not_grow_with_rows():
    counts = []
    for rows in (20, 2_000):
        old, new = with_rows(rows, set()), with_rows(rows, {0, 10})
        dimensions = domain_of(old.policy, new.policy).dimensions()
        members, reduced = model_classes((old.policy, new.policy), dimensions)
        counts.append(len(reduced[0].values))
        # The classes partition the model dimension.
        every = [m for group in members.values() for m in group]
        assert len(every) == len(set(every)) and set(every) == set(dimensions[0].values)
        assert set(reduced[0].values) == set(members)
    assert counts[0] == counts[1]


def test_many_rows_diff_is_exact_on_sampled_contexts():
    old, new = with_rows(600, set()), with_rows(600, {0, 10, 333})
    result = diff_policies(old, new)
    changed = {f"Synth{i}ForCausalLM" for i in (0, 10, 333)}
    rng = random.Random(5)
    dimensions = result.dimensions
    for _ in range(300):
        point = tuple(rng.choice(d.values) for d in dimensions)
        if rng.random() < 0.5:  # aim at the changed architectures half of the time
            target = rng.choice(sorted(changed))
            model = next(m for m in dimensions[0].values if m[0] == target)
            point = (model, *point[1:])
        ctx = {"features": frozenset(), "env": {}}
        for dimension, value in zip(dimensions, point):
            if dimension.name == "model":
                ctx["architecture"], ctx["model_type"] = value
            elif dimension.name.startswith("env:"):
                if value != "":
                    ctx["env"][dimension.name[4:]] = value
            elif dimension.name.startswith("feature:"):
                if value:
                    ctx["features"] = ctx["features"] | {dimension.name[8:]}
            else:
                ctx[dimension.name] = value
        differs = outcome_of(old, ctx) != outcome_of(new, ctx)
        assert (result.group_of(point) is not None) == differs, ctx
        if ctx["architecture"] not in changed:
            assert not differs
