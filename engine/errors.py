"""The errors kvpolicy raises. Each says where the problem is and what to change.

(:class:`kvpolicy.ResolutionError`, raised for a resolution that carries errors, lives with the
resolution in :mod:`kvpolicy.evaluate.resolution`.)"""

from __future__ import annotations

__all__ = ["ContextError", "FrozenRecord", "Location", "PolicyError", "PolicyProblem"]


class FrozenRecord:
    """An immutable value with named fields: equality, hash, repr and pickling by fields.

    What ``@dataclass(frozen=True, slots=True)`` gives, without importing dataclasses (and
    inspect, ast, dis with it): ~10 ms of a cold `kvpolicy resolve`, which imports this module.
    """

    __slots__: tuple[str, ...] = ()

    def __init__(self, *args: object, **kwargs: object) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}() takes at most {len(names)} arguments")
        given: dict[str, object] = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names or name in given:
                raise TypeError(f"{type(self).__name__}() got an unexpected or repeated argument {name!r}")
            given[name] = value
        for name in names:
            if name in given:
                value = given[name]
            elif name in self._defaults:
                value = self._defaults[name]
            else:
                raise TypeError(f"{type(self).__name__}() missing argument {name!r}")
            object.__setattr__(self, name, value)

    _defaults: dict[str, object] = {}

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({shown})"

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), self._fields())


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
