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
import string
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import kvpolicy
from kvpolicy.read.loader import parse_policy, shipped_root
from kvpolicy.evaluate.policyset import PolicySet

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


def if_elif_encoding(policy_set: PolicySet) -> Callable[..., tuple[dict[str, str], list[tuple[str, str, str]]]]:
    """The same policy written the way upstream writes it: one function of keyword fields, every
    rule an ``if``, every preference table an ``if/elif`` chain over architecture names, messages
    built by concatenation where a rule fires. Generated from the policy's decision index (the
    same table), it returns the values and the (id, severity, message) of every diagnostic; the
    bench asserts those equal ``resolve``'s on every context it times. No rule ids, locations,
    trace, context checks or result object: that is the extra ``resolve`` does."""
    data = policy_set._index.data
    lines = [
        "def resolve(architecture=None, model_type=None, backend='DEFAULT', transceiver_runtime='auto', "
        "kv_cache_manager='auto', kv_transfer_timeout_ms=60000, features=frozenset(), env={}):",
        "    if backend is None:",
        "        return {}, []",
        "    diags = []",
    ]
    for variable, feature in data["env_features"]:
        lines.append(f"    if env.get({variable!r}) == '1':")
        lines.append(f"        features = features | {{{feature!r}}}")
    names = [d["name"] for d in data["decisions"]]
    for name in names:
        lines.append(f"    req_{name} = {name}")

    def matcher(subject: str, values: list[str], negate: bool) -> str:
        if len(values) == 1:
            return f"{subject} {'!=' if negate else '=='} {values[0]!r}"
        return f"{subject} {'not in' if negate else 'in'} {tuple(sorted(values))!r}"

    def condition(c: dict) -> str:
        terms = [matcher(s, v, n) for s, v, n in c["subjects"]]
        terms += [matcher(f"req_{s}", v, n) for s, v, n in c["requested"]]
        if c["timeout"]:
            terms.append(f"kv_transfer_timeout_ms is {'' if c['timeout'] == 'null' else 'not '}None")
        terms += [f"{f!r} {'in' if on else 'not in'} features" for f, on in c["features"]]
        terms += [matcher(f"env.get({v!r}, '')", values, n) for v, values, n in c["env"]]
        return " and ".join(terms) or "True"

    def message(template: str, current: str, preferred: str = "None") -> str:
        parts = []
        for literal, field, _, _ in string.Formatter().parse(template):
            if literal:
                parts.append(repr(literal))
            if field in names:
                parts.append(f"({field} or 'none')")
            elif field == "architecture":
                parts.append("(architecture or 'this architecture')")
            elif field == "model_type":
                parts.append("(model_type or 'none')")
            elif field == "kv_transfer_timeout_ms":
                parts.append("('null' if kv_transfer_timeout_ms is None else str(kv_transfer_timeout_ms))")
            elif field == "preferred":
                parts.append(f"({preferred} or 'none')")
            elif field is not None:
                parts.append("'none'")
        return " + ".join(parts) or "''"

    def notice(n: list | None, name: str, depth: str, preferred: str = "None") -> None:
        if n is not None:
            lines.append(f"{depth}diags.append(({n[0]!r}, {n[1]!r}, {message(n[3], name, preferred)}))")

    def chain(rules: list, name: str, depth: str) -> None:
        """First matching rule decides: one if/elif chain at ``depth``."""
        for keyword, r in zip(("if", *["elif"] * len(rules)), rules):
            lines.append(f"{depth}{keyword} {condition(r['when'])}:")
            lines.append(f"{depth}    {name} = {r['value']!r}")
            notice(r["notice"], name, depth + "    ")

    decided: set[str] = set()
    for d in data["decisions"]:
        name = d["name"]
        undecided = (d["auto"], "null") if d["null_decides"] else (d["auto"],)
        lines.append(f"    if {name} not in {undecided!r}:")
        lines.append("        pass")
        for r in d["requirements"]:
            lines.append(f"        if ({condition(r['when'])}) and {name} != {r['value']!r}:")
            why = f" ({r['reason'].rstrip('.')})" if r["reason"] else ""
            rest = f", but rule {r['id']} requires {r['value']} when {r['text']}{why}. To fix: set {name} to {r['value']} or {d['auto']}."
            lines.append(f"            diags.append(({r['id']!r}, 'error', {name + ' is explicitly '!r} + {name} + {rest!r}))")
        lines.append("    else:")
        lines.append(f"        {name} = None")
        if d["requirements"]:
            lines.append("        held = []")
            for r in d["requirements"]:
                lines.append(f"        if {condition(r['when'])}:")
                lines.append(f"            held.append(({r['id']!r}, {r['value']!r}, {r['notice']!r}, {r['text']!r}))")
            lines.append("        if held:")
            lines.append("            if len({h[1] for h in held}) > 1:")
            lines.append(
                f"                diags.append(('requirements-conflict', 'error', {name!r} + ' cannot satisfy every requirement: ' + "
                "'; '.join(h[0] + ' requires ' + h[1] + ' (' + h[3] + ')' for h in held) + "
                "'. To fix: turn off one of the features or settings that these rules name.'))"
            )
            lines.append("            else:")
            lines.append(f"                {name} = held[0][1]")
            for r in d["requirements"]:
                if r["notice"] is not None:
                    lines.append(f"                if {r['id']!r} in [h[0] for h in held]:")
                    notice(r["notice"], name, "                    ")
        if d["rows"]:
            lines.append(f"        if {name} is None:")
            lines.append("            preferred = None")
            keyword = "if"
            for architecture, model, value, _ in d["rows"]["qualified"]:
                lines.append(f"            {keyword} architecture == {architecture!r} and model_type == {model!r}:")
                lines.append(f"                preferred = {value!r}")
                keyword = "elif"
            for architecture, (value, _) in d["rows"]["plain"].items():
                lines.append(f"            {keyword} architecture == {architecture!r}:")
                lines.append(f"                preferred = {value!r}")
                keyword = "elif"
            lines.append("            if preferred is not None:")
            lines.append(f"                if {condition(d['adopt'])}:")
            lines.append(f"                    {name} = preferred")
            if d["on_not_adopted"] is not None:
                lines.append("                else:")
                notice(d["on_not_adopted"], name, "                    ", "preferred")
        lines.append(f"        if {name} is None:")
        chain(d["conditionals"], name, "            ")
        depth = "                " if d["conditionals"] else "            "
        if d["conditionals"]:
            lines.append("            else:")
        lines.append(f"{depth}{name} = {d['default']['value']!r}")
        notice(d["default"]["notice"], name, depth)
        decided.add(name)
    for d in data["decisions"]:
        if d["adjustments"]:
            name = d["name"]
            undecided = (d["auto"], "null") if d["null_decides"] else (d["auto"],)
            lines.append(f"    if req_{name} in {undecided!r}:")
            chain(d["adjustments"], name, "        ")
    for c in data["constraints"]:
        lines.append(f"    if {condition(c['when'])}:")
        lines.append(f"        fix = {message(c['fix'], '')}")
        lines.append(f"        diags.append(({c['id']!r}, {c['severity']!r}, {message(c['message'], '')} + ' To fix: ' + fix + '.'))")
    lines.append(f"    return {{{', '.join(f'{n!r}: {n}' for n in names)}}}, diags")
    namespace: dict = {}
    exec(compile("\n".join(lines) + "\n", "<if/elif encoding>", "exec"), namespace)  # noqa: S102 - the bench's own policy
    function = namespace["resolve"]
    function.__source__ = "\n".join(lines)
    return function


