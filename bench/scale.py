"""The engine at scale: load, lint, diff and resolve at 10 to 100,000 preference rows, and a cold CLI.

One run measures everything side by side (these machines are shared and noisy), in CPU time, and
prints ratios: per-row growth against the smallest size, ``diff`` against loading one of its two
versions, and a cold ``kvpolicy resolve`` against ``python -c pass``. The policies are the newest
shipped policy with N generated runtime preference rows (``bench/resolve.py``'s generator); the
NEW side of a diff has 1% of its rows flipped. They live in a temporary folder.

    python bench/scale.py [--sizes 10,1000,10000,100000] [--repeat 3] [--format text|json]
    python bench/scale.py --compare /path/to/other/python   # the same run under another install, side by side

``--compare`` runs this script under another interpreter (say, the main branch's venv) with the
same arguments and prints both results and the ratio of each figure (other / this).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resolve import SHIPPED_CONTEXTS, compare_if_elif, generated_policy, latency  # noqa: E402  (bench/resolve.py)

from kvpolicy.cli.diff import render_text  # noqa: E402
from kvpolicy.analyse.diff import diff_policies  # noqa: E402
from kvpolicy.lint.runner import lint_paths  # noqa: E402
from kvpolicy.read.loader import load_policy_file, shipped_root  # noqa: E402
from kvpolicy.evaluate.policyset import PolicySet  # noqa: E402

DEFAULT_SIZES = (10, 1_000, 10_000)


def cpu(work: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median CPU seconds of ``work`` over ``repeat`` runs, and its last result."""
    times = []
    result = None
    for _ in range(repeat):
        start = time.process_time()
        result = work()
        times.append(time.process_time() - start)
    return statistics.median(times), result


def child_cpu(argv: list[str], repeat: int, env: dict[str, str] | None = None) -> float:
    """Median CPU seconds (user + system) of a fresh process running ``argv``."""
    times = []
    for _ in range(repeat):
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode not in (0, 1):  # 1: the resolution has errors, which is fine here
            raise SystemExit(f"{' '.join(argv)} exited {process.returncode}")
        times.append(usage.ru_utime + usage.ru_stime)
    return statistics.median(times)


