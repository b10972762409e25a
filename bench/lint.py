"""Lint speed: the shipped policies, and generated policies of 100 to 99,000 preference rows.

The precedence analysis (shadowed, unreachable, conflicting rules, auto choices a constraint
rejects) is exact, and compared here with brute force over the full context domain on the same
policy. A generated policy may need more of it than its budget allows: it is then refused up front
(KVP029) and the other rules still run. The largest size is the loader's limit (100,000 rows): what
a hostile file can cost. Ratios are measured side by side in one run (the machines are shared and
noisy).

The first table is the gate as CI and pre-commit pay for it: ``kvpolicy lint`` and ``kvpolicy check``
in a new process with an empty cache, with nothing changed, and with one file edited.

    python bench/lint.py [--quick] [--gate]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kvpolicy
from kvpolicy.evaluate.domain import domain_of
from kvpolicy.lint.precedence import AnalysisLimit, analyse
from kvpolicy.lint.runner import lint_files, lint_paths, load_policy_bytes
from kvpolicy.read.loader import parse_policy, shipped_root

ROWS = (100, 300, 1_000, 10_000, 99_000)


def generated(rows: int, seed: int = 7, conditionals: int = 10) -> str:
    """The newest shipped policy with ``rows`` extra runtime rows, a V2 row for every third
    architecture, a requirement for every fiftieth, and ten conditionals naming twenty each."""
    rng = random.Random(seed)
    text = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")
    names = [f"Synth{i:04d}ForCausalLM" for i in range(rows)]
    runtime_rows = "".join(
        f'  {{ architecture = "{n}", value = "{rng.choice(["PYTHON", "CPP"])}", reason = "generated", source = "bench" }},\n'
        for n in names
    )
    manager_rows = "".join(
        f'  {{ architecture = "{n}", value = "V2", reason = "generated", source = "bench" }},\n' for n in names[::3]
    )
    text = text.replace("\n]\n\n[decisions.kv_cache_manager]", "\n" + runtime_rows + "]\n\n[decisions.kv_cache_manager]", 1)
    marker = 'source = "TensorRT-LLM 2026-09: KV-cache manager V2 preferences"\nrows = [\n'
    text = text.replace(marker, marker + manager_rows, 1)
    extra = []
    for i, name in enumerate(names[::50]):
        extra.append(
            f'[[decisions.transceiver_runtime.requirement]]\nid = "synth-requires-python-{i}"\n'
            f'when = {{ architecture = "{name}" }}\nvalue = "PYTHON"\nreason = "generated"\nsource = "bench"\n'
        )
    for i in range(conditionals):
        chosen = ", ".join(f'"{n}"' for n in rng.sample(names, min(20, rows)))
        extra.append(
            f'[[decisions.transceiver_runtime.conditional]]\nid = "synth-conditional-{i}"\n'
            f'when = {{ architecture = [{chosen}], kv_transfer_timeout_ms = "finite" }}\nvalue = "CPP"\n'
            'reason = "generated"\nsource = "bench"\n'
        )
    anchor = "[decisions.transceiver_runtime.preference]"
    return text.replace(anchor, "\n".join(extra) + "\n" + anchor, 1)


def best(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def brute_force(policy) -> float:
    policy_set = kvpolicy.PolicySet(policy)
    started = time.perf_counter()
    for ctx in domain_of(policy).contexts():
        policy_set.outcome(ctx)
    return time.perf_counter() - started


def cpu_of(command: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) a new process spends on ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, capture_output=True, check=False, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def gate(repeat: int) -> None:
    """The CI and pre-commit gate on the shipped policies, as a user pays for it: CPU of a new
    process, cases measured round-robin in one run, medians, as ratios to ``python -c pass``."""
    work = Path(tempfile.mkdtemp(prefix="kvpolicy-bench-"))
    folder = work / "policies"
    shutil.copytree(shipped_root(), folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    newest = sorted(p for p in folder.glob("*.toml") if not p.name.endswith(".cases.toml"))[-1]
    original = newest.read_text(encoding="utf-8")
    warm = dict(os.environ, KVPOLICY_CACHE_DIR=str(work / "warm"))
    kvpolicy_ = [sys.executable, "-m", "kvpolicy"]
    for command in ("lint", "check"):
        subprocess.run([*kvpolicy_, command, str(folder)], capture_output=True, check=False, env=warm)
    edits = itertools.count()

    def edited(command: str):
        def run(env: dict[str, str]) -> list[str]:
            newest.write_text(original + f"# bench edit {next(edits)}\n", encoding="utf-8")
            return [*kvpolicy_, command, str(folder)]
        return run

    def empty(env: dict[str, str]) -> dict[str, str]:
        return dict(env, KVPOLICY_CACHE_DIR=str(Path(tempfile.mkdtemp(dir=work))))

    cases = {
        "python -c pass": (lambda env: [sys.executable, "-c", "pass"], lambda env: env),
        "lint, empty cache": (lambda env: [*kvpolicy_, "lint", str(folder)], empty),
        "lint, nothing changed": (lambda env: [*kvpolicy_, "lint", str(folder)], lambda env: env),
        "lint, one file edited": (edited("lint"), lambda env: env),
        "check, empty cache": (lambda env: [*kvpolicy_, "check", str(folder)], empty),
        "check, nothing changed": (lambda env: [*kvpolicy_, "check", str(folder)], lambda env: env),
        "check, one file edited": (edited("check"), lambda env: env),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(max(repeat, 5)):
        for name, (command, environment) in cases.items():
            if name.endswith("nothing changed"):
                newest.write_text(original, encoding="utf-8")
            env = environment(warm)
            times[name].append(cpu_of(command(env), env))
    shutil.rmtree(work, ignore_errors=True)
    median = {name: statistics.median(values) for name, values in times.items()}
    bare = median["python -c pass"]
    files = len([p for p in shipped_root().glob("*.toml") if not p.name.endswith(".cases.toml")])
    print(f"the gate on the shipped policies ({files} files, CPU of a new process, median of {max(repeat, 5)} round-robin runs)")
    for name, value in median.items():
        line = f"  {name:<24} {value * 1000:>7.0f} ms CPU  {value / bare:>6.1f}x python -c pass"
        if name.startswith("check"):
            line += f"  {value / median['lint' + name[5:]]:>5.2f}x lint"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, up to 1,000 rows")
    parser.add_argument("--gate", action="store_true", help="only the gate's cost (lint and check, cold, unchanged, edited)")
    args = parser.parse_args()
    repeat = 1 if args.quick else 3
    gate(repeat)
    if args.gate:
        return
    root = shipped_root()

    print("shipped policies")
    cold = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "kvpolicy", "lint", "--no-cache", str(root)], capture_output=True, check=False
        )
        cold.append(time.perf_counter() - started)
    warm = best(lambda: lint_paths([str(root)], cache=False), repeat)
    newest = kvpolicy.load(version="2026.09.10").policy
    exact = best(lambda: analyse(newest), repeat)
    brute = brute_force(newest)
    count = len([p for p in root.glob("*.toml") if not p.name.endswith(".cases.toml")])
    print(f"  kvpolicy lint policies/ (new process, {count} files): {min(cold):.2f} s")
    print(f"  lint of the {count} files in-process:                 {warm:.2f} s")
    print(f"  2026.09.10: exact analysis {exact * 1000:.0f} ms vs brute force over {domain_of(newest).size():,} contexts "
          f"{brute * 1000:.0f} ms: {brute / exact:.1f}x faster")

    print("\ngenerated policies (2026.09.10 + N runtime rows, N/3 V2 rows, N/50 requirements, 10 conditionals)")
    print(f"  {'rows':>6} {'bytes':>11} {'analysis':>10} {'':>19} {'lint (all rules)':>17} {'findings':>9} {'ratio to 100 rows':>18}")
    base = None
    for rows in ROWS if not args.quick else ROWS[:3]:
        text = generated(rows).encode()
        policy = parse_policy(text, f"generated-{rows}.toml")
        outcome = ""

        def analysis(policy=policy) -> None:
            nonlocal outcome
            try:
                outcome = f"exact, {analyse(policy).states} states"
            except AnalysisLimit:
                outcome = "refused (KVP029)"

        analysis_time = best(analysis, repeat)
        name = f"generated-{rows}.toml"
        lint_time = best(lambda text=text, name=name: lint_files([load_policy_bytes(text, name)]), repeat)
        result = lint_files([load_policy_bytes(text, name)])
        base = base or lint_time
        print(f"  {rows:>6} {len(text):>11,} {analysis_time * 1000:>8.0f}ms {outcome:>19} {lint_time * 1000:>15.0f}ms "
              f"{len(result.findings):>9} {lint_time / base:>17.1f}x")
    print(f"\nmedian of cold runs: {statistics.median(cold):.2f} s; Python {sys.version.split()[0]}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
