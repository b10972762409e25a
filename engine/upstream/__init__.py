"""Keeping policy versions true to upstream: read TensorRT-LLM's own source (never imported), report
drift from a policy version, draft the next one. See docs/upstream.md."""

from __future__ import annotations

from typing import Any

__all__ = ["Drift", "Facts", "TreeError", "UpstreamTree", "check", "compare", "extract", "installed_tree", "open_tree"]

from .drift import Drift, compare
from .extract import Facts, extract
from .source import TreeError, UpstreamTree, installed_tree, open_tree


def check(tree: str | None = None, *, policy: object = None) -> list[Drift]:
    """Drift between a TensorRT-LLM tree (a path; None: the installed package) and a policy version
    (a :class:`kvpolicy.PolicySet` or :class:`kvpolicy.read.model.Policy`; None: the shipped newest)."""
    from ..evaluate.policyset import load

    source = installed_tree() if tree is None else open_tree(tree)
    chosen = load() if policy is None else policy
    model: Any = getattr(chosen, "policy", chosen)
    return compare(extract(source), model)
