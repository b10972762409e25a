"""The program the metadata probe (:mod:`.probe`) runs in its helper and child processes.

Started by :class:`.probe.MetadataProbe` as ``python -m kvpolicy.transports.probe_child API_MODULE
SETTINGS_JSON fork|server|child PROBES`` (:func:`main`); a serving process never imports it. Each
helper and child imports the NIXL build the parent imported (``API_MODULE``), creates a fresh agent
with the parent's :class:`.agent.NixlSettings`, loads the blob it is given (``add_remote_agent``),
removes it again and reports how that went. Three roles:

``fork`` (a *zygote*): loads NIXL and its UCX plugin once, then forks one single-use child per
    request, kills it at its deadline and replies when it ends.
``server``: loads each request's blob itself, in a fresh agent, one at a time; exits after
    ``PROBES`` requests.
``child``: reads one request, loads it, and exits with the outcome as its status.

The protocol (its formats and codes are :mod:`.probe`'s), on the helper's stdin and stdout (which it
moves to fds of its own: UCX logs to stdout): a request is ``REQUEST`` (probe id, timeout in seconds,
blob length) and the blob; a reply is ``REPLY`` (probe id, code, message length) and at most
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
from typing import Any

from .agent import NixlSettings
from .probe import CANNOT_RUN, MESSAGE_LIMIT, OK, REJECTED, REPLY, REQUEST, TIMED_OUT


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
    header = _read_exact(proto_in, REQUEST.size)
    if header is None:
        return CANNOT_RUN
    _, timeout_s, size = REQUEST.unpack(header)
    blob = _read_exact(proto_in, size)
    if blob is None:
        return CANNOT_RUN
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
        header = _read_exact(proto_in, REQUEST.size)
        if header is None:
            return 0
        probe_id, timeout_s, size = REQUEST.unpack(header)
        blob = _read_exact(proto_in, size)
        if blob is None:
            return 0
        _arm(timeout_s)
        code, message = _load_once(blob, settings, create_agent, destroy=True)
        signal.setitimer(signal.ITIMER_REAL, 0)
        _reply(proto_out, probe_id, code, message)
    os._exit(0)


def _serve_zygote(api_name: str, settings: NixlSettings) -> int:
    """(Fork mode.) Fork one single-use child per request; kill it at its deadline; reply when it ends."""
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
    children: dict[int, tuple[int, float, int, int | None]] = {}  # pid -> (probe id, deadline, result fd, pidfd)
    buffer = bytearray()
    stdin_open = True
    pidfd_open = getattr(os, "pidfd_open", None)

    def reap(pid: int, status: int | None) -> None:
        probe_id, _, result_fd, pidfd = children.pop(pid)
        if pidfd is not None:
            selector.unregister(pidfd)
            os.close(pidfd)
        message = b""
        try:
            os.set_blocking(result_fd, False)
            message = os.read(result_fd, MESSAGE_LIMIT)
        except (BlockingIOError, OSError):
            pass
        os.close(result_fd)
        if status is None:
            code = TIMED_OUT
        elif os.WIFSIGNALED(status):
            code = -os.WTERMSIG(status)
        else:
            code = os.WEXITSTATUS(status)
        _reply(proto_out, probe_id, code, message.decode(errors="replace"))

    while stdin_open or children:
        now = time.monotonic()
        deadlines = [deadline for _, deadline, _, _ in children.values()]
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
                    probe_id, timeout_s, size = REQUEST.unpack_from(buffer)
                    if len(buffer) < REQUEST.size + size:
                        break
                    blob = bytes(buffer[REQUEST.size : REQUEST.size + size])
                    del buffer[: REQUEST.size + size]
                    result_r, result_w = os.pipe()
                    pid = os.fork()
                    if pid == 0:  # the child: a pristine copy of this process
                        try:
                            os.close(result_r)
                            os.close(proto_in)
                            os.close(proto_out)
                            _arm(timeout_s)
                            code, message = _load_once(blob, settings, create_agent, destroy=False)
                            os.write(result_w, message.encode(errors="replace")[:MESSAGE_LIMIT])
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
                    children[pid] = (probe_id, time.monotonic() + timeout_s + 1.0, result_r, pidfd)
            else:
                pid = key.data
                _, status = os.waitpid(pid, 0)
                reap(pid, status)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reap(pid, status)
            elif time.monotonic() >= children[pid][1]:
                _kill_pid(pid)
                os.waitpid(pid, 0)
                reap(pid, None)
    return 0


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
