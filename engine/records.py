"""Immutable records without dataclasses: the base of kvpolicy's small value types (locations,
problems, choices, verdicts) on the cold path of ``kvpolicy resolve``."""

from __future__ import annotations

__all__ = ["FrozenRecord"]


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
