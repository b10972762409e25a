"""Benchmark ``kvpolicy diff``: what the output costs against loading a policy, side by side.

One run measures, in CPU time (these machines are shared and noisy) and bytes:

- **edit-sized JSON**: two 10,000-row versions (the newest shipped policy with generated runtime
  preference rows, ``bench/resolve.py``'s generator) with 1% of the rows flipped. ``diff --format
  json`` (the diff, the edit and the JSON text, after loading) against loading one version without
  the cache; the same with ``--contexts`` (every changed context, what the JSON held before); and
  the whole command in a fresh process, with the document cache warm and with none.
- **one-row edit**: GPT-OSS's runtime preference row PYTHON -> CPP in the newest shipped policy:
  ways, exact sub-groups, bytes of the text, of the JSON and of the JSON with ``--contexts``.
- **structural diff**: 2026.08.18 -> 2026.08.24 (a new default, new conditional rules, an adopt
  condition), diff plus text, against the one-row edit's.
- **the README's example**: ``kvpolicy diff 2026.08.11 2026.08.24`` in a fresh process, with no
  results cache (cold) and again (cached), against ``python -c pass``; and every adjacent pair of
  shipped versions, diff plus text, in one process (the slowest and all together).

``--pairs`` adds the old table: every pair of shipped versions, the symbolic diff with grouping
and text against brute-force evaluation of every context (minutes).

    python bench/diff.py [--repeat 3] [--rows 10000] [--pairs]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resolve import generated_policy  # noqa: E402  (bench/resolve.py)

import kvpolicy  # noqa: E402
from kvpolicy.cli.diff import render_text, to_json  # noqa: E402
from kvpolicy.analyse.diff import diff_policies  # noqa: E402
from kvpolicy.analyse.difftext import entries  # noqa: E402
from kvpolicy.evaluate.domain import domain_of  # noqa: E402
from kvpolicy.read.loader import load_policy_file, shipped_root  # noqa: E402
from kvpolicy.evaluate.policyset import PolicySet  # noqa: E402

GPT_OSS_ROW = '{ architecture = "GptOssForCausalLM", value = "PYTHON"'


def cpu(work: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median CPU seconds of ``work`` over ``repeat`` runs, and its last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.process_time()
        result = work()
        times.append(time.process_time() - start)
    return statistics.median(times), result


def child_cpu(argv: list[str], repeat: int, env: dict[str, str]) -> tuple[float, int]:
    """Median CPU seconds (user + system) of a fresh process running ``argv``, and its output's bytes."""
    times, size = [], 0
    for _ in range(repeat):
        with tempfile.TemporaryFile() as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env=env)
            _, status, usage = os.wait4(process.pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"{' '.join(argv)} failed")
            times.append(usage.ru_utime + usage.ru_stime)
            size = out.seek(0, os.SEEK_END)
    return statistics.median(times), size


def json_text(result: Any, contexts: bool = False) -> str:
    """What ``kvpolicy diff --format json`` prints (less the line naming the policy folder)."""
    return json.dumps(to_json(result, contexts=contexts), indent=1)


