"""What it costs to load a peer's NIXL metadata in a child process first (transports/probe.py), and a
search for the one-byte mutations of real metadata that crash NIXL's parser.

    python bench/probe.py [--reps 20] [--format table|json]
    python bench/probe.py --search evenly|all|bytes|truncate|lengths [--offsets 79,367] [--format table|json]

The benchmark: a peer agent (its own process, one 64 MiB DRAM registration, as a transceiver's
hello carries) publishes its metadata; ``--reps`` probes of distinct genuine blobs (the same
metadata under different agent names: a remembered verdict would cost nothing) per mode, each
waited for, against a plain in-process ``add_remote_agent`` + ``remove_remote_agent`` of the same
blob on a live agent (what the transceiver does without a probe). Reported per mode: p50 / p90 of
one probe and their ratio to the in-process load, the helper's start (first probe), a probe of a
crashing blob and the probe after it (server mode restarts there), a remembered verdict, and the
helper's memory. Also the import cost the design works around: ``import nixl`` (imports torch on a
CPU-only torch) against importing the NIXL build directly. And (fork mode) what a new peer's proof of
memory costs, the old way against the new, interleaved (:func:`bench_proofs`): a probe, then the nonce
from the sender's own agent, against the nonce from a probe child (:meth:`MetadataProbe.prove`), each
until the peer echoed it and its metadata is loaded in the sender's agent.

``--search`` runs mutations of a fresh peer's metadata through the probe (fork mode, two at a time)
and lists those that kill the loading process: ``evenly`` (108 offsets evenly spaced, each byte
XOR 0xFF, as issue 26 did), ``all`` (every offset, 5 values each), ``bytes`` (all 256 values at
``--offsets``), ``truncate`` (every prefix) and ``lengths`` (each 8-byte length field set to huge
values).

Ratios compare figures measured in this run; figures themselves move 15-25% between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import threading
import time
from typing import Any

# UCX reads these when NIXL loads it; children inherit them. See transports/agent.py for why.
for _key, _value in (("UCX_NET_DEVICES", "lo"), ("UCX_MODULES", "^ib"), ("UCX_CMA_SEG_SIZE", "8M"), ("NIXL_LOG_LEVEL", "WARN")):
    os.environ.setdefault(_key, _value)

from kvpolicy.transports.agent import NixlSettings, create_agent, import_nixl  # noqa: E402
from kvpolicy.transports.probe import MODES, MetadataProbe  # noqa: E402

PEER_NAME = "bench-peer-0000"


def start_peer(settings: NixlSettings) -> tuple[int, bytes]:
    """A peer agent in a forked process (before this one loads UCX), its logs to /dev/null (a probed
    peer logs a refused reverse connection now and then); (pid, its metadata)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            import numpy as np

            agent = create_agent(PEER_NAME, settings)
            buffer = np.zeros(64 << 20, dtype=np.uint8)
            agent.register_memory([(buffer.ctypes.data, buffer.nbytes, 0, "")], "DRAM")
            blob = agent.get_agent_metadata()
            os.write(write_fd, struct.pack("<Q", len(blob)) + blob)
            os.close(write_fd)
            while True:
                time.sleep(3600)
        finally:
            os._exit(0)
    os.close(write_fd)
    data = b""
    while True:
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(read_fd)
    (size,) = struct.unpack_from("<Q", data)
    if len(data) != 8 + size:
        raise RuntimeError("the peer agent did not start")
    return pid, data[8:]


def renamed(blob: bytes, index: int, name: str = PEER_NAME) -> bytes:
    """The same metadata under another agent name of the same length (a distinct, genuine blob)."""
    raw = name.encode()
    other = raw[:-4] + f"{index:04d}".encode()
    return blob.replace(raw, other, 1)


ECHO_NAME = "bench-echo-0000"
_ECHO = """
import os, sys, time
out = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
import numpy as np
from kvpolicy.transports.agent import NixlSettings, create_agent
settings = NixlSettings()
settings.apply_environment()
agent = create_agent(sys.argv[1], settings)
buffer = np.zeros(64 << 20, dtype=np.uint8)
agent.register_memory([(buffer.ctypes.data, buffer.nbytes, 0, "")], "DRAM")
blob = agent.get_agent_metadata()
os.write(out, len(blob).to_bytes(8, "little") + blob)
while True:  # every notification, as a receiver waiting for its welcome polls for the proof nonce
    for messages in agent.get_new_notifs().values():
        for message in messages:
            os.write(out, message.hex().encode() + b"\\n")
    time.sleep(0.0005)
"""


