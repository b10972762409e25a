"""Load an unknown peer's NIXL metadata in a throwaway child process before this process loads it.

NIXL's metadata parser (``add_remote_agent``, ``loadRemoteMD`` underneath, with UCX unpacking the
worker address and remote keys) does not validate what it reads: one-byte mutations of a real
hello's metadata kill the loading process with SIGSEGV or SIGABRT (issue 26, item 7; reproduced in
``tests/transports/test_probe.py``). A peer on the allow-list is trusted with its key, not with the
bytes it sends, so a transceiver first has a child load the blob and refuses the peer when the
child dies, fails or hangs (:class:`MetadataProbe`).

How a child is made (``mode``), measured in ``bench/probe.py``:

``"fork"`` (default): one persistent helper process (a *zygote*) imports NIXL and loads its UCX
    plugin once, holds no agent and no thread, and forks one single-use child per probe; the child
    creates a fresh agent, loads the blob, removes it, and exits. Every probe runs in a pristine copy
    of the zygote: a blob that corrupts memory without crashing cannot affect a later verdict, and a
    crash never touches the zygote.
``"server"``: one persistent helper that loads each blob itself, in a fresh agent, one at a time;
    replaced when it dies (its in-flight blob is the one that killed it) and every
    ``server_probes`` probes (state a blob left behind does not live long).
``"spawn"``: a fresh interpreter per probe (no persistent process at all; the slowest).

A probe that *proves* (:meth:`MetadataProbe.prove`, fork mode only) is how a sender sends its proof
nonce without connecting its own agent to an unproved peer: the child creates its agent under a name
the caller gives (one that carries the caller's key), loads the blob, sends one NIXL notification to
the agent it describes, reports that at once and then lingers (a process that exits right after
``send_notif`` loses the notification: 0 of 5 delivered; 5 of 5 after 20 ms) until the caller
releases it or its deadline passes. Its exit ends the connection it opened; nothing is left in the
caller's agent, or on the peer's side, once it is gone.

This module is the parent's side: slots, limits, the remembered verdicts, and the spawn mode's
children. :mod:`.probe_helper` starts and watches the persistent helper (fork and server modes),
:mod:`.probe_outcome` holds one probe and what became of it, :mod:`.probe_wire` is the protocol
between the parent and the processes it starts, and :mod:`.probe_child` is what runs in them.
Each child creates its agent with :func:`.agent.create_agent` and the transceiver's
:class:`.agent.NixlSettings` (backends, progress thread, UCX environment: the same parser, the same
transports), and imports the NIXL build the parent process imported (without the ~1.7 s ``torch``
import that ``import nixl`` costs on a CPU-only torch). Loading also opens a UCX endpoint to the
address in the metadata (as the real load does): the peer sees a short-lived connection per probe
(and may log "Connection refused" once it closes).

Bounds: a verdict per SHA-256 of the blob is remembered (``cache_size``, LRU), except verdicts that
may be transient (timeouts, NIXL errors, probe failures); at most ``max_running`` distinct blobs are
probed at once and ``max_waiting`` more wait for a slot (a duplicate of one in flight or waiting
joins it); more are answered ``"busy: ..."`` at once; every child has a hard timeout (its own
``SIGALRM``, then ``SIGKILL`` from its parent); helpers die with their process group when they stop
answering, and exit when this process goes away (their stdin closes).

A child that survives proves only that *a fresh process* survives the blob. Most crashes found are
deterministic and refused every time, but some depend on the heap's layout (a byte of the packed
remote key: 7 of 8 forked children died, 0 of 8 spawned ones, 4 of 4 plain processes), and a blob
that corrupts memory without crashing the child may still crash this process later. The probe turns
crashes into refusals; it does not make the parser safe: a caller should also refuse, for a while,
a key whose metadata crashed a probe (an honest peer never sends such a blob).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable

from .agent import NixlSettings, import_nixl
from .probe_helper import GRACE_S as _GRACE_S, HelperClient as _HelperClient, kill_group as _kill_group
from .probe_outcome import Probe as _Probe, ProbeOutcome, Proof, encode_request as _request
from .probe_outcome import signal_name as _signal_name  # noqa: F401  # importable from here, as before the split
from .probe_wire import CANNOT_RUN, CLOSED, MESSAGE_LIMIT, RELEASED, TIMED_OUT
from .probe_wire import ENDED, OK, PROBE, PROVE, REJECTED, RELEASE, REPLY, REQUEST, SENT  # noqa: F401  # importable from here, as before the split

log = logging.getLogger("kvpolicy.transports")

__all__ = ["MetadataProbe", "ProbeOutcome", "MODES"]

MODES = ("fork", "server", "spawn")
MAX_BLOB = 16 << 20
"""Largest blob probed (the control plane's own limit is lower: ``control.MAX_METADATA``)."""

CHILD_PROGRAM = "kvpolicy.transports.probe_child"
"""The module the helpers and children run (``python -m``); this module never imports it."""


class MetadataProbe:
    """Loads NIXL metadata in a child process first; see the module docstring.

    Args:
        settings: the transceiver's :class:`NixlSettings` (the child's agent is made with them).
        mode: ``"fork"`` (default), ``"server"`` or ``"spawn"``.
        max_running: distinct blobs probed at once (children alive at once).
        max_waiting: distinct blobs that wait for a slot; beyond these, ``"busy: ..."`` at once.
        per_owner: probes (running and waiting) one owner (``start(owner=...)``: a peer's key) may
            have at once; beyond these its next blob is ``"busy: ..."`` at once, so one key's burst of
            distinct blobs cannot fill every slot ahead of other peers' first connects. Default: a
            quarter of the slots (at least one).
        timeout_s: default hard timeout of one child's load, from when its child starts loading.
        cache_size: verdicts remembered, by SHA-256 of the blob (least recently used forgotten).
        start_timeout_s: longest a helper (or a spawned child) may take to import NIXL and load its
            UCX plugin before it is killed and its probes fail (~0.5 s here; counted apart from
            ``timeout_s``).
        server_probes: (``"server"``) probes a server serves before it is replaced.
        quiet: children's stdout and stderr (NIXL and UCX logs, UCX's crash backtraces) go to
            /dev/null; False leaves them on this process's stderr.

    Thread-safe. ``stats`` counts ``children`` (blobs actually loaded in a child), ``cached``,
    ``coalesced``, ``busy``, ``refused``, ``crashed``, ``timeouts``, ``helper_starts`` and ``proofs``
    (children that sent a proof's notification). A proof's child that reported holds no running slot
    while it lingers, but counts against ``per_owner`` and, with the probes in flight, against
    ``max_running + max_waiting`` until it is released or gone (:attr:`lingering`).
    """

    def __init__(
        self,
        settings: NixlSettings | None = None,
        *,
        mode: str = "fork",
        max_running: int = 4,
        max_waiting: int = 16,
        per_owner: int | None = None,
        timeout_s: float = 5.0,
        cache_size: int = 1024,
        start_timeout_s: float = 60.0,
        server_probes: int = 256,
        quiet: bool = True,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        for name, value in (("max_running", max_running), ("cache_size", cache_size), ("server_probes", server_probes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 0:
            raise ValueError(f"max_waiting must be an int >= 0, got {max_waiting!r}")
        for name, seconds in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
            if not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
                raise ValueError(f"{name} must be a finite positive number of seconds, got {seconds!r}")
        self.settings = settings or NixlSettings()
        self.mode = mode
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.per_owner = per_owner if per_owner is not None else max(1, (max_running + max_waiting) // 4)
        if isinstance(self.per_owner, bool) or not isinstance(self.per_owner, int) or self.per_owner < 1:
            raise ValueError(f"per_owner must be an int >= 1, got {per_owner!r}")
        self._owned: dict[object, int] = {}
        """Probes not answered yet, by owner."""
        self.timeout_s = float(timeout_s)
        self.cache_size = cache_size
        self.start_timeout_s = float(start_timeout_s)
        self.server_probes = server_probes
        self.quiet = quiet
        self.stats: dict[str, int] = dict.fromkeys(("children", "cached", "coalesced", "busy", "refused", "crashed", "timeouts", "helper_starts", "proofs"), 0)
        self._lock = threading.Lock()
        self._cache: OrderedDict[bytes, str | None] = OrderedDict()
        self._running: dict[bytes, _Probe] = {}
        """Probes not answered yet, by :attr:`_Probe.slot`: those handed to a child and those waiting for a slot."""
        self._lingering: dict[int, _Probe] = {}
        """Proofs whose child sent its notification and is alive, by id (until released or gone)."""
        self._waiting: deque[_Probe] = deque()
        self._active = 0
        """Probes handed to a child (at most ``max_running``)."""
        self._ids = 0
        self._closed = False
        self._helper: _HelperClient | None = None
        self._children: set[subprocess.Popen] = set()
        """(Spawn mode) children alive, killed by :meth:`close`."""
        self._command: list[str] | None = None

    # ------------------------------------------------------------------------- public API ----

    def cached(self, blob: bytes) -> tuple[bool, str | None]:
        """``(True, verdict)`` when a verdict for this blob is remembered, else ``(False, None)``.
        Costs one SHA-256 (~1 us per KiB) and forks nothing."""
        digest = hashlib.sha256(blob).digest()
        with self._lock:
            if digest in self._cache:
                self._cache.move_to_end(digest)
                return True, self._cache[digest]
        return False, None

    def start(self, blob: bytes, on_done: Callable[[str | None], None], timeout_s: float | None = None, owner: object = None) -> bool:
        """Probe ``blob`` without blocking; ``on_done(verdict)`` is called exactly once: None (safe
        to load) or why the peer is refused.

        Returns True when a child will answer (now, or once a slot frees: ``on_done`` is then called
        later, from a helper thread of this object: keep it short, e.g. hand the verdict to your own
        loop, and never wait there for another probe), False when the answer was known at once
        (remembered, ``"busy: ..."``, closed, too large): ``on_done`` was then already called, on the
        calling thread, before this returns. ``timeout_s`` bounds the child's load, not the wait for
        a slot.
        """
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if not 0 < timeout < float("inf"):
            raise ValueError(f"timeout_s must be a finite positive number of seconds, got {timeout_s!r}")
        blob = bytes(blob)
        digest = hashlib.sha256(blob).digest()
        at_once: tuple[str | None] | None = None  # (the verdict,) when known without a child
        probe: _Probe | None = None
        with self._lock:
            if self._closed:
                at_once = (ProbeOutcome(CLOSED).verdict,)
            elif digest in self._cache:
                self._cache.move_to_end(digest)
                self.stats["cached"] += 1
                at_once = (self._cache[digest],)
            elif digest in self._running:
                self.stats["coalesced"] += 1
                self._running[digest].callbacks.append(on_done)
                return True
            elif len(blob) > MAX_BLOB:
                at_once = (f"its metadata is {len(blob)} bytes (the probe takes at most {MAX_BLOB})",)
            else:
                at_once, probe = self._admit(_Probe(0, digest, blob, timeout, [on_done], owner=owner))
        if at_once is not None:
            _call(on_done, at_once[0])
            return False
        assert probe is not None  # (admitted)
        if probe.dispatched:
            self._dispatch(probe)
        return True

    def prove(
        self,
        blob: bytes,
        on_sent: Callable[[str | None], None],
        *,
        agent: str,
        message: bytes,
        linger_s: float,
        timeout_s: float | None = None,
        owner: object = None,
    ) -> Callable[[], None]:
        """Load ``blob`` in a child that then sends ``message`` as a NIXL notification to the agent
        the blob describes, from an agent of its own named ``agent``, without blocking; returns
        ``release``, which ends that child (call it once the proof is over; idempotent, any thread).

        ``on_sent(verdict)`` is called exactly once, as :meth:`start`'s ``on_done``: None once the
        notification is sent (the child then lingers, so that NIXL delivers it, until ``release`` or
        ``linger_s`` seconds later), else why the peer is refused (a crash, a NIXL error, busy,
        closed, or "released" when ``release`` came first). A proof is never answered from the
        remembered verdicts (each sends its own message), except a remembered crash, which refuses
        at once, and never joins another probe of the same blob; it counts against ``per_owner`` and
        the slots as a probe does, and while it lingers as described in the class docstring.

        Fork mode only: the server and spawn modes answer "the metadata probe could not run: ..." at
        once (their children cannot linger and be released).
        """
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if not 0 < timeout < float("inf") or not 0 < linger_s < float("inf"):
            raise ValueError(f"timeout_s and linger_s must be finite positive numbers of seconds, got {timeout_s!r}, {linger_s!r}")
        raw_agent = agent.encode()
        if not raw_agent or len(raw_agent) > 0xFFFF or len(message) > 0xFFFF:
            raise ValueError("a proof needs an agent name and a message of at most 65,535 bytes each")
        blob = bytes(blob)
        digest = hashlib.sha256(blob).digest()
        proof = Proof(agent, bytes(message), float(linger_s))
        at_once: tuple[str | None] | None = None
        probe: _Probe | None = None
        with self._lock:
            if self._closed:
                at_once = (ProbeOutcome(CLOSED).verdict,)
            elif self.mode != "fork":
                at_once = (ProbeOutcome(CANNOT_RUN, f"a proof needs mode='fork' (this probe's mode is {self.mode!r})").verdict,)
            elif self._cache.get(digest) is not None:  # (a remembered crash: refused at once)
                self._cache.move_to_end(digest)
                self.stats["cached"] += 1
                at_once = (self._cache[digest],)
            elif len(blob) > MAX_BLOB:
                at_once = (f"its metadata is {len(blob)} bytes (the probe takes at most {MAX_BLOB})",)
            else:
                at_once, probe = self._admit(_Probe(0, digest, blob, timeout, [on_sent], proof=proof, owner=owner))
        if at_once is not None:
            _call(on_sent, at_once[0])
            return _released
        assert probe is not None  # (admitted)
        if probe.dispatched:
            self._dispatch(probe)
        return functools.partial(self._release, probe)

    @property
    def lingering(self) -> int:
        """Proofs' children alive after sending their notification (not released yet)."""
        with self._lock:
            return len(self._lingering)

    def _admit(self, probe: _Probe) -> tuple[tuple[str | None] | None, _Probe | None]:
        """(Under the lock.) Take a slot for ``probe``, or say why not: ``(at_once, None)``."""
        owner = probe.owner
        if owner is not None and self._owned.get(owner, 0) >= self.per_owner:
            self.stats["busy"] += 1
            return (f"busy: this peer has {self._owned[owner]} metadata probes in flight already (at most {self.per_owner})",), None
        if len(self._running) + len(self._lingering) >= self.max_running + self.max_waiting:
            self.stats["busy"] += 1
            lingering = f", {len(self._lingering)} proofs lingering" if self._lingering else ""
            return (f"busy: {self._active} metadata probes running and {len(self._waiting)} waiting{lingering}",), None
        self._ids = self._ids % 0xFFFFFFFE + 1
        probe.id = self._ids
        self._running[probe.slot] = probe
        if owner is not None:
            self._owned[owner] = self._owned.get(owner, 0) + 1
        if self._active < self.max_running:
            self._active += 1
            probe.dispatched = True
        else:
            self._waiting.append(probe)
        return None, probe

    def _disown(self, owner: object) -> None:
        """(Under the lock.) One probe of ``owner`` ended."""
        if owner is not None:
            left = self._owned.get(owner, 1) - 1
            if left > 0:
                self._owned[owner] = left
            else:
                self._owned.pop(owner, None)

    def _release(self, probe: _Probe) -> None:
        """End a proof: its child is killed (lingering, or still loading), or it never starts (waiting)."""
        with self._lock:
            if probe.released:
                return
            probe.released = True
            lingering = self._lingering.get(probe.id) is probe
            if lingering:
                del self._lingering[probe.id]
                self._disown(probe.owner)
            unanswered = self._running.get(probe.slot) is probe
            helper = self._helper
        if unanswered and not probe.dispatched:
            self._finish(probe, ProbeOutcome(RELEASED), remember=False)
        elif (lingering or unanswered) and helper is not None:
            helper.release(probe.id)

    def _child_ended(self, probe_id: int) -> None:
        """A lingering proof's child is gone (its deadline, a crash, or a release)."""
        with self._lock:
            probe = self._lingering.pop(probe_id, None)
            if probe is not None:
                self._disown(probe.owner)

    def _helper_gone(self) -> None:
        """The helper died or was killed, with every child in its process group."""
        with self._lock:
            gone, self._lingering = list(self._lingering.values()), {}
            for probe in gone:
                self._disown(probe.owner)

    def check(self, blob: bytes, timeout_s: float | None = None) -> str | None:
        """Probe ``blob`` and wait for the verdict: None (safe to load) or why the peer is refused."""
        done = threading.Event()
        verdicts: list[str | None] = []

        def on_done(verdict: str | None) -> None:
            verdicts.append(verdict)
            done.set()

        self.start(blob, on_done, timeout_s)
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        # Every path answers (the helper thread enforces every deadline); this bound is a backstop.
        if not done.wait(self.start_timeout_s + timeout + 2 * _GRACE_S + 5.0):
            return "the metadata probe did not answer"
        return verdicts[0]

    def warm(self) -> None:
        """Start the helper now (fork and server modes), so the first probe does not wait ~0.5 s
        for it to import NIXL."""
        if self.mode != "spawn":
            self._helper_client().warm()

    def close(self) -> None:
        """Kill the helper and children; probes in flight are answered "the metadata probe is closed"."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            helper, self._helper = self._helper, None
        if helper is not None:
            helper.close()
        self._helper_gone()
        with self._lock:
            left = list(self._running.values())
            children = list(self._children)
        for child in children:
            _kill_group(child)
        for probe in left:
            self._finish(probe, ProbeOutcome(CLOSED), remember=False)

    def __enter__(self) -> MetadataProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------- internals ----

    def _dispatch(self, probe: _Probe) -> None:
        """Hand a probe that holds a slot to a child."""
        with self._lock:
            self.stats["children"] += 1
        try:
            if self.mode == "spawn":
                threading.Thread(target=self._spawn, args=(probe,), name="kvpolicy-probe", daemon=True).start()
            else:
                self._helper_client().submit(probe)
        except Exception as exc:  # (no thread, no process): the peer is refused, nothing is remembered
            self._finish(probe, ProbeOutcome(CANNOT_RUN, f"{type(exc).__name__}: {exc}", probe.timeout_s), remember=False)

    def _finish(self, probe: _Probe, outcome: ProbeOutcome, remember: bool = True) -> None:
        with self._lock:
            if self._running.get(probe.slot) is not probe:
                return  # answered already
            del self._running[probe.slot]
            if probe.released:  # (whatever its child did: the caller is done with it)
                outcome, remember = ProbeOutcome(RELEASED), False
            verdict = outcome.verdict
            if probe.proof is not None and verdict is None and not self._closed:
                self.stats["proofs"] += 1
                self._lingering[probe.id] = probe  # (its owner's count stays until it is gone)
            else:
                self._disown(probe.owner)
            callbacks, probe.callbacks = probe.callbacks, []
            following = None
            if probe.dispatched:
                self._active -= 1
                if self._waiting and not self._closed:  # its slot goes to the longest waiting
                    following = self._waiting.popleft()
                    following.dispatched = True
                    self._active += 1
            else:
                try:
                    self._waiting.remove(probe)
                except ValueError:
                    pass
            if verdict is not None and outcome.code != RELEASED:
                self.stats["refused"] += 1
                if outcome.code < 0 and outcome.code != -signal.SIGALRM:
                    self.stats["crashed"] += 1
                elif outcome.code == TIMED_OUT or outcome.code == -signal.SIGALRM:
                    self.stats["timeouts"] += 1
            if remember and outcome.cacheable and not self._closed:
                self._cache[probe.digest] = verdict
                self._cache.move_to_end(probe.digest)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if verdict is not None:
            log.debug("metadata probe: refused a blob (sha256 %s...): %s", probe.digest.hex()[:12], verdict)
        for callback in callbacks:
            _call(callback, verdict)
        if following is not None:
            self._dispatch(following)

    def _helper_client(self) -> _HelperClient:
        with self._lock:
            if self._closed:
                raise RuntimeError("the metadata probe is closed")
            if self._helper is None or self._helper.closed:  # (none yet, or its thread failed)
                self._helper = _HelperClient(self, self.mode)
                # Dropped without close(): the helper thread and process go with this object.
                weakref.finalize(self, _HelperClient.close, self._helper)
            return self._helper

    def command(self, role: str) -> list[str]:
        """The command line of a helper or child (``role``: ``"fork"``, ``"server"``, ``"child"``)."""
        if self._command is None:
            api = import_nixl(self.settings)  # (this process imported it already: no cost)
            settings = {"progress_delay_us": self.settings.progress_delay_us, "ucx_env": self.settings.ucx_env, "backends": self.settings.backends}
            self._command = [sys.executable, "-m", CHILD_PROGRAM, api.__name__, json.dumps(settings)]
        return [*self._command, role, str(self.server_probes)]

    def _environment(self) -> dict[str, str]:
        # The transceiver's UCX environment (applied here before NIXL loaded), plus: numpy's BLAS
        # pool would be the zygote's only thread, and a zygote must hold none when it forks.
        self.settings.apply_environment()
        # No NIXL etcd: a child only loads the blob it is given (an agent that publishes itself to an
        # etcd, or to an address where none listens, spends seconds there).
        environment = {k: v for k, v in os.environ.items() if not k.startswith("NIXL_ETCD")}
        return {**environment, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}

    def _spawn(self, probe: _Probe) -> None:
        """(Spawn mode, on its own thread.) One interpreter for one blob."""
        try:
            child = subprocess.Popen(
                self.command("child"),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL if self.quiet else None,
                env=self._environment(),
                start_new_session=True,
            )
        except OSError as exc:
            return self._finish(probe, ProbeOutcome(CANNOT_RUN, str(exc), probe.timeout_s))
        with self._lock:
            self._children.add(child)
        try:
            request = _request(probe)
            out, _ = child.communicate(request, timeout=self.start_timeout_s + probe.timeout_s + _GRACE_S)
            code = child.returncode
            message = out[:MESSAGE_LIMIT].decode(errors="replace")
            outcome = ProbeOutcome(code, message, probe.timeout_s)
        except subprocess.TimeoutExpired:
            outcome = ProbeOutcome(TIMED_OUT, "", probe.timeout_s)
        except Exception as exc:  # (whatever it is, the probe is answered)
            outcome = ProbeOutcome(CANNOT_RUN, f"{type(exc).__name__}: {exc}", probe.timeout_s)
        finally:
            _kill_group(child)
            with self._lock:
                self._children.discard(child)
        self._finish(probe, outcome)


def _released() -> None:
    """The ``release`` of a proof answered at once: nothing to end."""


def _call(callback: Callable[[str | None], None], verdict: str | None) -> None:
    try:
        callback(verdict)
    except Exception:
        log.exception("metadata probe: a verdict callback raised")