def edit_sized(rows: int, repeat: int, folder: Path) -> dict[str, Any]:
    """Two ``rows``-row versions with 1% of rows flipped: JSON cost against loading one."""
    paths = []
    for name, changed_every in (("old", 0), ("new", 100)):
        path = folder / name / "2026.09.10.toml"
        path.parent.mkdir(parents=True)
        path.write_bytes(generated_policy(rows, changed_every=changed_every)[0])
        paths.append(path)
    os.environ["KVPOLICY_CACHE_DIR"] = ""  # every load parses
    figures: dict[str, Any] = {"rows": rows}
    figures["load_s"], old = cpu(lambda: PolicySet(load_policy_file(paths[0])), repeat)
    new = PolicySet(load_policy_file(paths[1]))
    figures["diff_s"], _ = cpu(lambda: diff_policies(old, new), repeat)
    figures["json_s"], text = cpu(lambda: json_text(diff_policies(old, new)), repeat)
    figures["json_bytes"] = len(text)
    figures["text_s"], text = cpu(lambda: render_text(diff_policies(old, new)), repeat)
    figures["text_bytes"] = len(text)
    figures["contexts_s"], text = cpu(lambda: json_text(diff_policies(old, new), contexts=True), 1)
    figures["contexts_bytes"] = len(text)
    command = [sys.executable, "-m", "kvpolicy", "diff", str(paths[0]), str(paths[1]), "--format", "json"]
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as cache:
        env["KVPOLICY_CACHE_DIR"] = cache
        child_cpu(command, 1, env)  # fills the document cache
        figures["cli_cached_s"], figures["cli_bytes"] = child_cpu(command, repeat, env)
    env["KVPOLICY_CACHE_DIR"] = ""
    figures["cli_no_cache_s"], _ = child_cpu(command, repeat, env)
    figures["bare_python_s"], _ = child_cpu([sys.executable, "-c", "pass"], max(repeat, 3), env)
    for key in ("diff_s", "json_s", "text_s", "contexts_s", "cli_cached_s", "cli_no_cache_s"):
        figures[key.replace("_s", "_vs_load")] = figures[key] / figures["load_s"]
    return figures


def one_row_and_structural(repeat: int, folder: Path) -> dict[str, Any]:
    """The one-row GPT-OSS edit and the 08.18 -> 08.24 structural diff."""
    text = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")
    old_path, new_path = folder / "a.toml", folder / "b.toml"
    old_path.write_text(text, encoding="utf-8")
    new_path.write_text(text.replace(GPT_OSS_ROW, GPT_OSS_ROW.replace("PYTHON", "CPP")), encoding="utf-8")
    old, new = PolicySet(load_policy_file(old_path)), PolicySet(load_policy_file(new_path))
    result = diff_policies(old, new)
    figures: dict[str, Any] = {
        "one_row_ways": len(entries(result)),
        "one_row_subgroups": len(result.groups),
        "one_row_text_bytes": len(render_text(result)),
        "one_row_json_bytes": len(json_text(result)),
        "one_row_contexts_json_bytes": len(json_text(result, contexts=True)),
    }
    figures["one_row_s"], _ = cpu(lambda: render_text(diff_policies(old, new)), repeat)
    a, b = kvpolicy.load(version="2026.08.18"), kvpolicy.load(version="2026.08.24")
    figures["structural_diff_s"], result = cpu(lambda: diff_policies(a, b), repeat)
    figures["structural_s"], _ = cpu(lambda: render_text(diff_policies(a, b)), repeat)
    figures["structural_ways"] = len(entries(result))
    figures["structural_subgroups"] = len(result.groups)
    figures["structural_vs_one_row"] = figures["structural_s"] / figures["one_row_s"]
    return figures


def readme_example(repeat: int) -> dict[str, Any]:
    """``kvpolicy diff 2026.08.11 2026.08.24`` as a user runs it, and every adjacent shipped pair."""
    command = [sys.executable, "-m", "kvpolicy", "diff", "2026.08.11", "2026.08.24", "--policy", str(shipped_root())]
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "KVPOLICY_CACHE_DIR": cache}
        times = []
        for _ in range(repeat):  # cold: an empty cache each time
            shutil.rmtree(cache)
            os.mkdir(cache)
            times.append(child_cpu(command, 1, env)[0])
        figures["cold_s"] = statistics.median(times)
        figures["cached_s"], _ = child_cpu(command, repeat, env)
    figures["bare_python_s"], _ = child_cpu([sys.executable, "-c", "pass"], repeat, dict(os.environ))
    sets = {v: kvpolicy.load(version=v) for v in kvpolicy.load().versions()}
    each = []
    for old_version, new_version in itertools.pairwise(sets):
        seconds, _ = cpu(lambda a=sets[old_version], b=sets[new_version]: render_text(diff_policies(a, b)), 1)
        each.append((seconds, f"{old_version} -> {new_version}"))
    figures["pairs"] = len(each)
    figures["pairs_s"] = sum(s for s, _ in each)
    figures["slowest_s"], figures["slowest"] = max(each)
    return figures


