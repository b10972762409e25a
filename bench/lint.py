"""Lint speed: the shipped policies, and generated policies of 100 to 99,000 preference rows.

The precedence analysis (shadowed, unreachable, conflicting rules, auto choices a constraint
rejects) is exact, and compared here with brute force over the full context domain on the same
policy. A generated policy may need more of it than its budget allows: it is then refused up front
(KVP029) and the other rules still run. The largest size is the loader's limit (100,000 rows): what
a hostile file can cost. Ratios are measured side by side in one run (the machines are shared and
noisy).

    python bench/lint.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import kvpolicy
from kvpolicy.domain import domain_of
from kvpolicy.lint.analysis import AnalysisLimit, analyse
from kvpolicy.lint.runner import lint_files, lint_paths, load_policy_bytes
from kvpolicy.loader import parse_policy, shipped_root

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, up to 1,000 rows")
    args = parser.parse_args()
    repeat = 1 if args.quick else 3
    root = shipped_root()

    print("shipped policies")
    cold = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kvpolicy", "lint", str(root)], capture_output=True, check=False)
        cold.append(time.perf_counter() - started)
    warm = best(lambda: lint_paths([str(root)]), repeat)
    newest = kvpolicy.load(version="2026.09.10").policy
    exact = best(lambda: analyse(newest), repeat)
    brute = brute_force(newest)
    count = len(list(root.glob("*.toml")))
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
