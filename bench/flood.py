"""Fair service under an allowed key's flood: one decoder's request latency while another allowed
decoder floods the same sender with asks (each a new one, for an id never offered), within its
per-key budget.

    python bench/flood.py [--requests N] [--format table|json]

Three processes (tests/transports/transfer_worker.py): a sender, decoder A (one 4 KiB-block request
at a time, its own ``total_us`` per request) and decoder B (asks of one block, paced at the per-key
budget, ``Limits.frames_per_s``, from inside its process). A's p50 is measured quiet, then during B's
flood, interleaved phases; reported as ``flooded_vs_quiet`` (issue 26's target: at most 2x), per
frame shape (1 ask per frame; 256 asks per batch frame).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# tests.transports.transfer_worker lives in the repository, not in the package; its workers (forked
# from multiprocessing's fork server) inherit this sys.path.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

LAYOUT = dict(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)


def _p50_of_a(prefill, a, n: int, tag: str) -> float:
    times = []
    for i in range(n):
        rid = f"{tag}-{i}"
        prefill.call("send", rid, [1 + i % 8], to=a.key_name)
        a.call("receive", rid, [20 + i % 8])
        outcome = a.call("wait", rid)
        if outcome["state"] != "completed":
            raise RuntimeError(f"request {rid}: {outcome}")
        times.append(outcome["metrics"]["total_us"])
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="A's requests per phase")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    from tests.transports.transfer_worker import Worker

    from kvpolicy.transports import Limits

    budget = Limits().frames_per_s
    prefill = Worker("prefill", layout=LAYOUT, seed=1)
    a = Worker("decode-a", layout=LAYOUT, seed=2)
    b = Worker("decode-b", layout=LAYOUT, seed=3)
    results: dict[str, dict[str, float]] = {}
    try:
        a.call("connect", prefill.address)
        b.call("connect", prefill.address)
        _p50_of_a(prefill, a, 20, "warm")
        for shape, per_frame in (("1 ask per frame", 1), ("256 asks per frame", 256)):
            quiet, flooded = [], []
            for rep in range(3):
                quiet.append(_p50_of_a(prefill, a, args.requests, f"q{per_frame}-{rep}"))
                seconds = 2.0 + args.requests * 0.005
                b.call("flood", prefill.key_name, seconds, per_frame, budget)
                time.sleep(0.3)  # the flood under way
                flooded.append(_p50_of_a(prefill, a, args.requests, f"f{per_frame}-{rep}"))
                time.sleep(max(0.0, seconds))  # the flood over before the next quiet phase
            results[shape] = {
                "quiet_p50_us": round(statistics.median(quiet), 1),
                "flooded_p50_us": round(statistics.median(flooded), 1),
                "flooded_vs_quiet": [round(f / q, 2) for f, q in zip(flooded, quiet)],
            }
        stats = prefill.call("stats")
    finally:
        for worker in (b, a, prefill):
            worker.stop()
    summary = {"budget_asks_per_s": budget, "requests_per_phase": args.requests, "shapes": results,
               "dropped_over_budget": stats["dropped_over_budget"], "repeated_asks": stats["repeated_asks"],
               "targets": {"within_2x": {s: max(r["flooded_vs_quiet"]) <= 2 for s, r in results.items()}}}
    if args.format == "json":
        print(json.dumps(summary))
    else:
        for shape, r in results.items():
            print(f"{shape:<20} A's p50 quiet {r['quiet_p50_us']:8.1f} us, flooded {r['flooded_p50_us']:8.1f} us, "
                  f"flooded/quiet {r['flooded_vs_quiet']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
