"""Control-plane clients for the attack tests: real ZMQ sockets on loopback, with or without a key
the sender allows. Each stands for another process on the cluster network."""

from __future__ import annotations

import zmq
import zmq.auth

from kvpolicy.transports import control
from kvpolicy.transports.addresses import fingerprint, split_address

from .transfer_worker import KEYS_DIR, new_key


def dealer(address: str, secret_file: str | None = None) -> zmq.Socket:
    """A CURVE client to the sender at ``address``; its key is ``secret_file`` or a fresh one that
    no allow-list knows (a stranger)."""
    endpoint, server_key = split_address(address)
    if secret_file is None:
        public, secret = zmq.curve_keypair()
    else:
        public, secret = zmq.auth.load_certificate(secret_file)
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDTIMEO, 5000)  # a send never blocks a test for ever
    socket.curve_secretkey, socket.curve_publickey, socket.curve_serverkey = secret, public, server_key
    socket.connect(endpoint)
    return socket


def allowed_dealer(address: str, name: str = "insider") -> tuple[zmq.Socket, str]:
    """A client whose key is on every test worker's allow-list (a peer that is part of the cluster),
    and a NIXL agent name bound to that key (what its hellos may claim)."""
    _, secret_file = new_key(name, KEYS_DIR)
    public, _ = zmq.auth.load_certificate(secret_file)
    return dealer(address, secret_file), f"{name}-{fingerprint(public)}-1-abcd"


def plain_dealer(address: str) -> zmq.Socket:
    """A client with no CURVE at all (ZMQ's NULL mechanism), as the old control plane spoke."""
    endpoint, _ = split_address(address)
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDTIMEO, 5000)
    socket.connect(endpoint)
    return socket


def try_send(socket: zmq.Socket, frame: bytes) -> bool:
    """Send without blocking: a socket whose handshake was refused has no peer to queue for, and a
    plain send would then wait forever. False if the frame could not even be queued."""
    try:
        socket.send(frame, zmq.NOBLOCK)
    except zmq.Again:
        return False
    return True


def recv(socket: zmq.Socket, timeout_ms: int) -> control.Message | None:
    """The next message, or None if nothing comes within ``timeout_ms``."""
    if not socket.poll(timeout_ms):
        return None
    return control.decode(socket.recv())


class RogueSender:
    """A CURVE server whose key is on every test worker's allow-list (an insider), answering each
    hello with the welcome the test wrote: what a compromised sender could tell a receiver."""

    def __init__(self, name: str = "rogue") -> None:
        from kvpolicy.transports.addresses import address_with_key

        self.key_name, secret_file = new_key(name, KEYS_DIR)
        """What receivers call this sender: its key's name, whatever its welcome claims."""
        self.public, secret = zmq.auth.load_certificate(secret_file)
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.curve_secretkey, self.socket.curve_publickey, self.socket.curve_server = secret, self.public, True
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.address = address_with_key(f"tcp://127.0.0.1:{port}", self.public)
        self.agent = f"{name}-{fingerprint(self.public)}-1-abcd"
        """An agent name bound to this key (what an honest welcome of it would carry)."""

    def welcome_next_hello(self, rank: control.RankInfo, timeout_ms: int = 10_000) -> bool:
        """Answer the next hello with ``rank``; False if none came."""
        if not self.socket.poll(timeout_ms):
            return False
        identity, _hello = self.socket.recv_multipart()
        self.socket.send_multipart([identity, control.encode(control.Welcome(rank))])
        return True

    def close(self) -> None:
        self.socket.close(0)


_HOLDER = """
import os, sys
out = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # UCX's log lines must not fill the pipe
import numpy as np
from kvpolicy.transports.agent import NixlSettings, create_agent
agent = create_agent(sys.argv[1], NixlSettings())
pool = np.zeros(int(sys.argv[2]), dtype=np.uint8)
agent.register_memory([(pool.ctypes.data, pool.nbytes, 0, "")], "DRAM")
blob = agent.get_agent_metadata()
os.write(out, len(blob).to_bytes(8, "little") + blob)
os.close(out)
while sys.stdin.read(1):
    pass
"""


class LiveAgent:
    """A bare NIXL agent in its own process, holding one DRAM region of ``nbytes``, alive until
    :meth:`close`: the agent a fuzzed copy of metadata describes, so that loading a copy connects
    to a live agent as a real load would. Its exit status is not judged: UCX may abort a process
    whose peers connect with mutated copies of its address and vanish (docs/trust-model.md)."""

    def __init__(self, name: str, nbytes: int) -> None:
        import subprocess
        import sys

        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, name, str(nbytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert self.process.stdout is not None
        size = int.from_bytes(self.process.stdout.read(8) or b"\0", "little")
        self.metadata = self.process.stdout.read(size)
        assert self.metadata.startswith(b"nixlSerDes|"), "the agent process did not start"

    def close(self) -> None:
        import subprocess

        if self.process.stdin:
            self.process.stdin.close()  # it exits when its stdin closes
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
