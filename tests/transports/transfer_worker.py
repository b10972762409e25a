"""A prefill or decode rank in its own process, driven over a pipe by the tests.

Each :class:`Worker` is a fresh process that builds a :class:`BlockPool`, opens a
:class:`NixlTransceiver` and executes commands. Every call from the test has a timeout, so a hung
worker fails the test instead of hanging it.

Workers fork from multiprocessing's fork server, which imported torch once: a worker starts in a
fraction of a second, where a spawned interpreter spends ~3 s importing torch (the suite starts
well over a hundred). Nothing else is preloaded: NIXL, and with it UCX, loads in the worker after
the worker set its environment, and the server holds no thread, socket or agent to inherit.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import shutil
import tempfile
import uuid
from typing import Any

CALL_TIMEOUT_S = 60.0

KEYS_DIR = tempfile.mkdtemp(prefix="kvpolicy-test-keys-")
"""Every worker's public key lands here and every worker allows this directory: the tests' cluster."""
atexit.register(shutil.rmtree, KEYS_DIR, True)


_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["torch"])


_KEY_NAMES: dict[str, str] = {}
"""Worker name -> its key's name, for the workers this test process started. A transceiver names a
sender by its key's name on the allow-list, never by the name the sender gives itself; tests name
senders by their worker names, translated here (:meth:`Worker.call`)."""


def new_key(name: str, directory: str = KEYS_DIR) -> tuple[str, str]:
    """A fresh key pair for ``name`` in ``directory``: (key name, path of the secret key file)."""
    from kvpolicy.transports import create_keys

    key_name = f"{name}-{uuid.uuid4().hex[:6]}"
    _, secret = create_keys(directory, key_name)
    _KEY_NAMES[name] = key_name
    return key_name, str(secret)


def fill_pattern(pool: Any, seed: int) -> None:
    """Fill a pool with random bits, different per seed (and so per process)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    raw = pool.tensor.view(torch.int16)
    raw.copy_(torch.randint(-(2**15), 2**15 - 1, raw.shape, dtype=torch.int16, generator=generator))


