"""Two hosts and a metadata service on one machine, for tests and benchmarks.

* :class:`EtcdServer` (from :mod:`.etcd`, re-exported): a throwaway ``etcd`` (Debian's
  ``etcd-server``) with a temporary data dir, listening on one address and free ports; plain, or with
  ``secure=True`` TLS-only with client certificates and etcd's auth enabled.
* :class:`HostPair`: two network namespaces joined by a veth pair (iproute2), addresses
  ``10.231.7.1/24`` (prefill) and ``10.231.7.2/24`` (decode). A process enters one with
  :func:`enter_namespace`; :meth:`HostPair.ucx_env` gives the UCX settings that make NIXL use TCP over
  the veth device, so the bytes really cross the link (on one kernel UCX would otherwise see the peer as
  local and copy through CMA). :meth:`~HostPair.link_bytes` reads the link's byte counters.

Only loopback and addresses inside namespaces made here are ever used. Everything has a finite
timeout, and :meth:`close` removes what was made even after a failure.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass

from .etcd import EtcdPKI, EtcdServer, etcd_binary, free_port, make_pki

__all__ = [
    "EtcdPKI",
    "EtcdServer",
    "HostPair",
    "enter_namespace",
    "etcd_binary",
    "free_port",
    "make_pki",
    "netns_unavailable",
]

_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_REC = 16384
_MS_SLAVE = 1 << 19
_MNT_DETACH = 2


def _run(args: list[str], timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=check)


def netns_unavailable() -> str:
    """Why network namespaces cannot be made here (empty when they can): not root, no ``ip``, no
    CAP_NET_ADMIN. Tries for real: makes a namespace and deletes it."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    name = f"kvprobe-{uuid.uuid4().hex[:6]}"
    try:
        made = _run(["ip", "netns", "add", name], check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns add` failed: {exc}"
    if made.returncode != 0:
        return f"`ip netns add` failed (needs root / CAP_NET_ADMIN): {made.stderr.strip()}"
    _run(["ip", "netns", "del", name], check=False)
    return ""


def enter_namespace(name: str) -> None:
    """Move the calling process into network namespace ``name`` (made by ``ip netns add``).

    Call it first thing in a fresh process, before any socket or thread exists: sockets keep the
    namespace they were made in, and only the calling thread moves.
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what} (network namespace {name!r}): {os.strerror(errno)}")

    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        check(libc.setns(fd, _CLONE_NEWNET), "setns")
    finally:
        os.close(fd)
    # As `ip netns exec` does: a private mount namespace with /sys mounted afresh, so that
    # /sys/class/net lists this namespace's devices (UCX finds its devices there).
    check(libc.unshare(_CLONE_NEWNS), "unshare mounts")
    check(libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None), "make mounts private")
    check(libc.umount2(b"/sys", _MNT_DETACH), "unmount /sys")
    check(libc.mount(name.encode(), b"/sys", b"sysfs", 0, None), "mount /sys")


@dataclass(frozen=True)
class Host:
    """One side of a :class:`HostPair`."""

    netns: str
    device: str
    address: str


class HostPair:
    """Two network namespaces, ``prefill`` and ``decode``, joined by one veth pair.

    Names get a random suffix so that runs never collide; :meth:`close` deletes both namespaces (the
    veth pair goes with them). ``subnet`` must be a private /24 used by nothing else here.
    """

    def __init__(self, subnet: str = "10.231.7") -> None:
        reason = netns_unavailable()
        if reason:
            raise PermissionError(reason)
        tag = uuid.uuid4().hex[:6]
        self.prefill = Host(f"kvpf-{tag}", f"kvpf{tag}", f"{subnet}.1")
        self.decode = Host(f"kvdc-{tag}", f"kvdc{tag}", f"{subnet}.2")
        self._made: list[str] = []
        try:
            for host in (self.prefill, self.decode):
                _run(["ip", "netns", "add", host.netns])
                self._made.append(host.netns)
            _run(["ip", "link", "add", self.prefill.device, "type", "veth", "peer", "name", self.decode.device])
            for host in (self.prefill, self.decode):
                _run(["ip", "link", "set", host.device, "netns", host.netns])
                _run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.device])
                _run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
            self.set_link(True)
        except BaseException:
            self.close()
            raise

    @property
    def hosts(self) -> tuple[Host, Host]:
        """``(prefill, decode)``."""
        return self.prefill, self.decode

    def ucx_env(self, host: Host) -> dict[str, str | None]:
        """UCX settings for a process in ``host``: TCP only, over its veth device. ``None`` means
        "unset": the CMA segment size means nothing without CMA, and UCX warns about it."""
        return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": host.device, "UCX_MODULES": "^ib", "UCX_CMA_SEG_SIZE": None}

    def set_link(self, up: bool) -> None:
        """Bring both ends of the veth link up or down (``down`` drops the link for both sides)."""
        for host in (self.prefill, self.decode):
            _run(["ip", "-n", host.netns, "link", "set", host.device, "up" if up else "down"])

    def link_bytes(self, host: Host) -> tuple[int, int]:
        """``(rx_bytes, tx_bytes)`` of ``host``'s end of the link."""
        out = _run(["ip", "-n", host.netns, "-s", "-j", "link", "show", "dev", host.device]).stdout
        stats = json.loads(out)[0]["stats64"]
        return int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"])

    def close(self) -> None:
        """Delete the namespaces (and with them the veth pair). Safe to call twice."""
        while self._made:
            _run(["ip", "netns", "del", self._made.pop()], check=False)

    def __enter__(self) -> HostPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
