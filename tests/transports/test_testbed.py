"""The test bed itself: etcd comes back with its data, and two hosts leave nothing behind."""

from __future__ import annotations

import subprocess

import pytest

from tests.testbed import HostPair

from .conftest import netns_why, requires_etcd


@requires_etcd
def test_etcd_restarts_with_its_data(etcd):
    client = etcd.client()  # plain http on loopback: the server's settings carry the explicit flag
    client.put("/kvpolicy/test/key", b"value")
    etcd.stop()
    assert not etcd.healthy(timeout_s=0.2)
    etcd.start()
    assert client.get("/kvpolicy/test/key") == b"value"


def test_two_hosts_are_removed_at_close():
    why = netns_why()
    if why:
        pytest.skip(f"cannot create network namespaces: {why}")
    with HostPair() as pair:
        names = {pair.prefill.netns, pair.decode.netns}
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
        assert names <= {line.split()[0] for line in listed.splitlines() if line.strip()}
        rx, tx = pair.link_bytes(pair.prefill)
        assert rx >= 0 and tx >= 0
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    assert not names & {line.split()[0] for line in listed.splitlines() if line.strip()}
    pair.close()  # twice is fine
