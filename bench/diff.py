"""Benchmark ``kvpolicy diff``: the symbolic diff against brute force, side by side.

For every pair of shipped versions: the symbolic diff with grouping and the text report
(what ``kvpolicy diff`` does after loading), against enumerating every representative context of
the joint domain and evaluating both versions on it with the engine's fast evaluator (no grouping
at all). Prints seconds and the ratio. Run: ``python bench/diff.py``.
"""

from __future__ import annotations

import itertools
import time

import kvpolicy
from kvpolicy.cli.diff import render_text
from kvpolicy.diff import diff_policies
from kvpolicy.domain import domain_of


def best_of(repeat: int, work) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def brute_force(old: kvpolicy.PolicySet, new: kvpolicy.PolicySet) -> int:
    changed = 0
    for ctx in domain_of(old.policy, new.policy).contexts():
        a, b = old.outcome(ctx), new.outcome(ctx)
        if a[0] != b[0] or a[1] != b[1] or sorted(a[2]) != sorted(b[2]):
            changed += 1
    return changed


def main() -> None:
    sets = {v: kvpolicy.load(version=v) for v in kvpolicy.load().versions()}
    print(f"{'old':<11} {'new':<11} {'contexts':>9} {'symbolic s':>11} {'brute s':>9} {'ratio':>7}")
    worst = 0.0
    for old_version, new_version in itertools.combinations(sets, 2):
        old, new = sets[old_version], sets[new_version]
        size = domain_of(old.policy, new.policy).size()
        symbolic = best_of(3, lambda: render_text(diff_policies(old, new)))
        brute = best_of(1, lambda: brute_force(old, new))
        worst = max(worst, symbolic)
        print(f"{old_version:<11} {new_version:<11} {size:>9,} {symbolic:>11.3f} {brute:>9.3f} {brute / symbolic:>6.1f}x")
    print(f"\nslowest symbolic diff with grouping and text: {worst:.3f} s (target: under 2 s)")


if __name__ == "__main__":
    main()
