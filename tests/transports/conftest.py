"""Shared set-up for the transport tests.

UCX reads its environment when NIXL first loads it: tests.support.nixl makes the loopback /
no-InfiniBand settings on import, before any test imports nixl; child processes inherit them.
"""

from __future__ import annotations

import pytest

from tests.support.nixl import NIXL_OK, NIXL_WHY, requires_nixl  # noqa: F401  (the tests import them from here)
from tests.testbed import EtcdServer, HostPair, etcd_binary, netns_unavailable


@pytest.fixture
def workers():
    """Start worker processes on demand; every one is stopped (and killed if need be) at teardown."""
    from .transfer_worker import Worker

    started: list[Worker] = []

    def start(name: str, **config):
        worker = Worker(name, **config)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


# -- etcd and two hosts ---------------------------------------------------------------------------

ETCD_WHY = "" if etcd_binary() else "the etcd binary is not installed (apt-get install etcd-server)"
requires_etcd = pytest.mark.skipif(bool(ETCD_WHY), reason=ETCD_WHY)
"""Mark for tests that need an etcd server: they skip, with the reason, where the binary is missing."""

_NETNS_WHY: list[str] = []


def netns_why() -> str:
    """Why two hosts cannot be made here ('' when they can); probed once, by making a namespace."""
    if not _NETNS_WHY:
        _NETNS_WHY.append(netns_unavailable())
    return _NETNS_WHY[0]


@pytest.fixture
def etcd():
    """A fresh etcd on 127.0.0.1 (free ports, temporary data dir), removed at teardown."""
    if ETCD_WHY:
        pytest.skip(ETCD_WHY)
    server = EtcdServer("127.0.0.1")
    try:
        yield server
    finally:
        server.close()


class TwoHosts:
    """Prefill and decode network namespaces joined by a veth link, with etcd inside the prefill
    namespace on its link address (so both sides reach it, and dropping the link cuts decode off
    from it as a real network partition would)."""

    def __init__(self) -> None:
        self.pair = HostPair()
        try:
            self.etcd = EtcdServer(self.pair.prefill.address, netns=self.pair.prefill.netns, secure=True)
        except BaseException:
            self.pair.close()
            raise

    def config(self, side: str, **extra):
        """Worker config for a rank on ``side`` ('prefill' or 'decode'): in its namespace, NIXL over
        TCP on its veth device, rank records in etcd over TLS with a user, NIXL metadata in the
        authenticated hello, control socket on its link address."""
        host = self.pair.prefill if side == "prefill" else self.pair.decode
        env = {**self.pair.ucx_env(host), **self.etcd.client_env()}
        return {"netns": host.netns, "env": env, "host": host.address, **extra}

    def close(self) -> None:
        try:
            self.etcd.close()
        finally:
            self.pair.close()


@pytest.fixture(scope="module")
def two_hosts():
    """A :class:`TwoHosts`, made once per module; skips with the reason where it cannot be made."""
    if ETCD_WHY:
        pytest.skip(ETCD_WHY)
    why = netns_why()
    if why:
        pytest.skip(f"cannot create network namespaces: {why}")
    hosts = TwoHosts()
    try:
        yield hosts
    finally:
        hosts.close()
