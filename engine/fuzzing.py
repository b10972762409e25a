"""Fuzz targets of the loader and the resolver, shared by the hypothesis suite and bench/fuzz.py.

Each target feeds one input and classifies the outcome; anything other than the documented
outcomes (a policy or a ``PolicyError``; a resolution or a ``ContextError``) propagates as the
crash a fuzzer is looking for.
"""

from __future__ import annotations

from typing import Any

from .errors import ContextError, PolicyError
from .read.loader import parse_policy
from .evaluate.policyset import PolicySet
from .evaluate.resolution import Resolution

__all__ = ["load_target", "resolve_target"]


def load_target(raw: bytes) -> str:
    """Load policy bytes and resolve one context with them: ``policy`` or ``policy-error``."""
    try:
        policy_set = PolicySet(parse_policy(raw, "fuzz.toml"))
    except PolicyError as exc:
        assert exc.problems, "a PolicyError always names at least one problem"
        for problem in exc.problems:
            assert problem.location.line >= 1 and problem.location.column >= 1
        return "policy-error"
    try:
        policy_set.resolve()
    except ContextError:
        pass  # a policy may legitimately reject the default context (e.g. no such backend)
    return "policy"


def resolve_target(policy_set: PolicySet, config: Any, fields: dict[str, Any]) -> str:
    """Resolve arbitrary input: ``resolution`` or ``context-error``."""
    try:
        resolution = policy_set.resolve(config, **fields)
    except ContextError:
        return "context-error"
    assert isinstance(resolution, Resolution)
    _ = resolution.trace, resolution.to_dict()
    return "resolution"
