"""Notes on a context that resolves, but probably not as meant: an environment variable with a
value the policy never reads as set.

They change nothing in the resolution; the CLI prints them so a typo does not pass silently. (A
misspelt architecture is an error diagnostic of the resolution itself, a warning under
``strict=False``: see :meth:`kvpolicy.evaluate.index.DecisionIndex.name_diagnostic`.)
"""

from __future__ import annotations

from collections.abc import Mapping

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING:
    from ..read.model import Policy

__all__ = ["context_notes", "known_env", "notes", "read_env"]


def _conditions(policy: Policy) -> list[Any]:
    conditions = [r.when for r in policy.rules()] + [c.when for c in policy.constraints]
    return conditions + [d.preference.adopt_when for d in policy.decisions.values() if d.preference]


def read_env(policy: Policy) -> frozenset[str]:
    """Every variable the policy reads: in a condition (one tested as "any value but X" too) or as a
    feature's switch."""
    names = {f.env for f in policy.features.values() if f.env}
    for condition in _conditions(policy):
        names.update(condition.env)
    return frozenset(names)


def known_env(policy: Policy) -> dict[str, set[str]]:
    """Variables the policy reads -> the values it tests for (a feature's variable: "1"); a variable
    tested as "any value but X" is left out (every value of it is read, so none is a typo)."""
    known: dict[str, set[str]] = {}
    negated: set[str] = set()
    for condition in _conditions(policy):
        for variable, matcher in condition.env.items():
            if matcher.negate:  # "any value but X": every other value is read
                negated.add(variable)
            known.setdefault(variable, set()).update(matcher.values)
    for feature in policy.features.values():
        if feature.env:
            known.setdefault(feature.env, set()).add("1")
    return {variable: values for variable, values in known.items() if variable not in negated}


def context_notes(policy: Policy, context: Mapping[str, Any]) -> list[str]:
    """Notes for a normalised context (``Resolution.context``) under ``policy``."""
    return notes(policy.version, policy.architectures(), known_env(policy), context)


def notes(version: str, named: list[str], known: Mapping[str, Any], context: Mapping[str, Any]) -> list[str]:
    """Notes for a normalised context under the policy ``version`` that names the architectures
    ``named`` and reads the environment variables ``known`` (variable -> the values it tests)."""
    found: list[str] = []
    # A misspelt architecture is a diagnostic of the resolution itself (architecture-near-miss).
    env = dict(context.get("env") or {})  # the values as written (a set-empty variable reads as "")
    for variable, accepted in sorted(known.items()):
        value = env.get(variable)
        if value is not None and value not in accepted:
            wanted = " or ".join(repr(v) for v in sorted(accepted))
            found.append(
                f"{variable}={value!r} is ignored: policy {version} reads it only as {wanted}"
                f"{' (set it to ' + repr(sorted(accepted)[0]) + ')' if len(accepted) == 1 else ''}"
            )
    return found