def _serve(conn: Any, name: str, config: dict[str, Any]) -> None:
    import os
    import time

    if config.get("clock_skew_s"):  # this process's wall clock is off by that much (as a host's may be)
        wall, skew = time.time, float(config.pop("clock_skew_s"))
        time.time = lambda: wall() + skew

    if config.get("netns"):
        # First, before any socket or thread exists: both keep the namespace they were made in.
        from tests.testbed import enter_namespace

        enter_namespace(config["netns"])
    for key, value in config.get("env", {}).items():  # None unsets a variable inherited from the test
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value

    import torch

    from kvpolicy.transports import BlockPool, KVLayout, Limits, NixlSettings, NixlTransceiver, TransferError

    layout = KVLayout(**config["layout"])
    pool = BlockPool(layout, config.get("num_blocks", 64))
    fill_pattern(pool, config.get("seed", 0))
    tx = NixlTransceiver(
        pool,
        name=name,
        timeout_s=config.get("timeout_s", 20.0),
        host=config.get("host", "127.0.0.1"),
        metadata=config.get("metadata", "inline"),
        identity=config["identity"],
        allowed_peers=config["allowed_peers"],
        limits=Limits(**config["limits"]) if config.get("limits") else None,
        allow_reads=config.get("allow_reads", False),
        # The tests' keys are role-less (each worker acts as both sides in some test); a test of
        # roles passes keys with roles, or roleless=False.
        allow_roleless_peers=config.get("roleless", True),
        # Defaults only for what the test's environment leaves alone (e.g. no CMA tuning over TCP).
        settings=NixlSettings(ucx_env=tuple((k, v) for k, v in NixlSettings().ucx_env if k not in config.get("env", {}))),
    )
    if config.get("probe"):  # smaller metadata-probe slots than the default: (max_running, max_waiting, per_owner)
        from kvpolicy.transports.probe import MetadataProbe

        running, waiting, per_owner = config["probe"]
        tx._local.probe.close()
        tx._local.probe = MetadataProbe(tx.settings, max_running=running, max_waiting=waiting, per_owner=per_owner)
    handles: dict[str, Any] = {}
    registry = None
    attackers: list[Any] = []

    def outcome(request_id: str, timeout: float | None) -> dict[str, Any]:
        handle = handles[request_id]
        try:
            metrics = handle.wait(timeout)
            return {"state": handle.state.value, "reason": "", "metrics": metrics.as_dict()}
        except TransferError as exc:
            return {"state": exc.state.value, "reason": exc.reason, "metrics": handle.metrics.as_dict()}
        except TimeoutError as exc:
            return {"state": handle.state.value, "reason": f"wait: {exc}", "metrics": None}

    conn.send(("ready", tx.address))
    while True:
        op, args, kwargs = conn.recv()
        try:
            if op == "connect":
                peer = tx.connect(*args, **kwargs)
                result: Any = peer.name
            elif op == "send":
                handles[args[0]] = tx.send(*args, **kwargs)
                result = None
            elif op == "receive":
                handles[args[0]] = tx.receive(*args, **kwargs)
                result = None
            elif op == "wait":
                result = outcome(args[0], kwargs.get("timeout"))
            elif op == "state":
                result = handles[args[0]].state.value
            elif op == "released":
                result = handles[args[0]].released
            elif op == "disconnect":
                result = tx.disconnect(*args, **kwargs)
            elif op == "open_handles":
                result = len(tx._handles)
            elif op == "metadata":  # what an eavesdropper would like: agent name and NIXL metadata
                result = (tx._agent_name, tx._local.agent.get_agent_metadata())
            elif op == "quarantined":  # sender name -> blocks it keeps quarantined
                result = tx.quarantined()
            elif op == "public_key":  # this side's CURVE public key (Z85)
                result = tx.public_key
            elif op == "peers":  # the senders this side is connected to, by name
                result = sorted(tx.peers)
            elif op == "raw":  # (peer name, frames): send frames as they are on this side's connection

                def push(peer: str, frames: list[bytes]) -> None:
                    conn = tx._connections.connection_of(peer)
                    for frame in frames:
                        conn.socket.send(frame)

                result = tx._loop.submit(functools.partial(push, *args)).result(10)
            elif op == "flood":  # (peer name, seconds, asks per frame, asks per second): asks for ids never
                # offered, on this side's connection, paced, from a thread of their own (returns at once)
                import itertools
                import threading

                from kvpolicy.transports import control as wire

                # Its arguments bound at the start, not this loop's names: the flood outlives the op, and its
                # push looked `peer` up on every tick, so a later raw sent it to another sender and a later
                # connect (a Peer, not a name) stopped it in silence, its errors swallowed below.
                def flood(peer: str, seconds: float, per_frame: int, rate: float) -> None:
                    # Every ask is a new one (its own id and nonce): the sender takes each through its whole
                    # path (parked, then refused past its per-key budget), not its cheap answer to a repeat.
                    frames_per_tick = max(1, int(rate / per_frame / 100))
                    end = time.monotonic() + seconds
                    counter, tag = itertools.count(1), os.urandom(4).hex()  # (ids new across floods too)

                    def frame() -> bytes:
                        asks = [wire.encode(wire.Request(f"guess-{tag}-{n}", n, (0,), 0, 30_000)) for n in itertools.islice(counter, per_frame)]
                        return wire.batch(asks)

                    def push() -> None:
                        frames = [frame() for _ in range(frames_per_tick)]
                        conn = tx._connections.connection_of(peer)
                        with conn.lock:
                            for encoded in frames:
                                conn.socket.send(encoded, 1)  # zmq.NOBLOCK: a full queue drops it

                    while time.monotonic() < end:
                        tick = time.monotonic()
                        try:
                            tx._loop.submit(push).result(5)
                        except Exception:
                            pass
                        time.sleep(max(0.0, 0.01 - (time.monotonic() - tick)))

                threading.Thread(target=flood, args=tuple(args), daemon=True).start()
                result = None
            elif op == "resources":  # what one peer could exhaust on this side
                import threading

                sender = tx._sender
                result = {
                    "threads": threading.active_count(),
                    "fds": len(os.listdir("/proc/self/fd")),
                    "parked": sum(len(a) for a in sender.parked.values()),
                    "remotes": len(tx._remotes.remotes),
                    "ended": len(sender.ended) + len(tx._receiver.ended),
                    "handles": len(tx._handles),
                }
            elif op == "cancel":
                result = tx.cancel(*args, **kwargs)
            elif op == "blocks":
                result = torch.stack([pool.block(b).clone() for b in args[0]]) if args[0] else None
            elif op == "digests":
                result = pool.digests(args[0])
            elif op == "fill":
                fill_pattern(pool, args[0])
                result = None
            elif op == "probe_stats":  # the metadata probe's counters (children, crashed, busy, ...)
                result = dict(tx._local.probe.stats)
            elif op == "stats":
                reads = tx._receiver.reads
                result = {**tx.stats, "registrations": tx.registrations, "reads": reads.done, "read_sources": len(reads.sources)}
            elif op == "announced":  # request ids announced to this side and not taken yet
                result = sorted(tx._receiver.reads.offers)
            elif op == "announcers":  # how many senders announced request id args[0] (not taken yet)
                result = len(tx._receiver.reads.offers.get(args[0], {}))
            elif op == "announce_raw":  # (frames): send frames as they are to every receiver that said hello

                def announce(frames: list[bytes]) -> None:
                    for identity in list(tx._remotes.remotes):
                        for frame in frames:
                            tx._remotes.router.send_multipart([identity, frame])

                result = tx._loop.submit(functools.partial(announce, args[0])).result(10)
            elif op == "register":  # publish this rank in etcd: (endpoints, namespace, ttl_s[, rank name])
                from kvpolicy.transports.discovery import EtcdRegistry

                endpoints, namespace, ttl_s, *rank = args
                registry = registry or EtcdRegistry(endpoints, namespace=namespace)
                registry.register(rank[0] if rank else name, tx.rank_record(), ttl_s=ttl_s)
                result = None
            elif op == "unregister":  # (rank name)
                registry.unregister(args[0])
                result = None
            elif op == "lookup":  # (endpoints, namespace, rank name, timeout_s) -> record or error text
                from kvpolicy.transports.discovery import EtcdRegistry, RegistryError

                endpoints, namespace, rank, timeout_s = args
                try:
                    result = EtcdRegistry(endpoints, namespace=namespace).lookup(rank, timeout_s=timeout_s)
                except (LookupError, RegistryError) as exc:
                    result = f"{type(exc).__name__}: {exc}"
            elif op == "connect_by_name":  # (endpoints, namespace, rank name): look up (bound to this
                # side's allow-list), then connect expecting that name
                from kvpolicy.transports.discovery import EtcdRegistry

                endpoints, namespace, rank = args
                result = tx.connect_by_name(EtcdRegistry(endpoints, namespace=namespace), rank, **kwargs).name
            elif op == "lookup_bound":  # (endpoints, namespace, rank name, timeout_s): the allow-list-bound lookup
                from kvpolicy.transports.discovery import EtcdRegistry, RegistryError

                endpoints, namespace, rank, timeout_s = args
                bound = EtcdRegistry(endpoints, namespace=namespace, allowed=config["allowed_peers"])
                try:
                    result = bound.lookup(rank, timeout_s=timeout_s, trusted_keys=kwargs.get("trusted_keys")).address
                except (LookupError, RegistryError) as exc:
                    result = f"{type(exc).__name__}: {exc}"
            elif op == "notify_flood":  # (metadata, count, bytes): another agent of this process loads a
                # peer's NIXL metadata (as a sender holds its receivers') and sends it notifications
                from kvpolicy.transports.agent import create_agent

                metadata, count, size = args
                attacker = create_agent(f"mallory-{os.getpid()}-{len(attackers)}", NixlSettings())
                attackers.append(attacker)  # kept: destroying it would cancel what is still queued
                target = attacker.add_remote_agent(metadata)
                message = bytes(size)
                for _ in range(count):
                    attacker.send_notif(target, message)
                result = count
            elif op == "delay_results":  # fault injection: hold every result frame this many seconds
                _delay_results(tx, args[0])
                result = None
            elif op == "close":
                if registry is not None:
                    registry.close()
                tx.close()
                result = tx.registrations
            elif op == "exit":
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown op {op}")
            conn.send(("ok", result))
        except Exception as exc:  # report to the test, keep serving
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _delay_results(tx: Any, seconds: float) -> None:
    """Make ``tx`` (a sender) hold each result frame for ``seconds`` before sending it, as a slow or
    congested link would; 0 restores prompt results. The frame is still sent from the service
    thread (ZMQ sockets are not thread-safe): a timer hands it back through the command queue."""
    import threading

    remotes = tx._remotes
    original = getattr(remotes, "_undelayed_reply", None) or remotes.reply
    remotes._undelayed_reply = original
    if seconds <= 0:
        remotes.reply = original
        return

    def delayed(remote: Any, result: Any) -> None:
        def later() -> None:
            try:
                tx._loop.submit(lambda: original(remote, result))
            except RuntimeError:  # closed meanwhile
                pass

        timer = threading.Timer(seconds, later)
        timer.daemon = True
        timer.start()

    remotes.reply = delayed