def same_answers(policy_set: PolicySet, encoding: Callable[..., Any], contexts: list[dict]) -> None:
    """Assert that ``encoding`` answers every context as ``resolve`` does (values, diagnostics)."""
    for fields in contexts:
        resolution = policy_set.resolve(**fields)
        values, diagnostics = encoding(**fields)
        mine = sorted((d.id, d.severity, d.message) for d in resolution.diagnostics)
        assert (values, sorted(diagnostics)) == (dict(resolution.values), mine), (fields, values, diagnostics, mine)


def answer_grid(policy_set: PolicySet) -> list[dict]:
    """Contexts over every architecture the policy names (and one it does not), every backend and
    runtime request, both timeouts, and each feature alone: where the two encodings must agree."""
    index = policy_set._index
    architectures = [None, "UnknownForCausalLM", *index.data["architectures"]]
    features = [frozenset(), *(frozenset([f]) for f in sorted(index.features))]
    return [
        dict(architecture=a, backend=b, transceiver_runtime=r, kv_transfer_timeout_ms=t, features=f)
        for a in architectures
        for b in index.requests("backend")
        for r in index.requests("transceiver_runtime")
        if r != "null"
        for t in (None, 30000)
        for f in features
    ]


def call_latency(function: Callable[..., Any], contexts: list[dict], seconds: float, batch: int = 50) -> dict[str, float]:
    """As :func:`latency`, for any function of the context's fields."""
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    rng = random.Random(7)
    while time.perf_counter() < deadline:
        fields = rng.choice(contexts)
        start = time.perf_counter_ns()
        for _ in range(batch):
            function(**fields)
        samples.append((time.perf_counter_ns() - start) / batch / 1000)
    return {"p50_us": statistics.median(samples)}


def compare_if_elif(policy_set: PolicySet, contexts: list[dict], seconds: float) -> dict[str, float]:
    """``resolve`` against the if/elif encoding of the same policy, interleaved in one run, with
    the answers checked equal first; and contexts with diagnostics against those without."""
    encoding = if_elif_encoding(policy_set)
    same_answers(policy_set, encoding, contexts + answer_grid(policy_set))
    with_diagnostics = [f for f in contexts if policy_set.resolve(**f).diagnostics]
    without = [f for f in contexts if not policy_set.resolve(**f).diagnostics]
    figures: dict[str, list[float]] = {"resolve": [], "if_elif": [], "with": [], "without": []}
    for _ in range(5):  # interleaved rounds: both see the same machine
        figures["resolve"].append(latency(policy_set, contexts, seconds / 20)["p50_us"])
        figures["if_elif"].append(call_latency(encoding, contexts, seconds / 20)["p50_us"])
        if with_diagnostics and without:
            figures["with"].append(latency(policy_set, with_diagnostics, seconds / 20)["p50_us"])
            figures["without"].append(latency(policy_set, without, seconds / 20)["p50_us"])
    result = {
        "resolve_p50_us": statistics.median(figures["resolve"]),
        "if_elif_p50_us": statistics.median(figures["if_elif"]),
    }
    result["resolve_vs_if_elif"] = result["resolve_p50_us"] / result["if_elif_p50_us"]
    if figures["with"]:
        result["with_diagnostics_p50_us"] = statistics.median(figures["with"])
        result["without_diagnostics_p50_us"] = statistics.median(figures["without"])
        result["diagnostics_cost"] = result["with_diagnostics_p50_us"] / result["without_diagnostics_p50_us"]
    return result


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