class EchoPeer:
    """A peer agent in a fresh interpreter that writes back every NIXL notification it gets (what a
    receiver does with a proof nonce, without the control plane)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _ECHO, ECHO_NAME], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.process.stdout is not None
        size = int.from_bytes(self.process.stdout.read(8) or b"\0", "little")
        self.metadata = self.process.stdout.read(size)
        if not self.metadata.startswith(b"nixlSerDes|"):
            raise RuntimeError("the echo peer did not start")

    def wait_for(self, message: bytes) -> None:
        assert self.process.stdout is not None
        while bytes.fromhex(self.process.stdout.readline().decode()) != message:
            pass

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def bench_proofs(settings: NixlSettings, reps: int) -> dict[str, Any]:
    """What a new peer's proof of memory costs the sender, old way against new, interleaved: the old
    way probes the blob (a child loads it and exits), loads it in the sender's own agent and sends the
    nonce from there; the new way has a child load it and send the nonce (:meth:`MetadataProbe.prove`),
    releases the child once the peer echoed it, then loads the blob in its own agent. Both end when
    the blob is loaded in the sender's agent after the echo; each rep a new agent name."""
    echo = EchoPeer()
    agent = create_agent("bench-sender", settings)
    old: list[float] = []
    new: list[float] = []
    sent: list[float] = []
    try:
        with MetadataProbe(settings, mode="fork", max_running=4) as probe:
            assert probe.check(renamed(echo.metadata, 9999, ECHO_NAME)) is None  # (the helper's start)
            for i in range(reps + 1):
                message = b"kvpolicy-proof:" + os.urandom(16).hex().encode()
                blob = renamed(echo.metadata, 2 * i, ECHO_NAME)
                started = time.perf_counter()
                assert probe.check(blob) is None
                name = agent.add_remote_agent(blob)
                agent.send_notif(name, message)
                echo.wait_for(message)
                old.append((time.perf_counter() - started) * 1000)
                agent.remove_remote_agent(name)

                message = b"kvpolicy-proof:" + os.urandom(16).hex().encode()
                blob = renamed(echo.metadata, 2 * i + 1, ECHO_NAME)
                reported = threading.Event()
                verdicts: list[str | None] = []
                started = time.perf_counter()
                release = probe.prove(
                    blob,
                    lambda v, verdicts=verdicts, reported=reported: (verdicts.append(v), reported.set()),
                    agent=f"bench-{os.getpid()}-{i:016x}", message=message, linger_s=10.0,
                )
                assert reported.wait(60) and verdicts == [None], verdicts
                sent.append((time.perf_counter() - started) * 1000)
                echo.wait_for(message)
                release()
                name = agent.add_remote_agent(blob)
                new.append((time.perf_counter() - started) * 1000)
                agent.remove_remote_agent(name)
            lingering = probe.lingering
    finally:
        echo.close()
    old_p50, old_p90 = percentiles(old[1:])
    new_p50, new_p90 = percentiles(new[1:])
    return {
        "old_p50_ms": old_p50, "old_p90_ms": old_p90, "new_p50_ms": new_p50, "new_p90_ms": new_p90,
        "sent_p50_ms": percentiles(sent[1:])[0], "new_vs_old_p50": new_p50 / old_p50, "new_vs_old_p90": new_p90 / old_p90,
        "lingering_at_end": lingering,
    }


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return statistics.median(ordered), p90


def timed_check(probe: MetadataProbe, blob: bytes) -> tuple[float, str | None]:
    started = time.perf_counter()
    verdict = probe.check(blob)
    return (time.perf_counter() - started) * 1000, verdict


def rss_kib(pid: int) -> int:
    """Resident memory of a process and its children, KiB (0 if gone)."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as status:
            total = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0
    return total


def crashing_blob(blob: bytes) -> bytes:
    """The descriptor list's memory type made negative: SIGSEGV in loadRemoteMD (tests/transports/test_probe.py)."""
    marker = b"nixlSDList|t"
    at = blob.index(marker) + len(marker) + 8 + 3
    return blob[:at] + b"\x80" + blob[at + 1 :]


def bench_inprocess(blob: bytes, settings: NixlSettings, reps: int) -> dict[str, float]:
    agent = create_agent("bench-local", settings)
    samples = []
    for i in range(reps + 1):
        started = time.perf_counter()
        name = agent.add_remote_agent(renamed(blob, 9000 + i))
        agent.remove_remote_agent(name)
        samples.append((time.perf_counter() - started) * 1000)
    first = samples.pop(0)  # (the first opens the UCX endpoint to the peer's address: a new peer's case)
    p50, p90 = percentiles(samples)
    return {"first_ms": first, "p50_ms": p50, "p90_ms": p90}