class WorkerError(RuntimeError):
    """A command raised inside the worker."""


class Worker:
    """Handle on one worker process."""

    def __init__(self, name: str, **config: Any) -> None:
        ctx = _CONTEXT
        self.name = name
        if "identity" not in config:
            self.key_name, config["identity"] = new_key(name)
        else:
            self.key_name = _KEY_NAMES[name] = config.pop("key_name", name)
        config.setdefault("allowed_peers", KEYS_DIR)
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, name, config), name=f"kv-{name}", daemon=True)
        self.process.start()
        child.close()
        status, self.address = self._recv(CALL_TIMEOUT_S)
        assert status == "ready"

    def _recv(self, timeout: float) -> Any:
        if not self._conn.poll(timeout):
            raise TimeoutError(f"worker {self.name} did not answer within {timeout}s")
        return self._conn.recv()

    def call(self, op: str, *args: Any, timeout: float = CALL_TIMEOUT_S, **kwargs: Any) -> Any:
        """Run one command in the worker and return its result (senders named by worker names are
        named by their keys' names, as the transceiver knows them)."""
        if op == "receive" and kwargs.get("peers"):
            kwargs["peers"] = [_KEY_NAMES.get(p, p) for p in kwargs["peers"]]
        elif op in ("disconnect", "raw") and args:
            args = (_KEY_NAMES.get(args[0], args[0]), *args[1:])
        self._conn.send((op, args, kwargs))
        status, result = self._recv(timeout)
        if status != "ok":
            raise WorkerError(result)
        return result

    def kill(self) -> None:
        """SIGKILL the worker: no clean-up, as if the machine lost it."""
        self.process.kill()
        self.process.join(10)

    def stop(self) -> None:
        """Close the worker's transceiver and end the process; kill it if it does not comply."""
        if self.process.is_alive():
            try:
                self.call("close", timeout=20)
                self.call("exit", timeout=10)
            except Exception:
                pass
            self.process.join(20)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        self._conn.close()
        # A worker that segfaulted at exit (the UCX_MODULES problem) shows up here.
        assert self.process.exitcode in (0, -9), f"worker {self.name} exited with {self.process.exitcode}"
