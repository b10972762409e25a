"""Points of a policy's domain (kvpolicy.evaluate.domain) as contexts."""

from __future__ import annotations

from typing import Any


def context_of(dimensions: Any, point: tuple[Any, ...]) -> dict[str, Any]:
    """The normalised context of a point of the domain."""
    ctx: dict[str, Any] = {"features": frozenset(), "env": {}}
    for dimension, value in zip(dimensions, point):
        name = dimension.name
        if name == "model":
            ctx["architecture"], ctx["model_type"] = value
        elif name.startswith("env:"):
            if value != "":
                ctx["env"][name[4:]] = value
        elif name.startswith("feature:"):
            if value:
                ctx["features"] = ctx["features"] | {name[8:]}
        else:
            ctx[name] = value
    return ctx