def bench_mode(mode: str, blob: bytes, settings: NixlSettings, reps: int, base: int) -> dict[str, Any]:
    probe = MetadataProbe(settings, mode=mode, max_running=4)
    try:
        first_ms, verdict = timed_check(probe, renamed(blob, base))
        assert verdict is None, verdict
        samples = []
        for i in range(1, reps + 1):
            ms, verdict = timed_check(probe, renamed(blob, base + i))
            assert verdict is None, verdict
            samples.append(ms)
        p50, p90 = percentiles(samples)
        helper = probe._helper.process.pid if probe._helper and probe._helper.process else None
        helper_rss = rss_kib(helper) if helper else 0
        crash_ms, crash_verdict = timed_check(probe, crashing_blob(renamed(blob, base + reps + 1)))
        after_ms, verdict = timed_check(probe, renamed(blob, base + reps + 2))
        assert verdict is None, verdict
        started = time.perf_counter()
        for _ in range(1000):
            probe.cached(renamed(blob, base + 1))
        cached_us = (time.perf_counter() - started) * 1000
        # Concurrency: max_running distinct blobs at once.
        done = threading.Semaphore(0)
        started = time.perf_counter()
        for i in range(4):
            probe.start(renamed(blob, base + reps + 10 + i), lambda verdict: done.release())
        for _ in range(4):
            done.acquire(timeout=60)
        four_ms = (time.perf_counter() - started) * 1000
    finally:
        probe.close()
    return {
        "first_probe_ms": first_ms, "p50_ms": p50, "p90_ms": p90, "crash_probe_ms": crash_ms,
        "crash_verdict": crash_verdict, "probe_after_crash_ms": after_ms, "cached_us": cached_us,
        "four_at_once_ms": four_ms, "helper_rss_mib": helper_rss / 1024,
    }


def import_costs(api_name: str) -> dict[str, float]:
    """Wall time of a fresh interpreter that imports what a child needs, and ``import nixl``."""
    out = {}
    for label, code in (
        ("python_pass", "pass"),
        ("import_nixl", "import nixl._api"),
        ("import_build", f"import kvpolicy.transports.agent, {api_name}"),
    ):
        samples = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            samples.append((time.perf_counter() - started) * 1000)
        out[label] = statistics.median(samples)
    return out


# ----------------------------------------------------------------------------------- search ----


def length_fields(blob: bytes) -> list[int]:
    """Offsets of the serializer's 8-byte little-endian length fields (tag, length, value, '|')."""
    found = []
    for at in range(len(blob) - 8):
        (length,) = struct.unpack_from("<Q", blob, at)
        end = at + 8 + length
        if 0 < length < len(blob) and end < len(blob) and blob[end : end + 1] == b"|" and blob[at - 1 : at].isalpha():
            found.append(at)
    return found