def brute_force(old: kvpolicy.PolicySet, new: kvpolicy.PolicySet) -> int:
    changed = 0
    for ctx in domain_of(old.policy, new.policy).contexts():
        a, b = old.outcome(ctx), new.outcome(ctx)
        if a[0] != b[0] or a[1] != b[1] or sorted(a[2]) != sorted(b[2]):
            changed += 1
    return changed


def pairs(repeat: int) -> None:
    """Every pair of shipped versions: symbolic diff with grouping and text against brute force."""
    sets = {v: kvpolicy.load(version=v) for v in kvpolicy.load().versions()}
    print(f"\n{'old':<11} {'new':<11} {'contexts':>11} {'symbolic s':>11} {'brute s':>9} {'ratio':>7}")
    for old_version, new_version in itertools.combinations(sets, 2):
        old, new = sets[old_version], sets[new_version]
        size = domain_of(old.policy, new.policy).size()
        symbolic, _ = cpu(lambda: render_text(diff_policies(old, new)), repeat)
        brute, _ = cpu(lambda: brute_force(old, new), 1)
        print(f"{old_version:<11} {new_version:<11} {size:>11,} {symbolic:>11.3f} {brute:>9.3f} {brute / symbolic:>6.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--pairs", action="store_true", help="also every shipped pair against brute force (minutes)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        big = edit_sized(args.rows, args.repeat, Path(folder) / "big")
        small = one_row_and_structural(args.repeat, Path(folder))
    example = readme_example(args.repeat)
    print(f"{big['rows']:,}-row versions, 1% of rows flipped (CPU seconds, median of {args.repeat}; load without the cache):")
    print(f"  load one version                 {big['load_s']:8.3f} s   1.00x")
    for label, key in (("diff (after loading)", "diff"), ("diff --format json", "json"), ("diff (text)", "text"),
                       ("diff --format json --contexts", "contexts")):
        size = f"{big[key + '_bytes']:>12,} B" if key + "_bytes" in big else " " * 14
        print(f"  {label:<32} {big[key + '_s']:8.3f} s {big[key + '_vs_load']:6.2f}x {size}")
    print(f"  whole command, cache warm        {big['cli_cached_s']:8.3f} s {big['cli_cached_vs_load']:6.2f}x {big['cli_bytes']:>12,} B")
    print(f"  whole command, no cache          {big['cli_no_cache_s']:8.3f} s {big['cli_no_cache_vs_load']:6.2f}x"
          f"   (python -c pass: {big['bare_python_s']:.3f} s)")
    print("\none-row edit (GptOssForCausalLM runtime preference PYTHON -> CPP, 2026.09.10):")
    print(f"  {small['one_row_ways']} ways ({small['one_row_subgroups']} exact sub-groups); text {small['one_row_text_bytes']:,} B,"
          f" JSON {small['one_row_json_bytes']:,} B, JSON with --contexts {small['one_row_contexts_json_bytes']:,} B;"
          f" diff + text {small['one_row_s']:.3f} s")
    print("structural diff 2026.08.18 -> 2026.08.24:")
    print(f"  {small['structural_ways']} ways ({small['structural_subgroups']} exact sub-groups); diff {small['structural_diff_s']:.3f} s,"
          f" diff + text {small['structural_s']:.3f} s ({small['structural_vs_one_row']:.0f}x the one-row edit)")
    print("the README's example, kvpolicy diff 2026.08.11 -> 2026.08.24, a fresh process (CPU):")
    print(f"  no results cache {example['cold_s']:.3f} s, cached {example['cached_s']:.3f} s"
          f" (python -c pass {example['bare_python_s']:.3f} s)")
    print(f"  every adjacent shipped pair, diff + text: {example['pairs']} pairs in {example['pairs_s']:.2f} s,"
          f" the slowest {example['slowest']} {example['slowest_s']:.3f} s")
    if args.pairs:
        pairs(args.repeat)


if __name__ == "__main__":
    main()
