"""The metadata probe (transports/probe.py): an allow-listed peer's NIXL metadata is loaded in a child
process first, and a blob that kills NIXL's parser is refused without harm to this process.

The metadata is a real transceiver's (a worker process's, as its hello carries it). The crashing
blobs are one-byte mutations of it found with ``bench/probe.py --search`` (issue 26, item 7): they
are made here from the fresh blob by rules tied to its structure (the offsets move with the agent
name's length), and each is first shown to kill a plain NIXL process that loads it, independently
of the probe.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time

import pytest

from kvpolicy.transports import KVLayout
from kvpolicy.transports.agent import NixlSettings, import_nixl
from kvpolicy.transports.probe import MetadataProbe, ProbeOutcome

from tests.support.nixl_blobs import crashing_mutants
from tests.support.transfer import children_of

from .conftest import requires_nixl
from .transfer_worker import Worker

pytestmark = requires_nixl

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)


_PLAIN_LOAD = """
import os, sys
api = __import__(sys.argv[1], fromlist=["nixl_agent"])
agent = api.nixl_agent("plain-" + str(os.getpid()), api.nixl_agent_config(backends=["UCX"]))
agent.add_remote_agent(sys.stdin.buffer.read())
os._exit(0)
"""


def plain_loads(blobs: list[bytes]) -> list[int]:
    """Exit status of a plain process (NIXL's own Python API, nothing of kvpolicy) that loads each
    blob, all at once; minus the signal that killed it."""
    api = import_nixl(NixlSettings()).__name__
    processes = [
        subprocess.Popen([sys.executable, "-c", _PLAIN_LOAD, api], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in blobs
    ]
    for process, blob in zip(processes, blobs):
        process.stdin.write(blob)
        process.stdin.close()
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(60))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append(process.wait())
    return codes


@pytest.fixture(scope="module")
def peer():
    """A real transceiver in a worker process: its agent name and the NIXL metadata its hello carries."""
    worker = Worker("probed", layout=LAYOUT.to_wire(), seed=1)
    try:
        agent, blob = worker.call("metadata")
        yield worker, agent, blob
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def probe():
    with MetadataProbe(NixlSettings(), mode="fork", timeout_s=10.0) as probe:
        yield probe


def renamed(blob: bytes, agent: str, char: str) -> bytes:
    """The same metadata under an agent name one character different: a distinct, genuine blob."""
    name = agent.encode()
    return blob.replace(name, name[:-1] + char.encode(), 1)


def test_genuine_metadata_is_accepted(peer, probe):
    _, agent, blob = peer
    assert probe.check(blob) is None
    assert probe.stats["children"] >= 1


def test_crashing_mutations_are_refused_and_nothing_else_dies(peer, probe):
    worker, agent, blob = peer
    cases = crashing_mutants(blob)
    # First, independently of the probe: each mutation kills a plain process that loads it, and the
    # genuine blob does not.
    codes = plain_loads([blob] + [mutant for _, _, _, mutant, _ in cases])
    assert codes[0] == 0, f"the genuine blob failed to load in a plain process: {codes[0]}"
    crashing = [(case, code) for case, code in zip(cases, codes[1:]) if code < 0]
    assert len(crashing) >= 2, (
        "fewer than 2 of the known mutations crash this NIXL build any more "
        f"({[(c[0], code) for c, code in zip(cases, codes[1:])]}): find new ones with bench/probe.py --search"
    )
    for (name, at, byte, mutant, dies), code in zip(cases, codes[1:]):
        verdict = probe.check(mutant)
        if code < 0:
            assert verdict is not None and "crashed" in verdict and f"signal {-code}, {dies})" in verdict, (name, at, byte, code, verdict)
        else:  # (a mutation this build survives: the probe agrees with the plain process)
            assert (verdict is None) == (code == 0), (name, at, byte, code, verdict)
    # This process lives (we are here), the peer was not disturbed, and the probe still accepts a
    # genuine blob it has not seen: the zygote outlived every crash.
    assert worker.process.is_alive() and worker.call("stats")["internal_errors"] == 0
    assert probe.check(renamed(blob, agent, "x")) is None
    assert probe.stats["crashed"] >= len(crashing)


def test_remembered_verdicts_fork_nothing(peer, probe):
    _, agent, blob = peer
    crash = crashing_mutants(blob)[0][3]
    for sample in (blob, crash):
        first = probe.check(sample)
        children = probe.stats["children"]
        answers: list = []
        assert probe.start(sample, answers.append) is False  # answered at once, on this thread
        assert answers == [first] and probe.check(sample) == first
        assert probe.cached(sample) == (True, first)
        assert probe.stats["children"] == children
    assert probe.cached(renamed(blob, agent, "q")) == (False, None)


def test_concurrency_bound_answers_busy_and_joins_duplicates(peer):
    _, agent, blob = peer
    with MetadataProbe(NixlSettings(), max_running=1, max_waiting=0) as probe:
        first, duplicate, other = [], [], []
        done = threading.Event()
        # The helper takes ~0.5 s to start: the first probe is still running when the others come.
        assert probe.start(renamed(blob, agent, "a"), lambda v: (first.append(v), done.set())) is True
        assert probe.start(renamed(blob, agent, "a"), duplicate.append) is True  # the same blob: joins it
        assert probe.start(renamed(blob, agent, "b"), other.append) is False
        assert other and other[0].startswith("busy:"), other
        assert done.wait(60) and first == [None]
        for _ in range(100):  # (the duplicate's callback runs right after the first's)
            if duplicate:
                break
            time.sleep(0.01)
        assert duplicate == [None]
        assert probe.stats["busy"] == 1 and probe.stats["coalesced"] == 1 and probe.stats["children"] == 1
        # Busy is not remembered: once the first is done, the other is probed.
        assert probe.check(renamed(blob, agent, "b")) is None


def test_beyond_the_running_bound_a_few_wait_for_a_slot(peer):
    _, agent, blob = peer
    with MetadataProbe(NixlSettings(), max_running=1, max_waiting=1) as probe:
        answers: dict[str, list] = {"d": [], "e": [], "f": []}
        both = threading.Semaphore(0)
        for char in "de":
            assert probe.start(renamed(blob, agent, char), lambda v, c=char: (answers[c].append(v), both.release())) is True
        assert probe.start(renamed(blob, agent, "f"), answers["f"].append) is False
        assert answers["f"][0].startswith("busy: 1 metadata probes running and 1 waiting"), answers
        assert both.acquire(timeout=60) and both.acquire(timeout=60)
        assert answers["d"] == [None] and answers["e"] == [None]
        assert probe.stats["children"] == 2 and probe.stats["busy"] == 1


def test_one_owners_burst_cannot_take_every_slot(peer):
    """Issue 38, item 6: one key's distinct blobs get at most ``per_owner`` probes at once; its next is
    busy at once, while another key's first hello still finds a slot (and waits in turn)."""
    _, agent, blob = peer
    with MetadataProbe(NixlSettings(), max_running=1, max_waiting=4, per_owner=2) as probe:
        assert probe.per_owner == 2
        answers: dict[str, list] = {c: [] for c in "ghijk"}
        done = threading.Semaphore(0)

        def on(char):
            return lambda v: (answers[char].append(v), done.release())

        assert probe.start(renamed(blob, agent, "g"), on("g"), owner="insider") is True
        assert probe.start(renamed(blob, agent, "h"), on("h"), owner="insider") is True
        assert probe.start(renamed(blob, agent, "i"), answers["i"].append, owner="insider") is False
        assert answers["i"][0].startswith("busy: this peer has 2 metadata probes in flight already"), answers
        assert probe.start(renamed(blob, agent, "j"), on("j"), owner="honest") is True  # a slot is left for others
        for _ in range(3):
            assert done.acquire(timeout=60)
        assert answers["g"] == answers["h"] == answers["j"] == [None]
        # Once its probes are answered, the owner may probe again.
        assert probe.check(renamed(blob, agent, "k")) is None
    assert MetadataProbe(NixlSettings(), max_running=4, max_waiting=16).per_owner == 5
    with pytest.raises(ValueError, match="per_owner"):
        MetadataProbe(NixlSettings(), per_owner=0)


def test_a_child_that_overruns_its_timeout_is_killed_and_not_remembered(peer, probe):
    _, agent, blob = peer
    sample = renamed(blob, agent, "t")
    started = time.monotonic()
    verdict = probe.check(sample, timeout_s=0.001)  # (its alarm fires while it creates its agent)
    assert verdict is not None and "timed out" in verdict, verdict
    assert time.monotonic() - started < 10
    assert probe.cached(sample) == (False, None)
    assert probe.check(sample) is None  # a later hello with the same metadata is probed again


def test_malformed_metadata_nixl_rejects_cleanly_is_refused(probe):
    for sample in (b"", b"nixlSerDes|", b"nixlSerDes|Agent\xff\xff\xff\xff\xff\xff\xff\x7fx"):
        verdict = probe.check(sample)
        assert verdict is not None and verdict.startswith("NIXL rejected it"), (sample, verdict)
        assert probe.cached(sample) == (False, None)  # (a NIXL error may be transient: not remembered)


@pytest.mark.parametrize("mode", ["server", "spawn"])
def test_other_modes_refuse_a_crash_and_go_on(peer, mode):
    _, agent, blob = peer
    crash = crashing_mutants(blob)[0][3]
    with MetadataProbe(NixlSettings(), mode=mode, timeout_s=10.0) as probe:
        assert probe.check(renamed(blob, agent, "s")) is None
        verdict = probe.check(crash)
        assert verdict is not None and "crashed" in verdict and "SIGSEGV" in verdict, verdict
        assert probe.check(renamed(blob, agent, "u")) is None  # (server: a new server)
        if mode == "server":
            assert probe.stats["helper_starts"] == 2


def test_close_answers_probes_in_flight(peer):
    _, agent, blob = peer
    probe = MetadataProbe(NixlSettings())
    answers: list = []
    assert probe.start(renamed(blob, agent, "c"), answers.append) is True
    probe.close()
    assert answers == ["the metadata probe is closed"]
    late: list = []
    assert probe.start(blob, late.append) is False and late == ["the metadata probe is closed"]


def test_outcomes_read_as_reasons():
    assert ProbeOutcome(-11).verdict == "the NIXL parser crashed on it (signal 11, SIGSEGV)"
    assert ProbeOutcome(-11).cacheable and ProbeOutcome(0).cacheable
    assert not ProbeOutcome(-9).cacheable and not ProbeOutcome(-14, timeout_s=2).cacheable
    assert ProbeOutcome(-14, timeout_s=2).verdict == "the metadata probe timed out after 2 s"
    assert not ProbeOutcome(10, "NIXL_ERR_BACKEND").cacheable
    with pytest.raises(ValueError):
        MetadataProbe(mode="thread")
    with pytest.raises(ValueError):
        MetadataProbe(max_running=0)


_ORPHAN = """
import os, sys, time
from kvpolicy.transports.agent import NixlSettings
from kvpolicy.transports.probe import MetadataProbe
from kvpolicy.transports.probe_child import _prepare
_prepare(sys.argv[1], NixlSettings())  # (import the NIXL build directly: no torch)
probe = MetadataProbe(NixlSettings())
probe.warm()
while probe._helper.process is None or not probe._helper.ready:
    time.sleep(0.01)
print(probe._helper.process.pid, flush=True)
os._exit(0)  # dies without closing anything
"""


def test_a_helper_ends_when_the_process_that_made_it_dies(tmp_path):
    api = import_nixl(NixlSettings()).__name__
    # (from a folder outside the repository: the helper is found as the installed module it is)
    out = subprocess.run([sys.executable, "-c", _ORPHAN, api], capture_output=True, timeout=120, check=True, cwd=tmp_path).stdout
    zygote = int(out.split()[0])
    for _ in range(500):  # its stdin closed with its parent: it exits at once
        try:
            with open(f"/proc/{zygote}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):  # (exited; whoever adopted it reaps it)
                    return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.01)
    os.kill(zygote, 9)
    pytest.fail("the zygote outlived the process that made it")


def test_a_server_is_replaced_after_its_share_of_probes(peer):
    _, agent, blob = peer
    with MetadataProbe(NixlSettings(), mode="server", server_probes=2) as probe:
        for char in "123":
            assert probe.check(renamed(blob, agent, char)) is None
        assert probe.stats["helper_starts"] == 2 and probe.stats["refused"] == 0


@pytest.mark.parametrize("mode", ["server", "spawn"])
def test_other_modes_time_out_and_go_on(peer, mode):
    _, agent, blob = peer
    with MetadataProbe(NixlSettings(), mode=mode, timeout_s=10.0) as probe:
        sample = renamed(blob, agent, "w")
        verdict = probe.check(sample, timeout_s=0.001)
        assert verdict is not None and "timed out" in verdict, verdict
        assert probe.check(sample) is None and probe.stats["timeouts"] == 1


def test_a_helper_that_cannot_load_nixl_refuses_and_says_why(peer):
    _, agent, blob = peer
    with MetadataProbe(NixlSettings()) as probe:
        probe.command("fork")
        probe._command[3] = "no_such_nixl_build._api"  # (what a broken NIXL install would do)
        verdict = probe.check(renamed(blob, agent, "n"))
        assert verdict is not None and verdict.startswith("the metadata probe could not run: NIXL cannot load"), verdict
        assert probe.cached(renamed(blob, agent, "n")) == (False, None)


_RECEIVER = """
import json, os, sys, time
out = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # UCX's log lines must not fill the pipe
import numpy as np
from kvpolicy.transports.agent import NixlSettings, create_agent
settings = NixlSettings()
settings.apply_environment()
agent = create_agent("receiver-" + str(os.getpid()), settings)
pool = np.zeros(1 << 20, dtype=np.uint8)
agent.register_memory([(pool.ctypes.data, pool.nbytes, 0, "")], "DRAM")
blob = agent.get_agent_metadata()
os.write(out, len(blob).to_bytes(8, "little") + blob)
for line in sys.stdin:  # each line: how long to wait for notifications; answered with those that came
    got, end = [], time.monotonic() + float(line)
    while time.monotonic() < end and not got:
        got = [[name, message.hex()] for name, messages in agent.get_new_notifs().items() for message in messages]
        time.sleep(0.002)
    os.write(out, (json.dumps(got) + "\\n").encode())
"""


class Receiver:
    """A bare NIXL agent in its own process that reports the notifications it gets."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        size = int.from_bytes(self.process.stdout.read(8) or b"\0", "little")
        self.metadata = self.process.stdout.read(size)
        assert self.metadata.startswith(b"nixlSerDes|"), "the receiver did not start"

    def notifications(self, wait_s: float = 10.0) -> list[tuple[str, bytes]]:
        import json

        self.process.stdin.write(f"{wait_s}\n".encode())
        self.process.stdin.flush()
        return [(name, bytes.fromhex(message)) for name, message in json.loads(self.process.stdout.readline())]

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def forked_children(probe: MetadataProbe) -> list[int]:
    """The probe children alive (the zygote's children)."""
    return children_of(probe._helper.process.pid)


def until(condition, timeout_s: float = 10.0) -> float:
    """Seconds until ``condition()`` held (fails the test after ``timeout_s``)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, "not in time"
        time.sleep(0.01)
    return time.monotonic() - started


def test_a_proof_is_delivered_from_a_child_that_is_gone_once_released_or_at_its_deadline(peer):
    """Issue 38, item 2: a proving probe's child loads a receiver's metadata, sends one notification
    from an agent named as asked, reports at once and lingers until released (or its deadline): the
    receiver, another process, gets the notification, and once the child is gone the receiver's
    descriptors are back to their baseline (the connection ended with the child). A remembered OK
    verdict does not answer a proof; a remembered crash refuses it at once."""
    _, agent, blob = peer

    def record(verdicts: list, sent: threading.Event, verdict: str | None) -> None:
        verdicts.append(verdict)
        sent.set()

    receiver = Receiver()
    try:
        time.sleep(0.2)
        baseline = receiver.descriptors()
        with MetadataProbe(NixlSettings(), timeout_s=10.0) as probe:
            assert probe.check(receiver.metadata) is None  # (remembered: a proof forks all the same)
            every: list[list] = []
            for n, linger_s in enumerate((30.0, 1.0)):
                sent = threading.Event()
                verdicts: list = []
                every.append(verdicts)
                name, message = f"prover-abcdef012345-{os.getpid()}-{n:016x}", b"kvpolicy-proof:" + os.urandom(16).hex().encode()
                # This proof's list and event, bound now: a late second call lands here, never in the next proof's.
                on_sent = functools.partial(record, verdicts, sent)
                release = probe.prove(receiver.metadata, on_sent, agent=name, message=message, linger_s=linger_s, owner="k")
                assert sent.wait(60) and verdicts == [None]
                assert receiver.notifications() == [(name, message)]
                children = forked_children(probe)
                assert len(children) == 1 and probe.lingering == 1 and receiver.descriptors() > baseline
                if linger_s > 10:
                    release()
                    took = until(lambda: not forked_children(probe) and probe.lingering == 0)
                    assert took < 5, took
                else:  # never released: gone at its deadline
                    took = until(lambda: not forked_children(probe) and probe.lingering == 0, timeout_s=15)
                    assert 0.5 < took < 10, took
                    release()  # (idempotent: nothing left to end)
                until(lambda: receiver.descriptors() == baseline)
            assert every == [[None], [None]]  # on_sent is called exactly once, released or lingered out
            assert probe.stats["proofs"] == 2 and probe.stats["children"] == 3
            assert probe.start(blob, lambda v: None, owner="k") is True  # (the owner's slots are free again)
            crash = crashing_mutants(blob)[0][3]
            assert probe.check(crash) is not None
            refused: list = []
            probe.prove(crash, refused.append, agent="prover-abcdef012345-1-0", message=b"x", linger_s=1.0)
            assert refused and "crashed" in refused[0], refused  # at once, from the remembered crash
        with MetadataProbe(NixlSettings(), mode="server") as other:
            refused = []
            other.prove(receiver.metadata, refused.append, agent="prover-abcdef012345-1-0", message=b"x", linger_s=1.0)
            assert refused and "needs mode='fork'" in refused[0], refused
    finally:
        receiver.close()
