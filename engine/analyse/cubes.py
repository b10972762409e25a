"""Sets of contexts as cubes, and the exact operations the diff performs on them.

A *cube* holds one set of values per dimension of a domain (see :mod:`kvpolicy.evaluate.domain`), in
the order of the domain's dimensions: it stands for every context whose value on each dimension lies
in that dimension's set. The evaluators split cubes, the diff merges and factors them, the
descriptions put them in words; every operation here keeps a set of cubes exact (it describes the
same contexts, no more and no fewer).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from functools import reduce
from typing import Any

from ..evaluate.domain import Dimension

__all__ = ["Cube", "bounding_box", "cube_order", "intersect", "merge", "points", "size_of"]

#: One set of values per dimension, in the order of the domain's dimensions.
Cube = tuple[frozenset, ...]


def merge(cubes: list[Cube]) -> list[Cube]:
    """Merge disjoint cubes that agree on every dimension but one, until none do.

    The union of two disjoint cubes that differ in one dimension is the cube with the union of
    that dimension's sets, so every merge keeps the cubes exact and disjoint."""
    current = set(cubes)
    if len(current) < 2:
        return list(current)
    width = len(next(iter(current)))
    changed = True
    while changed:
        changed = False
        for i in range(width):
            buckets: dict[tuple, list[frozenset]] = {}
            for cube in current:
                buckets.setdefault(cube[:i] + cube[i + 1 :], []).append(cube[i])
            if len(buckets) < len(current):
                changed = True
                current = {key[:i] + (reduce(frozenset.union, sets),) + key[i:] for key, sets in buckets.items()}
    return sorted(current, key=cube_order)


def bounding_box(cubes: list[Cube]) -> Cube:
    """The smallest cube that holds every one of ``cubes`` (on each dimension, the union of their sets)."""
    return tuple(reduce(frozenset.union, column) for column in zip(*cubes))


def intersect(a: Cube, b: Cube) -> Cube:
    """The contexts in both cubes (empty on some dimension when there are none)."""
    return tuple(x & y for x, y in zip(a, b))


def cube_order(cube: Cube) -> tuple:
    """A sort key that orders cubes the same way in every process (values compared by ``repr``)."""
    return tuple(sorted(map(repr, values)) for values in cube)


def size_of(cube: Cube) -> int:
    """How many points of the full product a cube holds."""
    count = 1
    for values in cube:
        count *= len(values)
    return count


def points(dimensions: tuple[Dimension, ...]) -> Iterator[tuple[Any, ...]]:
    """Every point of the full product (for tests and small domains)."""
    return itertools.product(*(d.values for d in dimensions))