def measure_size(
    rows: int, folder: Path, repeat: int, diff_max: int, seconds: float, cache_dir: str | None = None
) -> dict[str, Any]:
    """Load, lint, diff and resolve figures at one size (every load parses: the document cache is
    off, except for ``load_cached_s``, measured with ``cache_dir``)."""
    old_raw, contexts = generated_policy(rows)
    new_raw, _ = generated_policy(rows, changed_every=100)
    old_path = folder / f"old-{rows}" / "2026.09.10.toml"
    new_path = folder / f"new-{rows}" / "2026.09.10.toml"
    for path, raw in ((old_path, old_raw), (new_path, new_raw)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
    figures: dict[str, Any] = {"rows": rows, "bytes": len(old_raw)}
    figures["load_s"], policy = cpu(lambda: PolicySet(load_policy_file(old_path)), repeat)
    if cache_dir is not None:  # the same file again, from the document cache (an install that has one)
        os.environ["KVPOLICY_CACHE_DIR"] = cache_dir
        PolicySet(load_policy_file(old_path))
        figures["load_cached_s"], _ = cpu(lambda: PolicySet(load_policy_file(old_path)), repeat)
        figures["load_cached_vs_load"] = figures["load_cached_s"] / figures["load_s"]
        os.environ["KVPOLICY_CACHE_DIR"] = ""
    figures["lint_s"], result = cpu(lambda: lint_paths([str(old_path)]), repeat)
    figures["lint_findings"] = len(result.findings)
    if rows <= diff_max:
        new = PolicySet(load_policy_file(new_path))
        figures["diff_s"], text = cpu(lambda: render_text(diff_policies(policy, new)), repeat)
        figures["diff_vs_load"] = figures["diff_s"] / figures["load_s"]
        figures["diff_lines"] = text.count("\n")
    figures.update(latency(policy, contexts, seconds))
    return figures


def cold_cli(repeat: int) -> dict[str, float]:
    """Cold ``kvpolicy resolve`` CPU time against a bare interpreter start."""
    resolve = [sys.executable, "-m", "kvpolicy", "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL"]
    bare = child_cpu([sys.executable, "-c", "pass"], max(repeat, 5))
    figures = {"python_pass_s": bare}
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as cache:
        # A fresh cache folder: the first run fills it (where the install has a cache), the rest read it.
        env["KVPOLICY_CACHE_DIR"] = cache
        figures["resolve_cold_s"] = child_cpu(resolve, 1, env)
        figures["resolve_warm_cache_s"] = child_cpu(resolve, max(repeat, 5), env)
    env["KVPOLICY_CACHE_DIR"] = ""  # no cache at all
    figures["resolve_no_cache_s"] = child_cpu(resolve, max(repeat, 5), env)
    for key in ("resolve_cold_s", "resolve_warm_cache_s", "resolve_no_cache_s"):
        figures[key.replace("_s", "_vs_python")] = figures[key] / bare
    return figures


def cedar_parse(rows: int, repeat: int) -> dict[str, float] | None:
    """CPU time Cedar (cedarpy, the optional ``bench`` extra) takes to parse ``rows`` policies,
    one per preference row, each as selective as a row; None when cedarpy is not installed."""
    try:
        import cedarpy
    except ImportError:
        return None
    text = "".join(
        f'@id("runtime-preference[Synthetic{i}ForCausalLM]")\n'
        f'permit(principal, action == Action::"use_runtime", resource == Model::"Synthetic{i}ForCausalLM")\n'
        f'when {{ context.runtime == "{"PYTHON" if i % 2 else "CPP"}" }};\n'
        for i in range(rows)
    )
    seconds, _ = cpu(lambda: cedarpy.PolicySet.from_str(text), repeat)
    return {"rows": rows, "cedar_parse_s": seconds, "cedar_ms_per_policy": seconds * 1000 / rows}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one run."""
    result: dict[str, Any] = {"python": sys.executable, "sizes": []}
    # Loads in this process parse every time; the user's cache folder is never touched.
    os.environ["KVPOLICY_CACHE_DIR"] = ""
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as cache:
        for rows in args.sizes:
            result["sizes"].append(
                measure_size(rows, Path(folder), args.repeat, args.diff_max_rows, args.seconds, cache)
            )
    small = result["sizes"][0]
    for figures in result["sizes"]:
        extra = figures["rows"] - small["rows"]
        if extra:
            for stage in ("load", "lint", "diff"):
                if f"{stage}_s" in figures and f"{stage}_s" in small:
                    figures[f"{stage}_ms_per_row"] = (figures[f"{stage}_s"] - small[f"{stage}_s"]) * 1000 / extra
        figures["p50_vs_smallest"] = figures["p50_us"] / small["p50_us"]
    cedar = cedar_parse(max(args.sizes), max(args.repeat, 3))
    if cedar is not None:
        largest = result["sizes"][-1]
        cedar["load_ms_per_row"] = largest.get("load_ms_per_row", largest["load_s"] * 1000 / largest["rows"])
        cedar["load_per_row_vs_cedar"] = cedar["load_ms_per_row"] / cedar["cedar_ms_per_policy"]
        result["cedar"] = cedar
    result["cli"] = cold_cli(args.repeat)
    shipped = PolicySet(load_policy_file(Path(str(shipped_root())) / "2026.09.10.toml"))
    result["shipped_resolve"] = latency(shipped, SHIPPED_CONTEXTS, args.seconds)
    # Against the if/elif encoding of the same policy (answers asserted equal first), and contexts
    # with diagnostics against those without, interleaved in this run.
    result["shipped_resolve"].update(compare_if_elif(shipped, SHIPPED_CONTEXTS, max(args.seconds, 0.5) * 4))
    return result


def text(result: dict[str, Any]) -> str:
    """The figures as a table."""
    lines = [f"{result['python']}: CPU seconds, medians"]
    cached: list[str] = []
    lines.append(
        f"{'rows':>8} {'load s':>8} {'lint s':>8} {'diff s':>8} {'diff/load':>9} "
        f"{'load ms/row':>11} {'lint ms/row':>11} {'p50 us':>7} {'p50 vs 10':>9}"
    )
    for f in result["sizes"]:
        if "load_cached_s" in f:
            cached.append(f"{f['rows']:,} rows {f['load_cached_s']:.3f} s ({f['load_cached_vs_load']:.2f}x)")
        diff = f"{f['diff_s']:8.3f} {f['diff_vs_load']:8.2f}x" if "diff_s" in f else f"{'-':>8} {'-':>9}"
        per_load = f"{f['load_ms_per_row']:11.3f}" if "load_ms_per_row" in f else f"{'-':>11}"
        per_lint = f"{f['lint_ms_per_row']:11.3f}" if "lint_ms_per_row" in f else f"{'-':>11}"
        lines.append(
            f"{f['rows']:>8,} {f['load_s']:8.3f} {f['lint_s']:8.3f} {diff} {per_load} {per_lint} "
            f"{f['p50_us']:7.2f} {f['p50_vs_smallest']:8.2f}x"
        )
    if cached:
        lines.append("load of an unchanged file from the document cache: " + ", ".join(cached))
    c = result["cli"]
    lines.append(
        f"cold `kvpolicy resolve`: {c['resolve_no_cache_s']:.3f} s without a cache "
        f"({c['resolve_no_cache_vs_python']:.1f}x `python -c pass` {c['python_pass_s']:.3f} s), "
        f"{c['resolve_warm_cache_s']:.3f} s with a warm cache ({c['resolve_warm_cache_vs_python']:.1f}x), "
        f"first run {c['resolve_cold_s']:.3f} s"
    )
    if "cedar" in result:
        k = result["cedar"]
        lines.append(
            f"load per row {k['load_ms_per_row']:.3f} ms vs Cedar's parse per policy {k['cedar_ms_per_policy']:.4f} ms "
            f"({k['rows']:,} policies): {k['load_per_row_vs_cedar']:.1f}x"
        )
    else:
        lines.append("cedarpy not installed (pip install .[bench]): no Cedar figure in this run")
    s = result["shipped_resolve"]
    lines.append(f"in-process resolve, shipped policy, mixed contexts: p50 {s['p50_us']:.2f} us, p99 {s['p99_us']:.2f} us")
    lines.append(
        f"  interleaved: resolve p50 {s['resolve_p50_us']:.2f} us vs the if/elif encoding {s['if_elif_p50_us']:.2f} us "
        f"({s['resolve_vs_if_elif']:.2f}x, same answers); with diagnostics {s['with_diagnostics_p50_us']:.2f} us vs "
        f"without {s['without_diagnostics_p50_us']:.2f} us ({s['diagnostics_cost']:.2f}x)"
    )
    return "\n".join(lines)


def compare(this: dict[str, Any], other: dict[str, Any]) -> str:
    """Side by side: each figure of the other run divided by this run's."""
    lines = [f"ratio other/this (other: {other['python']}; > 1 means this run is faster)"]
    keys = ("load_s", "lint_s", "diff_s", "p50_us")
    lines.append(f"{'rows':>8} " + " ".join(f"{k:>10}" for k in keys))
    for mine in this["sizes"]:
        theirs = next((f for f in other["sizes"] if f["rows"] == mine["rows"]), {})
        cells = [
            f"{theirs[k] / mine[k]:9.2f}x" if k in theirs and k in mine and mine[k] else f"{'-':>10}" for k in keys
        ]
        lines.append(f"{mine['rows']:>8,} " + " ".join(cells))
    for key in ("resolve_no_cache_s", "resolve_warm_cache_s"):
        lines.append(f"{key}: {other['cli'][key] / this['cli'][key]:.2f}x")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda s: tuple(int(x) for x in s.split(",")), default=DEFAULT_SIZES)
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure (median)")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds of resolve latency sampling per size")
    parser.add_argument("--diff-max-rows", type=int, default=100_000, help="skip diff above this many rows")
    parser.add_argument("--compare", metavar="PYTHON", help="also run under this interpreter and print ratios")
    parser.add_argument("--compare-diff-max-rows", type=int, default=10_000, help="--diff-max-rows of the other run")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--output", metavar="FILE", help="also write the figures as JSON to FILE")
    args = parser.parse_args()
    result = run(args)
    other = None
    if args.compare:
        argv = [
            args.compare, __file__, "--format", "json", "--repeat", str(args.repeat), "--seconds", str(args.seconds),
            "--sizes", ",".join(map(str, args.sizes)), "--diff-max-rows", str(args.compare_diff_max_rows),
        ]
        other = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True, timeout=3600).stdout)
        result["compare"] = other
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2))
    if args.format == "json":
        print(json.dumps(result, indent=2))
        return 0
    print(text(result))
    if other is not None:
        print()
        print(text(other))
        print()
        print(compare(result, other))
    return 0


if __name__ == "__main__":
    sys.exit(main())
