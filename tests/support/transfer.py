"""Helpers of the transfer layer's tests (tests/transports): layouts, waiting for counters, a fake
sender on the control plane, a hello's rank, stopping a process, and the pairs of ranks several
modules start. :mod:`tests.transports.transfer_worker` is imported when a helper needs it."""

from __future__ import annotations

import os
import signal
import threading
import time

from kvpolicy.transports import KVLayout, control

#: The small layout most transfer tests use.
LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)
#: The two-hosts tests' layout (64 KiB blocks), pool size and every request's timeout (seconds).
HOSTS_LAYOUT = KVLayout(num_layers=4, kv_heads=4, tokens_per_block=16, head_dim=64)
HOSTS_BLOCKS = 64
HOSTS_TIMEOUT = 5.0


def eventually(check, timeout_s: float = 30.0, seen=None) -> None:
    """Frames on different connections have no common order: wait for the counters to catch up
    (30 s: on a loaded 2-core machine a worker may not run for seconds). ``seen``: what to show
    when the condition is never reached (e.g. the counters)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"condition not reached; saw {seen() if seen else '?'}"
        time.sleep(0.02)


class FakeSender:
    """A control-plane-only 'sender' with an allowed key: says welcome, then does whatever the test
    tells it to (it stands for a buggy or compromised peer, which CURVE alone cannot stop)."""

    def __init__(self) -> None:
        import zmq.auth
        from tests.transports.transfer_worker import new_key

        from kvpolicy.transports.addresses import address_with_key

        self.key_name, secret_file = new_key("fake")
        public, secret = zmq.auth.load_certificate(secret_file)
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.curve_secretkey, self.socket.curve_publickey, self.socket.curve_server = secret, public, True
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.address = address_with_key(f"tcp://127.0.0.1:{port}", public)
        self.identity: bytes | None = None

    def recv(self, timeout_ms: int = 20000) -> control.Message:
        assert self.socket.poll(timeout_ms), "fake sender got nothing"
        identity, frame = self.socket.recv_multipart()
        self.identity = identity
        return control.decode(frame)

    def accept(self, receiver) -> None:
        """Let ``receiver`` (a worker) connect: its connect() blocks until our welcome."""

        def welcome() -> None:
            hello = self.recv()
            assert isinstance(hello, control.Hello)
            rank = control.RankInfo("fake", "fake-agent", b"", LAYOUT, 1 << 20, 64, "DRAM", 0)
            self.send(control.encode(control.Welcome(rank)))

        answering = threading.Thread(target=welcome, daemon=True)
        answering.start()
        assert receiver.call("connect", self.address) == self.key_name  # named by its key, not its welcome
        answering.join(10)

    def send(self, frame: bytes) -> None:
        assert self.identity is not None
        self.socket.send_multipart([self.identity, frame])

    def close(self) -> None:
        self.socket.close(0)


def fake_rank(agent: str, metadata: bytes = b"", num_blocks: int | None = None) -> control.RankInfo:
    """A hello's rank for ``agent``. With metadata that registers one region, the rank announces that
    region as its pool (as a peer copying another's metadata would copy its rank too: the sender
    refuses metadata whose region is not the announced pool before anything else)."""
    from kvpolicy.transports.metadata import MetadataError, read_metadata

    base, blocks = 1 << 30, 64
    try:
        regions = [r for s in read_metadata(metadata).sections for r in s.regions] if metadata else []
    except MetadataError:
        regions = []
    if len(regions) == 1:
        base, blocks = regions[0].address, max(1, regions[0].length // LAYOUT.block_bytes)
    return control.RankInfo("attacker", agent, metadata, LAYOUT, base, blocks if num_blocks is None else num_blocks, "DRAM", 0)


def children_of(pid: int) -> list[int]:
    """The live (not zombie) child processes of ``pid``, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def stop(pid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOP ``pid`` and wait until every one of its threads is stopped.

    ``kill`` only queues the signal: a thread busy on the other core can still read a frame for a
    few milliseconds (seen: an ask read and written 2 ms after ``kill`` returned).
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as stat:
                    states.append(stat.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that just ended
                continue
        if states and all(state in "tT" for state in states):
            return
        assert time.monotonic() < deadline, f"process {pid} not stopped after {timeout_s}s: thread states {states}"
        time.sleep(0.005)


def slow_other_decode(workers):
    """A decoder connected to two senders; "slow" offers request A to it (and may then be stopped)."""
    slow = workers("slow", layout=LAYOUT.to_wire(), seed=1)
    other = workers("other", layout=LAYOUT.to_wire(), seed=2)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=3)
    decode.call("connect", slow.address)
    decode.call("connect", other.address)
    slow.call("send", "A", [1, 2], to=decode.key_name, timeout_s=30)
    return slow, other, decode


def start_pair(two_hosts, workers, namespace, layout=HOSTS_LAYOUT, num_blocks=HOSTS_BLOCKS, **config):
    """A prefill rank registered in etcd under ``namespace`` and a decode rank connected to it by name."""
    endpoint = two_hosts.etcd.endpoint
    common = dict(layout=layout.to_wire(), num_blocks=num_blocks, timeout_s=HOSTS_TIMEOUT, **config)
    prefill = workers("prefill", seed=1, **common, **two_hosts.config("prefill"))
    prefill.call("register", endpoint, namespace, 3, prefill.key_name)  # a sender's rank name is its key's name
    decode = workers("decode", seed=2, **common, **two_hosts.config("decode"))
    assert decode.call("connect_by_name", endpoint, namespace, prefill.key_name) == prefill.key_name
    return prefill, decode
