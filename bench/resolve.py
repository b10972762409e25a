"""Resolution speed: the shipped policy, generated policies of 10 to 10,000 rows, and a cold start.

Prints ratios measured side by side in one run (these machines are shared and noisy), plus a
calibration of the machine's Python speed so that absolute figures can be compared elsewhere.

    python bench/resolve.py [--quick] [--format text|json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import kvpolicy
from kvpolicy.loader import parse_policy, shipped_root
from kvpolicy.policyset import PolicySet

SIZES = (10, 100, 1_000, 10_000)
SHIPPED_CONTEXTS = [
    dict(architecture="LlamaForCausalLM", backend="NIXL"),
    dict(architecture="MistralForCausalLM", backend="UCX"),
    dict(architecture="Gemma4ForCausalLM", backend="DEFAULT", kv_transfer_timeout_ms=30000),
    dict(architecture="DeepseekV3ForCausalLM", backend="NIXL", transceiver_runtime="CPP"),
    dict(architecture="KimiK3ForCausalLM", backend="NIXL"),
    dict(architecture="GptOssForCausalLM", backend="UCX"),
    dict(backend="NIXL", features={"serialized_state"}),
    dict(architecture="Qwen3NextForCausalLM", backend="DEFAULT", env={"TRTLLM_USE_UCX_KVCACHE": "1"}),
]


def calibrate() -> dict[str, float]:
    """ns per empty loop iteration and per Python function call on this machine."""
    def f() -> None:
        return None

    n = 2_000_000
    start = time.perf_counter()
    for _ in range(n):
        pass
    loop = (time.perf_counter() - start) / n * 1e9
    start = time.perf_counter()
    for _ in range(n):
        f()
    call = (time.perf_counter() - start) / n * 1e9 - loop
    return {"loop_ns": loop, "call_ns": call}


def latency(policy_set: PolicySet, contexts: list[dict], seconds: float, batch: int = 50) -> dict[str, float]:
    """Per-resolution latency from batches of one context each: p50, p99 (us) and throughput."""
    resolve = policy_set.resolve
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    rng = random.Random(7)
    total = 0
    elapsed = 0.0
    while time.perf_counter() < deadline:
        fields = rng.choice(contexts)
        start = time.perf_counter_ns()
        for _ in range(batch):
            resolve(**fields)
        spent = time.perf_counter_ns() - start
        samples.append(spent / batch / 1000)
        total += batch
        elapsed += spent / 1e9
    samples.sort()
    return {
        "p50_us": statistics.median(samples),
        "p99_us": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
        "per_second": total / elapsed,
    }


def generated_policy(rows: int, changed_every: int = 0) -> tuple[bytes, list[dict]]:
    """The newest shipped policy with ``rows`` extra runtime preference rows, and contexts over it.

    ``changed_every=100``: every 100th row's value flipped (1% of rows changed, for a diff)."""
    text = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")

    def value(i: int) -> str:
        python = bool(i % 2) != bool(changed_every and i % changed_every == 0)
        return "PYTHON" if python else "CPP"

    extra = "".join(
        f'  {{ architecture = "Synthetic{i}ForCausalLM", value = "{value(i)}", '
        f'reason = "generated", source = "bench" }},\n'
        for i in range(rows)
    )
    # The rows go at the top of the runtime preference's row list, wherever the shipped file puts it.
    header = text.index("[decisions.transceiver_runtime.preference]")
    anchor = text.index("rows = [\n", header) + len("rows = [\n")
    text = text[:anchor] + extra + text[anchor:]
    rng = random.Random(rows)
    contexts = [
        dict(architecture=f"Synthetic{rng.randrange(rows)}ForCausalLM", backend=rng.choice(("NIXL", "UCX", "DEFAULT")))
        for _ in range(16)
    ] + SHIPPED_CONTEXTS
    return text.encode(), contexts


def cold_start() -> float:
    """Wall time of `kvpolicy resolve` in a fresh interpreter (best of 5)."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "kvpolicy", "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL"],
            check=True, capture_output=True,
        )
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args()
    seconds = 0.4 if args.quick else 1.5

    result: dict = {"calibration": calibrate()}
    shipped = kvpolicy.load()
    result["shipped"] = latency(shipped, SHIPPED_CONTEXTS, seconds)
    result["per_context"] = [
        {"context": {k: sorted(v) if isinstance(v, (set, frozenset)) else v for k, v in fields.items()},
         "diagnostics": len(shipped.resolve(**fields).diagnostics),
         **latency(shipped, [fields], seconds / 4)}
        for fields in SHIPPED_CONTEXTS
    ]
    result["sizes"] = {}
    for rows in SIZES:
        raw, contexts = generated_policy(rows)
        start = time.perf_counter()
        policy_set = PolicySet(parse_policy(raw, f"generated-{rows}.toml"))
        load_s = time.perf_counter() - start
        figures = latency(policy_set, contexts, seconds)
        figures["load_compile_ms"] = load_s * 1000
        result["sizes"][rows] = figures
    base = result["sizes"][SIZES[0]]["p50_us"]
    for rows in SIZES:
        result["sizes"][rows]["p50_vs_10_rows"] = result["sizes"][rows]["p50_us"] / base
    result["cold_start_s"] = cold_start()
    result["shipped"]["p50_in_calls"] = result["shipped"]["p50_us"] * 1000 / result["calibration"]["call_ns"]

    if args.format == "json":
        print(json.dumps(result, indent=2))
        return 0
    cal = result["calibration"]
    print(f"machine: {cal['loop_ns']:.0f} ns per empty loop iteration, {cal['call_ns']:.0f} ns per Python call")
    s = result["shipped"]
    print(
        f"shipped policy 2026.09.10: p50 {s['p50_us']:.2f} us, p99 {s['p99_us']:.2f} us, "
        f"{s['per_second']:,.0f} resolutions/s (p50 = {s['p50_in_calls']:.0f} Python calls)"
    )
    print("\nper context (p50 us, diagnostics):")
    for entry in result["per_context"]:
        print(f"  {entry['p50_us']:6.2f}  {entry['diagnostics']}  {entry['context']}")
    print(f"\n{'rows':>7}  {'p50 us':>8}  {'p99 us':>8}  {'per s':>10}  {'p50 vs 10':>9}  {'load+compile':>12}")
    for rows, f in result["sizes"].items():
        print(
            f"{rows:>7}  {f['p50_us']:>8.2f}  {f['p99_us']:>8.2f}  {f['per_second']:>10,.0f}  "
            f"{f['p50_vs_10_rows']:>8.2f}x  {f['load_compile_ms']:>9.1f} ms"
        )
    print(f"\ncold start of `kvpolicy resolve`: {result['cold_start_s'] * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