def search(kind: str, blob: bytes, settings: NixlSettings, offsets: list[int]) -> dict[str, Any]:
    cases: list[tuple[str, bytes]] = []

    def put(label: str, at: int, value: int) -> None:
        if blob[at] != value:
            cases.append((f"{label} offset {at} -> 0x{value:02x}", blob[:at] + bytes([value]) + blob[at + 1 :]))

    if kind == "evenly":
        for at in sorted({i * len(blob) // 108 for i in range(108)}):
            put("byte", at, blob[at] ^ 0xFF)
    elif kind == "all":
        for at in range(len(blob)):
            for value in sorted({blob[at] ^ 0xFF, 0x00, 0xFF, blob[at] ^ 0x80, (blob[at] + 1) & 0xFF}):
                put("byte", at, value)
    elif kind == "bytes":
        for at in offsets:
            for value in range(256):
                put("byte", at, value)
    elif kind == "truncate":
        cases = [(f"first {n} bytes", blob[:n]) for n in range(len(blob))]
    elif kind == "lengths":
        for at in length_fields(blob):
            for value in (len(blob), 1 << 31, 1 << 32, 1 << 62, (1 << 64) - 1):
                cases.append((f"length at {at} -> {value:#x}", blob[:at] + struct.pack("<Q", value) + blob[at + 8 :]))
    outcomes: dict[str, list[str]] = {}
    lock = threading.Lock()
    slots = threading.Semaphore(2)
    started = time.perf_counter()
    with MetadataProbe(settings, mode="fork", max_running=2, timeout_s=5.0) as probe:
        probe.warm()
        for label, data in cases:
            slots.acquire()

            def done(verdict: str | None, label: str = label) -> None:
                with lock:
                    outcomes.setdefault("loaded" if verdict is None else verdict.split(":")[0], []).append(label)
                slots.release()

            probe.start(data, done)
        for _ in range(2):
            slots.acquire()
    crashes = {key: value for key, value in outcomes.items() if "crashed" in key or "timed out" in key}
    return {
        "kind": kind, "cases": len(cases), "seconds": round(time.perf_counter() - started, 1),
        "counts": {key: len(value) for key, value in outcomes.items()}, "crashes": crashes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--search", choices=("evenly", "all", "bytes", "truncate", "lengths"))
    parser.add_argument("--offsets", default="", help="--search bytes: offsets to try all 256 values at")
    args = parser.parse_args(argv)
    settings = NixlSettings()
    peer, blob = start_peer(settings)
    try:
        if args.search:
            result = search(args.search, blob, settings, [int(x) for x in args.offsets.split(",") if x])
            if args.format == "json":
                print(json.dumps(result))
            else:
                print(f"{result['cases']} mutations ({result['kind']}) of a {len(blob)}-byte blob in {result['seconds']} s: {result['counts']}")
                for verdict, labels in result["crashes"].items():
                    print(f"  {verdict}: {len(labels)}")
                    for label in labels:
                        print(f"    {label}")
            return 0
        started = time.perf_counter()
        api = import_nixl(settings)
        inprocess = bench_inprocess(blob, settings, args.reps)
        modes = {}
        for index, mode in enumerate(m for m in args.modes.split(",") if m):
            modes[mode] = bench_mode(mode, blob, settings, args.reps, base=1000 * (index + 1))
        proofs = bench_proofs(settings, args.reps) if "fork" in args.modes.split(",") else None
        imports = import_costs(api.__name__)
    finally:
        os.kill(peer, 9)
        os.waitpid(peer, 0)
    summary: dict[str, Any] = {
        "blob_bytes": len(blob), "reps": args.reps, "inprocess": inprocess, "modes": modes, "proofs": proofs, "imports_ms": imports,
        "seconds": round(time.perf_counter() - started, 1),
    }
    for mode, figures in modes.items():
        figures["p50_vs_inprocess"] = figures["p50_ms"] / inprocess["p50_ms"]
        figures["p90_vs_inprocess"] = figures["p90_ms"] / inprocess["p90_ms"]
        figures["p50_vs_first_inprocess"] = figures["p50_ms"] / inprocess["first_ms"]
    if args.format == "json":
        print(json.dumps(summary))
        return 0
    print(f"NIXL metadata probe, {len(blob)}-byte blob, {args.reps} probes of distinct genuine blobs per mode (ratios are within this run)\n")
    print(
        f"in-process add_remote_agent + remove_remote_agent: first (new address) {inprocess['first_ms']:.2f} ms, "
        f"then p50 {inprocess['p50_ms']:.2f} ms, p90 {inprocess['p90_ms']:.2f} ms\n"
    )
    header = f"{'mode':<7}{'p50 ms':>8}{'p90 ms':>8}{'p50 x':>8}{'p90 x':>8}{'x new':>7}{'first':>8}{'crash':>8}{'next':>8}{'4 at once':>10}{'helper MiB':>11}"
    print(header)
    print("-" * len(header))
    for mode, f in modes.items():
        print(
            f"{mode:<7}{f['p50_ms']:>8.1f}{f['p90_ms']:>8.1f}{f['p50_vs_inprocess']:>8.0f}{f['p90_vs_inprocess']:>8.0f}{f['p50_vs_first_inprocess']:>7.1f}"
            f"{f['first_probe_ms']:>8.0f}{f['crash_probe_ms']:>8.0f}{f['probe_after_crash_ms']:>8.0f}{f['four_at_once_ms']:>10.0f}{f['helper_rss_mib']:>11.0f}"
        )
    print("\n(first: the first probe, helper start included; crash: a blob that kills the parser; next: the probe after it;")
    print(" 4 at once: four distinct blobs started together, until the last verdict; x: / the in-process load;")
    print(" x new: p50 / the in-process load of a new address)")
    if proofs:
        print(
            f"\na new peer's proof of memory, to its metadata loaded in the sender's agent (fork mode, interleaved): "
            f"nonce from the sender's agent after a probe {proofs['old_p50_ms']:.1f} ms p50 / {proofs['old_p90_ms']:.1f} p90; "
            f"from a probe child {proofs['new_p50_ms']:.1f} / {proofs['new_p90_ms']:.1f} "
            f"({proofs['new_vs_old_p50']:.2f}x / {proofs['new_vs_old_p90']:.2f}x; the child reports it sent at {proofs['sent_p50_ms']:.1f} ms p50)"
        )
    any_mode = next(iter(modes.values()), None)
    if any_mode:
        print(f"a remembered verdict: {any_mode['cached_us']:.1f} us")
    print(
        f"child imports (fresh interpreter, ms): python -c pass {imports['python_pass']:.0f}, import nixl {imports['import_nixl']:.0f}, "
        f"import kvpolicy.transports.agent + {api.__name__} {imports['import_build']:.0f}"
    )
    print(f"\n({summary['seconds']} s; max RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
