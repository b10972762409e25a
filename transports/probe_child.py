"""The program the metadata probe (:mod:`.probe`) runs in its helper and child processes.

Started by :class:`.probe.MetadataProbe` as ``python -m kvpolicy.transports.probe_child API_MODULE
SETTINGS_JSON fork|server|child PROBES`` (:func:`main`); a serving process never imports it. Each
helper and child imports the NIXL build the parent imported (``API_MODULE``), creates a fresh agent
with the parent's :class:`.agent.NixlSettings`, loads the blob it is given (``add_remote_agent``),
removes it again and reports how that went. Three roles:

``fork`` (a *zygote*): loads NIXL and its UCX plugin once, then forks one single-use child per
    request, kills it at its deadline and replies when it ends. A proof's child (``PROVE``) also
    sends a NIXL notification from an agent named as the request says, writes :data:`.probe_wire.SENT` on
    its result pipe and lingers: the zygote replies ``OK`` at once, kills it on ``RELEASE`` or at its
    linger deadline, and then replies ``ENDED``.
``server``: loads each request's blob itself, in a fresh agent, one at a time; exits after
    ``PROBES`` requests.
``child``: reads one request, loads it, and exits with the outcome as its status.

The protocol (its formats and codes are :mod:`.probe_wire`'s), on the helper's stdin and stdout (which it
moves to fds of its own: UCX logs to stdout): a request is ``REQUEST`` (kind, probe id, timeout and
linger in seconds, the lengths of what follows) and the agent name, message and blob; a reply is ``REPLY`` (probe id, code, message length) and at most
``MESSAGE_LIMIT`` bytes of message, where probe id 0 answers the helper's start-up (``OK``, or
``CANNOT_RUN`` and why NIXL cannot load). A code is ``OK``, ``REJECTED``, ``CANNOT_RUN``,
``TIMED_OUT``, another exit status, or minus the signal that killed the child. A spawned ``child``
reads the same request and answers with its exit status and its message on stdout. Every load runs
under its own ``SIGALRM`` (:func:`_arm`); a helper exits when its stdin closes (the parent went away).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .agent import NixlSettings
from .probe_wire import CANNOT_RUN, ENDED, MESSAGE_LIMIT, OK, PROBE, PROVE, REJECTED, RELEASE, REPLY, REQUEST, SENT, TIMED_OUT


def _load_once(blob: bytes, settings: NixlSettings, create_agent: Callable[..., Any], destroy: bool) -> tuple[int, str]:
    """Create a fresh agent as the transceiver does, load ``blob`` as :meth:`.local.LocalSide.load_agent`
    does, remove it again. (code, message)."""
    try:
        agent = create_agent(f"kvpolicy-probe-{os.getpid()}-{time.monotonic_ns()}", settings)
    except Exception as exc:
        return CANNOT_RUN, f"creating an agent failed: {type(exc).__name__}: {exc}"
    try:
        try:
            loaded = agent.add_remote_agent(blob)
        except Exception as exc:
            return REJECTED, f"{type(exc).__name__}: {exc}"
        try:
            agent.remove_remote_agent(loaded)
        except Exception as exc:
            return REJECTED, f"removing it failed: {type(exc).__name__}: {exc}"
        return OK, ""
    finally:
        if destroy:
            del agent


def _prove_once(
    blob: bytes, settings: NixlSettings, create_agent: Callable[..., Any], agent_name: str, message: bytes, report: int, linger_s: float
) -> tuple[int, str]:
    """(A proof's child.) Create an agent named ``agent_name``, load ``blob``, send ``message`` to the
    agent it describes, write :data:`.probe_wire.SENT` to ``report`` and linger until killed (at most
    ``linger_s``): NIXL sends asynchronously, and a process that exits right after ``send_notif``
    loses the notification. Returns (code, message) only when something failed before the report."""
    try:
        agent = create_agent(agent_name, settings)
    except Exception as exc:
        return CANNOT_RUN, f"creating an agent failed: {type(exc).__name__}: {exc}"
    try:
        loaded = agent.add_remote_agent(blob)
    except Exception as exc:
        return REJECTED, f"{type(exc).__name__}: {exc}"
    try:
        agent.send_notif(loaded.decode() if isinstance(loaded, bytes) else loaded, message)
    except Exception as exc:
        return REJECTED, f"sending the notification failed: {type(exc).__name__}: {exc}"
    _arm(linger_s)  # (the zygote kills it first; this only ends one whose zygote went away)
    os.write(report, SENT)
    while True:
        signal.pause()


def _read_request(fd: int) -> tuple[int, int, float, float, bytes, bytes, bytes] | None:
    """(Blocking.) The next request on ``fd``: (kind, probe id, timeout, linger, agent, message, blob);
    None at the end of the stream."""
    header = _read_exact(fd, REQUEST.size)
    if header is None:
        return None
    kind, probe_id, timeout_s, linger_s, agent_size, message_size, blob_size = REQUEST.unpack(header)
    rest = _read_exact(fd, agent_size + message_size + blob_size)
    if rest is None:
        return None
    return kind, probe_id, timeout_s, linger_s, rest[:agent_size], rest[agent_size : agent_size + message_size], rest[agent_size + message_size :]


def _prepare(api_name: str, settings: NixlSettings) -> Callable[..., Any]:
    """Import the NIXL build the parent imported (``api_name``, e.g. ``nixl_cu12._api``) and return
    :func:`.agent.create_agent`, which imports ``nixl._api``: that name is bound to the build
    directly, so the ``nixl`` meta package's CUDA detection (which imports torch) is skipped."""
    import importlib
    import types

    settings.apply_environment()
    api = importlib.import_module(api_name)
    if "nixl" not in sys.modules:
        package = types.ModuleType("nixl")
        package.__path__ = []
        package._api = api  # type: ignore[attr-defined]  # a stand-in nixl package: ModuleType declares no _api
        sys.modules["nixl"] = package
    sys.modules.setdefault("nixl._api", api)
    from .agent import create_agent

    return create_agent


def _warm_plugins(api: Any, settings: NixlSettings) -> None:
    """Load the backend plugins (and with them UCX: ~0.4 s) without creating an agent's threads or a
    UCX context, so that forked children start from there."""
    bindings = api.nixlBind
    config = bindings.nixlAgentConfig()
    config.useProgThread = False
    config.useListenThread = False
    agent = bindings.nixlAgent("kvpolicy-probe-warm", config)
    for backend in settings.backends:
        agent.getPluginParams(backend)
    del agent


def _read_exact(fd: int, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _reply(fd: int, probe_id: int, code: int, message: str) -> None:
    raw = message.encode(errors="replace")[:MESSAGE_LIMIT]
    _write_all(fd, REPLY.pack(probe_id, code, len(raw)) + raw)


def _arm(timeout_s: float) -> None:
    """A hard timeout of this process's own: SIGALRM's default action ends it, even inside C code."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)


def _take_fds(quiet: bool) -> tuple[int, int]:
    """The protocol moves to fds of its own; fds 0 and 1 become /dev/null (UCX logs to stdout), and
    2 too when quiet."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull if quiet else 2, 1)
    os.close(devnull)
    return proto_in, proto_out


def _serve_child(api_name: str, settings: NixlSettings) -> int:
    """(Spawn mode.) Read one request on stdin, load it, exit with the outcome (message on stdout)."""
    proto_in, proto_out = _take_fds(quiet=False)
    request = _read_request(proto_in)
    if request is None or request[0] == PROVE:  # (the parent never sends a proof here)
        return CANNOT_RUN
    _, _, timeout_s, _, _, _, blob = request
    try:
        create_agent = _prepare(api_name, settings)
    except Exception as exc:
        _write_all(proto_out, f"NIXL cannot load: {type(exc).__name__}: {exc}".encode()[:MESSAGE_LIMIT])
        return CANNOT_RUN
    _arm(timeout_s)
    code, message = _load_once(blob, settings, create_agent, destroy=False)
    _write_all(proto_out, message.encode(errors="replace")[:MESSAGE_LIMIT])
    os._exit(code)  # no teardown: nothing to keep, and UCX's exit path has crashed before


def _serve_server(api_name: str, settings: NixlSettings, probes: int) -> int:
    """(Server mode.) Load each request's blob in a fresh agent, one at a time; exit after ``probes``."""
    proto_in, proto_out = _take_fds(quiet=False)
    try:
        create_agent = _prepare(api_name, settings)
    except Exception as exc:
        _reply(proto_out, 0, CANNOT_RUN, f"NIXL cannot load: {type(exc).__name__}: {exc}")
        return 1
    _reply(proto_out, 0, OK, "")
    for _ in range(probes):
        request = _read_request(proto_in)
        if request is None:
            return 0
        kind, probe_id, timeout_s, _, _, _, blob = request
        if kind != PROBE:  # (the parent never sends a proof or a release here)
            if kind == PROVE:
                _reply(proto_out, probe_id, CANNOT_RUN, "a proof needs the fork mode")
            continue
        _arm(timeout_s)
        code, message = _load_once(blob, settings, create_agent, destroy=True)
        signal.setitimer(signal.ITIMER_REAL, 0)
        _reply(proto_out, probe_id, code, message)
    os._exit(0)


@dataclass
class _Child:
    """(The zygote's.) One forked child."""

    probe_id: int
    deadline: float
    result: int
    """The read end of its result pipe."""
    pidfd: int | None
    linger_s: float = 0.0
    """(A proof) how long it may linger once it reported; 0 for a probe."""
    reported: bool = False
    """(A proof) it sent its notification and the parent was told (``OK``): its end is ``ENDED``."""
    message: bytes = b""
    """What it wrote before it exited (read early while waiting for a proof's report)."""


def _serve_zygote(api_name: str, settings: NixlSettings) -> int:
    """(Fork mode.) Fork one single-use child per request; kill it at its deadline (or, a proof's, on
    release); reply when it ends (a proof's: when it reports, and ``ENDED`` when it ends)."""
    proto_in, proto_out = _take_fds(quiet=False)
    try:
        create_agent = _prepare(api_name, settings)
        _warm_plugins(sys.modules["nixl._api"], settings)
    except Exception as exc:
        _reply(proto_out, 0, CANNOT_RUN, f"NIXL cannot load: {type(exc).__name__}: {exc}")
        return 1
    _reply(proto_out, 0, OK, "")
    os.set_blocking(proto_in, False)
    selector = selectors.DefaultSelector()
    selector.register(proto_in, selectors.EVENT_READ, None)
    children: dict[int, _Child] = {}
    by_probe: dict[int, int] = {}  # probe id -> pid
    buffer = bytearray()
    stdin_open = True
    pidfd_open = getattr(os, "pidfd_open", None)

    def reap(pid: int, status: int | None) -> None:
        child = children.pop(pid)
        by_probe.pop(child.probe_id, None)
        if child.pidfd is not None:
            selector.unregister(child.pidfd)
            os.close(child.pidfd)
        if not child.reported:
            _unwatch(selector, child.result)
        message = child.message
        try:
            os.set_blocking(child.result, False)
            message += os.read(child.result, MESSAGE_LIMIT)
        except (BlockingIOError, OSError):
            pass
        os.close(child.result)
        if child.reported:
            _reply(proto_out, child.probe_id, ENDED, "")
            return
        if status is None:
            code = TIMED_OUT
        elif os.WIFSIGNALED(status):
            code = -os.WTERMSIG(status)
        else:
            code = os.WEXITSTATUS(status)
        _reply(proto_out, child.probe_id, code, message.decode(errors="replace"))

    def on_report(pid: int) -> None:
        """A proof's child wrote on its result pipe: its report, or a failure's message before it exits."""
        child = children[pid]
        try:
            data = os.read(child.result, MESSAGE_LIMIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        _unwatch(selector, child.result)
        if data.startswith(SENT):
            child.reported = True
            child.deadline = time.monotonic() + child.linger_s
            _reply(proto_out, child.probe_id, OK, "")
        else:  # (a failure's message, or the end of the pipe: its exit says the rest)
            child.message += data

    while stdin_open or children:
        now = time.monotonic()
        deadlines = [child.deadline for child in children.values()]
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        if pidfd_open is None and children:
            timeout = min(timeout if timeout is not None else 0.01, 0.01)
        for key, _ in selector.select(timeout):
            if key.fd == proto_in:
                try:
                    chunk = os.read(proto_in, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:  # the parent went away: so do we, and our children
                    stdin_open = False
                    selector.unregister(proto_in)
                    for pid in list(children):
                        _kill_pid(pid)
                    continue
                buffer += chunk
                while len(buffer) >= REQUEST.size:
                    kind, probe_id, timeout_s, linger_s, agent_size, message_size, blob_size = REQUEST.unpack_from(buffer)
                    end = REQUEST.size + agent_size + message_size + blob_size
                    if len(buffer) < end:
                        break
                    agent_name = bytes(buffer[REQUEST.size : REQUEST.size + agent_size]).decode(errors="replace")
                    message = bytes(buffer[REQUEST.size + agent_size : REQUEST.size + agent_size + message_size])
                    blob = bytes(buffer[REQUEST.size + agent_size + message_size : end])
                    del buffer[:end]
                    if kind == RELEASE:
                        if probe_id in by_probe:
                            _kill_pid(by_probe[probe_id])  # (reaped, and answered, when its exit is seen)
                        continue
                    result_r, result_w = os.pipe()
                    pid = os.fork()
                    if pid == 0:  # the child: a pristine copy of this process
                        try:
                            os.close(result_r)
                            os.close(proto_in)
                            os.close(proto_out)
                            _arm(timeout_s)
                            if kind == PROVE:
                                code, text = _prove_once(blob, settings, create_agent, agent_name, message, result_w, linger_s)
                            else:
                                code, text = _load_once(blob, settings, create_agent, destroy=False)
                            os.write(result_w, text.encode(errors="replace")[:MESSAGE_LIMIT])
                        except BaseException:
                            code = CANNOT_RUN
                        os._exit(code)
                    os.close(result_w)
                    pidfd = None
                    if pidfd_open is not None:
                        try:
                            pidfd = pidfd_open(pid)
                            selector.register(pidfd, selectors.EVENT_READ, pid)
                        except OSError:
                            pidfd, pidfd_open = None, None
                    child = children[pid] = _Child(probe_id, time.monotonic() + timeout_s + 1.0, result_r, pidfd)
                    by_probe[probe_id] = pid
                    if kind == PROVE:
                        child.linger_s = linger_s
                        os.set_blocking(result_r, False)
                        selector.register(result_r, selectors.EVENT_READ, ("report", pid))
            elif isinstance(key.data, tuple):
                if key.data[1] in children:
                    on_report(key.data[1])
            else:
                pid = key.data
                _, status = os.waitpid(pid, 0)
                reap(pid, status)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reap(pid, status)
            elif time.monotonic() >= children[pid].deadline:
                _kill_pid(pid)
                os.waitpid(pid, 0)
                reap(pid, None)
    return 0


def _unwatch(selector: selectors.BaseSelector, fd: int) -> None:
    try:
        selector.unregister(fd)
    except (KeyError, ValueError):
        pass


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    """``python -m kvpolicy.transports.probe_child API_MODULE SETTINGS_JSON fork|server|child PROBES``."""
    api_name, settings_json, role, probes = argv
    raw = json.loads(settings_json)
    settings = NixlSettings(
        progress_delay_us=int(raw["progress_delay_us"]),
        ucx_env=tuple((str(k), str(v)) for k, v in raw["ucx_env"]),
        backends=tuple(raw["backends"]),
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the parent decides when helpers end)
    if role == "fork":
        return _serve_zygote(api_name, settings)
    if role == "server":
        return _serve_server(api_name, settings, int(probes))
    if role == "child":
        return _serve_child(api_name, settings)
    raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
