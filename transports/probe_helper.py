"""The parent's side of the metadata probe's persistent helper process (fork and server modes).

A :class:`HelperClient` runs one I/O thread: it starts the helper (the command its owner gives:
``python -m`` :data:`.probe.CHILD_PROGRAM`), writes queued requests to its stdin, reads its replies,
enforces the helper's start-up deadline and every probe's, kills the helper's process group when it
stops answering, and answers what was in flight when it dies. It answers through its owner, the
:class:`.probe.MetadataProbe` that made it (held weakly; :class:`ProbeOwner` is what it uses of it),
which keeps the slots, the remembered verdicts and the stats. :func:`kill_group` ends a helper or a
spawned child with everything it forked.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import threading
import time
import weakref
from collections import deque
from typing import Protocol

from .probe_outcome import Probe, ProbeOutcome, encode_request, signal_name
from .probe_wire import CANNOT_RUN, CLOSED, ENDED, OK, RELEASE, REPLY, REQUEST, TIMED_OUT

log = logging.getLogger("kvpolicy.transports")

__all__ = ["GRACE_S", "HelperClient", "ProbeOwner", "kill_group"]

GRACE_S = 3.0
"""How long past a probe's timeout its helper may stay silent before it is killed (it kills the child
at the timeout itself; this only catches a helper that stopped answering)."""


class ProbeOwner(Protocol):
    """What a :class:`HelperClient` reads of its owner and calls back into: a
    :class:`.probe.MetadataProbe` (named by its shape here: that module imports this one)."""

    start_timeout_s: float
    server_probes: int
    quiet: bool
    stats: dict[str, int]
    _lock: threading.Lock

    def command(self, role: str) -> list[str]: ...

    def _environment(self) -> dict[str, str]: ...

    def _finish(self, probe: Probe, outcome: ProbeOutcome, remember: bool = True) -> None: ...

    def _child_ended(self, probe_id: int) -> None: ...

    def _helper_gone(self) -> None: ...


def kill_group(process: subprocess.Popen) -> None:
    """Kill a helper or child and everything it forked (each runs in its own session), and reap it."""
    if process.returncode is None:  # (not reaped: its id cannot have been reused for another group)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        process.kill()
    except OSError:
        pass
    try:
        process.wait(5.0)
    except subprocess.TimeoutExpired:
        log.warning("metadata probe: process %d did not die", process.pid)
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


class HelperClient:
    """The parent's side of one persistent helper (fork or server mode): one I/O thread writes
    requests, reads replies, restarts the helper when it dies and enforces every deadline."""

    def __init__(self, owner: ProbeOwner, mode: str) -> None:
        self._owner = weakref.ref(owner)
        self.mode = mode
        self.timeout_s = owner.start_timeout_s
        self.lock = threading.Lock()
        self.queue: deque[Probe] = deque()
        self.releases: list[int] = []
        """Proofs whose child is to be ended (their ids), not yet written to the helper."""
        self.sent: dict[int, Probe] = {}
        self.process: subprocess.Popen | None = None
        self.started = 0.0
        self.ready = False
        self.served = 0
        """(Server mode) probes sent to the current server: it exits after ``server_probes``."""
        self.want_start = False
        self.closed = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.thread = threading.Thread(target=self._run, name=f"kvpolicy-probe-{mode}", daemon=True)
        self.thread.start()

    # -- any thread --

    def submit(self, probe: Probe) -> None:
        """Queue ``probe`` for the helper process (started on the client thread if it is not up)."""
        with self.lock:
            if self.closed:
                raise RuntimeError("the metadata probe is closed")
            self.queue.append(probe)
        self._wake()

    def warm(self) -> None:
        """Start the helper process now, before the first probe needs it."""
        with self.lock:
            self.want_start = True
        self._wake()

    def release(self, probe_id: int) -> None:
        """End the child of proof ``probe_id`` (the zygote ignores an id it does not know)."""
        with self.lock:
            if self.closed:
                return
            self.releases.append(probe_id)
        self._wake()

    def close(self) -> None:
        """Stop the client thread: it kills the helper and its children, and probes still in flight
        end as closed. Waits for it (10 s at most) unless called from it."""
        with self.lock:
            self.closed = True
        self._wake()
        if threading.current_thread() is not self.thread:
            self.thread.join(10.0)

    def _wake(self) -> None:
        with self.lock:  # (never write to the fd number after the thread closed it: it may be reused)
            if self.wake_w < 0:
                return
            try:
                os.write(self.wake_w, b"x")
            except (BlockingIOError, OSError):
                pass  # (full: it is awake anyway)

    # -- the I/O thread --

    def _run(self) -> None:
        selector = self.selector
        out = bytearray()  # requests not yet written to the helper's stdin
        replies = bytearray()
        try:
            while True:
                with self.lock:
                    closed = self.closed
                    if not closed and self.process is None and (self.queue or self.want_start):
                        self.want_start = False
                        fresh = True
                    else:
                        fresh = False
                if closed or self._owner() is None:
                    break
                if fresh:
                    if not self._start():
                        continue
                    out.clear()
                    replies.clear()
                self._send_queued(out)
                process = self.process
                if process is not None:
                    assert process.stdin is not None  # (started with pipes)
                    stdin_fd = process.stdin.fileno()
                    events = selectors.EVENT_WRITE if out else 0
                    self._modify(selector, stdin_fd, events)
                timeout = self._next_deadline()
                for key, _mask in selector.select(timeout):
                    if key.data == "wake":
                        try:
                            os.read(self.wake_r, 4096)
                        except BlockingIOError:
                            pass
                    elif key.data == "stdin" and self.process is not None:
                        try:
                            written = os.write(key.fd, out[:65536])
                            del out[:written]
                        except BlockingIOError:
                            pass
                        except OSError:  # (it died: its stdout says so)
                            out.clear()
                    elif key.data == "stdout" and self.process is not None:
                        try:
                            chunk = os.read(key.fd, 65536)
                        except BlockingIOError:
                            continue
                        if not chunk:
                            self._died()
                            break
                        replies += chunk
                        self._replies(replies)
                self._check_deadlines()
        except Exception:
            log.exception("metadata probe: the helper thread failed")
        finally:
            with self.lock:
                self.closed = True  # (submit refuses from now on; the owner makes a new helper)
            self._kill()
            self._fail_all(ProbeOutcome(CLOSED))
            selector.close()
            with self.lock:
                fds, self.wake_r, self.wake_w = (self.wake_r, self.wake_w), -1, -1
            for fd in fds:
                os.close(fd)

    def _modify(self, selector: selectors.BaseSelector, fd: int, events: int) -> None:
        try:
            key = selector.get_key(fd)
        except KeyError:
            key = None
        if events and key is None:
            selector.register(fd, events, "stdin")
        elif not events and key is not None:
            selector.unregister(fd)

    def _start(self) -> bool:
        owner = self._owner()
        if owner is None:
            return False
        try:
            process = subprocess.Popen(
                owner.command(self.mode),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL if owner.quiet else None,
                env=owner._environment(),
                start_new_session=True,
                bufsize=0,
            )
        except Exception as exc:
            self._fail_all(ProbeOutcome(CANNOT_RUN, f"cannot start the probe helper: {exc}"))
            return False
        with owner._lock:
            owner.stats["helper_starts"] += 1
        assert process.stdin is not None and process.stdout is not None  # (both pipes, above)
        os.set_blocking(process.stdin.fileno(), False)
        os.set_blocking(process.stdout.fileno(), False)
        self.selector.register(process.stdout.fileno(), selectors.EVENT_READ, "stdout")
        self.process, self.started, self.ready, self.served = process, time.monotonic(), False, 0
        return True

    def _send_queued(self, out: bytearray) -> None:
        """Move queued probes to the helper: all of them (fork), or the next once it is idle (server)."""
        owner = self._owner()
        if self.process is None or owner is None:
            return
        with self.lock:
            for probe_id in self.releases:
                out += REQUEST.pack(RELEASE, probe_id, 0.0, 0.0, 0, 0, 0)
            self.releases.clear()
            while self.queue and (self.mode == "fork" or (self.ready and not self.sent and self.served < owner.server_probes)):
                self.served += 1
                probe = self.queue.popleft()
                probe.sent = time.monotonic()
                self.sent[probe.id] = probe
                out += encode_request(probe)

    def _replies(self, buffer: bytearray) -> None:
        owner = self._owner()
        while len(buffer) >= REPLY.size:
            probe_id, code, size = REPLY.unpack_from(buffer)
            if len(buffer) < REPLY.size + size:
                return
            message = bytes(buffer[REPLY.size : REPLY.size + size]).decode(errors="replace")
            del buffer[: REPLY.size + size]
            if probe_id == 0:
                if code == OK:
                    self.ready = True
                    now = time.monotonic()
                    for waiting in self.sent.values():  # (fork: their clocks start now)
                        waiting.sent = now
                else:  # NIXL cannot load in the helper: every waiting probe fails
                    self._kill()
                    self._fail_all(ProbeOutcome(CANNOT_RUN, message))
                continue
            if code == ENDED:  # (a proof's lingering child is gone)
                if owner is not None:
                    owner._child_ended(probe_id)
                continue
            probe = self.sent.pop(probe_id, None)
            if probe is not None and owner is not None:
                if self.mode == "server":
                    probe.sent = None
                owner._finish(probe, ProbeOutcome(code, message, probe.timeout_s))

    def _died(self) -> None:
        """The helper's stdout closed: it exited or was killed."""
        process, ready = self.process, self.ready
        code = self._kill()
        owner = self._owner()
        in_flight, self.sent = list(self.sent.values()), {}
        if owner is None:
            return
        if self.mode == "server" and in_flight and ready:
            # It loads one blob at a time: the one in flight is the one that killed it.
            probe = in_flight[0]
            owner._finish(probe, ProbeOutcome(code if code < 0 else (code or CANNOT_RUN), "", probe.timeout_s))
            return
        if self.mode == "server" and not in_flight and code == 0:
            return  # (replaced after server_probes probes; the next probe starts another)
        why = f"the probe helper {process.pid if process else '?'} exited ({_status(code)})" + ("" if ready else " while starting")
        for probe in in_flight:
            owner._finish(probe, ProbeOutcome(CANNOT_RUN, why, probe.timeout_s), remember=False)

    def _next_deadline(self) -> float | None:
        """Seconds until the next deadline this thread enforces (None: none)."""
        if self.process is None:
            return None
        if not self.ready:
            when = self.started + self.timeout_s
        else:
            sent = [p.sent + p.timeout_s + GRACE_S for p in self.sent.values() if p.sent is not None]
            if not sent:
                return None
            when = min(sent)
        return max(0.0, when - time.monotonic())

    def _check_deadlines(self) -> None:
        if self.process is None:
            return
        now = time.monotonic()
        owner = self._owner()
        if not self.ready:
            if now >= self.started + self.timeout_s:
                self._kill()
                self._fail_all(ProbeOutcome(CANNOT_RUN, f"the probe helper did not start within {self.timeout_s:g} s"))
            return
        late = [p for p in self.sent.values() if p.sent is not None and now >= p.sent + p.timeout_s + GRACE_S]
        if not late or owner is None:
            return
        # The helper did not answer in time (fork: it kills its children at their deadline itself, so
        # it is wedged; server: the load hangs, and the server's alarm did not end it). Kill it all.
        self._kill()
        in_flight, self.sent = list(self.sent.values()), {}
        for probe in in_flight:
            if probe in late:
                owner._finish(probe, ProbeOutcome(TIMED_OUT, "", probe.timeout_s))
            else:
                owner._finish(probe, ProbeOutcome(CANNOT_RUN, "the probe helper was killed", probe.timeout_s), remember=False)

    def _kill(self) -> int:
        """Kill the helper and its children; its exit status (minus a signal)."""
        process, self.process, self.ready = self.process, None, False
        if process is None:
            return 0
        with self.lock:
            self.releases.clear()  # (its children die with it)
        owner = self._owner()
        if owner is not None:
            owner._helper_gone()
        for stream in (process.stdout, process.stdin):
            assert stream is not None  # (started with pipes)
            try:
                self.selector.unregister(stream.fileno())
            except (KeyError, ValueError, OSError):
                pass
        kill_group(process)
        return process.returncode if process.returncode is not None else -signal.SIGKILL

    def _fail_all(self, outcome: ProbeOutcome) -> None:
        owner = self._owner()
        with self.lock:
            probes = list(self.sent.values()) + list(self.queue)
            self.sent, self.queue = {}, deque()
        if owner is not None:
            for probe in probes:
                owner._finish(probe, ProbeOutcome(outcome.code, outcome.message, probe.timeout_s), remember=False)


def _status(code: int) -> str:
    return f"signal {-code}, {signal_name(-code)}" if code < 0 else f"status {code}"
