"""The errors kvpolicy raises. Each says where the problem is and what to change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .source import Location

if TYPE_CHECKING:
    from .resolution import Diagnostic

__all__ = ["ContextError", "PolicyError", "PolicyProblem", "ResolutionError"]


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """One problem in a policy file: where, which check found it, and what to change."""

    location: Location
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.check}: {self.message}"


class PolicyError(ValueError):
    """A policy file or folder cannot be used. ``problems`` lists every problem found, not only the first."""

    def __init__(self, problems: list[PolicyProblem] | PolicyProblem) -> None:
        self.problems: tuple[PolicyProblem, ...] = (
            (problems,) if isinstance(problems, PolicyProblem) else tuple(problems)
        )
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in policy"
        super().__init__(head + ":\n" + "\n".join(f"  {problem}" for problem in self.problems))


class ContextError(ValueError):
    """The serving context given to ``resolve`` has an unknown field or an invalid value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class ResolutionError(ValueError):
    """Raised by ``Resolution.raise_for_errors()`` when a resolution carries errors."""

    def __init__(self, errors: tuple[Diagnostic, ...]) -> None:
        self.errors = errors
        lines = [f"  [{d.id}] {d.message}" for d in errors]
        super().__init__("the configuration cannot start:\n" + "\n".join(lines))
