"""The long fuzz of the strict NIXL metadata reader (issue 40), outside the gate.

A live agent's metadata (one DRAM region), every offset set to every other byte value (or the gate's
five, ``--values five``), and every truncation: each goes through ``metadata.admit`` (timed), and
those it accepts are loaded by NIXL in forked probe children (``transports/probe.py`` starts them,
``transports/probe_child.py`` runs in them) to count what still crashes NIXL. With ``--probe-limit N`` only N accepted blobs (a seeded sample, seed printed) are
loaded. Prints the figures and writes them as JSON with ``--json FILE``.

    .venv/bin/python bench/metadata_fuzz.py                   # every value, 2,000 loads
    .venv/bin/python bench/metadata_fuzz.py --values five --probe-limit 0   # every accepted blob
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("UCX_MODULES", "^ib")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("NIXL_LOG_LEVEL", "ERROR")

FIVE = (lambda b: b ^ 0xFF, lambda b: 0x00, lambda b: 0x80, lambda b: b ^ 0x01, lambda b: 0x7F)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", choices=("all", "five"), default="all")
    parser.add_argument("--probe-limit", type=int, default=2000, help="accepted blobs loaded in probe children (0: all)")
    parser.add_argument("--seed", type=int, default=20261206)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)

    import numpy as np

    from kvpolicy.transports.agent import NixlSettings, create_agent, nixl_version
    from kvpolicy.transports.metadata import Expected, MetadataError, admit, read_metadata
    from kvpolicy.transports.probe import MetadataProbe

    settings = NixlSettings()
    agent = create_agent("decode-0", settings)
    buffer = np.zeros(1 << 20, dtype=np.uint8)
    agent.register_memory([(buffer.ctypes.data, buffer.nbytes, 0, "")], "DRAM")
    blob = agent.get_agent_metadata()
    (region,) = read_metadata(blob).sections[0].regions
    expected = Expected("decode-0", ("UCX",), "DRAM", region.address, region.length, 0)

    candidates: list[tuple[str, bytes]] = []
    for at, old in enumerate(blob):
        values = range(256) if args.values == "all" else sorted({f(old) for f in FIVE})
        candidates += [(f"{at}:{v}", blob[:at] + bytes([v]) + blob[at + 1 :]) for v in values if v != old]
    candidates += [(f"truncated:{n}", blob[:n]) for n in range(len(blob))]

    started = time.perf_counter()
    accepted = []
    for name, mutated in candidates:
        try:
            admit(mutated, expected)
        except MetadataError:
            continue
        accepted.append((name, mutated))
    read_s = time.perf_counter() - started

    rng = random.Random(args.seed)
    loads = accepted if args.probe_limit <= 0 or len(accepted) <= args.probe_limit else rng.sample(accepted, args.probe_limit)
    verdicts: dict[str, str | None] = {}
    done = threading.Event()

    def answered(name: str, verdict: str | None) -> None:
        verdicts[name] = verdict
        if len(verdicts) == len(loads):
            done.set()

    started = time.perf_counter()
    with MetadataProbe(settings, max_running=4, max_waiting=len(loads) + 1, per_owner=len(loads) + 1, cache_size=1) as probe:
        for name, mutated in loads:
            probe.start(mutated, lambda verdict, name=name: answered(name, verdict))
        if loads and not done.wait(3600):
            print(f"{len(loads) - len(verdicts)} probes never answered", file=sys.stderr)
    probe_s = time.perf_counter() - started
    crashed = sorted(name for name, verdict in verdicts.items() if verdict and ("crashed" in verdict or "exited" in verdict))
    figures = {
        "nixl": nixl_version(),
        "blob_bytes": len(blob),
        "candidates": len(candidates),
        "refused_by_reader": len(candidates) - len(accepted),
        "accepted_by_reader": len(accepted),
        "reader_us_per_blob": round(read_s / len(candidates) * 1e6, 1),
        "loaded_in_children": len(loads),
        "seed": args.seed,
        "loaded_ok": sum(1 for v in verdicts.values() if v is None),
        "refused_by_nixl": sum(1 for v in verdicts.values() if v is not None and "rejected" in v),
        "crashed": len(crashed),
        "crashed_inputs": crashed[:50],
        "probe_s": round(probe_s, 1),
    }
    for key, value in figures.items():
        print(f"{key}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if crashed else 0


if __name__ == "__main__":
    raise SystemExit(main())
