"""The errors kvpolicy raises. Each says where the problem is and what to change.

(:class:`kvpolicy.ResolutionError`, raised for a resolution that carries errors, lives with the
resolution in :mod:`kvpolicy.evaluate.resolution`.)"""

from __future__ import annotations

from .records import FrozenRecord

__all__ = ["ContextError", "Location", "PolicyError", "PolicyProblem"]


_set = object.__setattr__


class Location(FrozenRecord):
    """A position in a policy file: 1-based line and column."""

    __slots__ = ("path", "line", "column")
    __match_args__ = ("path", "line", "column")
    _defaults = {"line": 1, "column": 1}
    path: str
    line: int
    column: int

    def __init__(self, path: str, line: int = 1, column: int = 1) -> None:
        # The generic constructor above, spelled out: the loader makes one Location per row.
        _set(self, "path", path)
        _set(self, "line", line)
        _set(self, "column", column)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


class PolicyProblem(FrozenRecord):
    """One problem in a policy file: where, which check found it, and what to change."""

    __slots__ = ("location", "check", "message")
    __match_args__ = ("location", "check", "message")
    location: Location
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.check}: {self.message}"


class PolicyError(ValueError):
    """A policy file or folder cannot be used. ``problems`` lists every problem found, not only the first."""

    def __init__(self, problems: list[PolicyProblem] | PolicyProblem) -> None:
        self.problems: tuple[PolicyProblem, ...] = (problems,) if isinstance(problems, PolicyProblem) else tuple(problems)
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in policy"
        super().__init__(head + ":\n" + "\n".join(f"  {problem}" for problem in self.problems))


class ContextError(ValueError):
    """The serving context given to ``resolve`` has an unknown field or an invalid value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message
