"""The theft scenarios again across two network namespaces joined by a veth link: the attacker runs
on the decode host, the sender on the prefill host, metadata goes through etcd."""

from __future__ import annotations

import pytest

from tests.support.transfer import HOSTS_LAYOUT as LAYOUT
from tests.support.transfer import HOSTS_TIMEOUT as TIMEOUT
from tests.support.transfer import start_pair

from .conftest import requires_nixl
from .transfer_worker import KEYS_DIR, WorkerError, new_key

pytestmark = requires_nixl


def test_stranger_across_the_link_gets_no_welcome(two_hosts, workers, tmp_path):
    prefill, decode = start_pair(two_hosts, workers, "stranger")
    key_name, secret = new_key("stranger", str(tmp_path))  # a key no allow-list holds
    stranger = workers("stranger", layout=LAYOUT.to_wire(), identity=secret, key_name=key_name,
                       allowed_peers=KEYS_DIR, timeout_s=TIMEOUT, **two_hosts.config("decode"))
    prefill.call("send", "victim", [1, 2], to=decode.key_name)
    with pytest.raises(WorkerError, match="no welcome"):
        stranger.call("connect", prefill.address, timeout_s=3.0)
    assert prefill.call("stats")["refused_handshakes"] >= 1
    decode.call("receive", "victim", [5, 6])
    assert decode.call("wait", "victim")["state"] == "completed"
    assert decode.call("digests", [5, 6]) == prefill.call("digests", [1, 2])


def test_insider_across_the_link_cannot_take_another_receivers_request(two_hosts, workers):
    prefill, decode = start_pair(two_hosts, workers, "insider")
    insider = workers("insider", layout=LAYOUT.to_wire(), seed=3, timeout_s=TIMEOUT, **two_hosts.config("decode"))
    insider.call("connect", prefill.address)
    before = insider.call("digests", [5, 6])
    prefill.call("send", "victim", [1, 2], to=decode.key_name)
    insider.call("receive", "victim", [5, 6], timeout_s=2.0)
    assert insider.call("wait", "victim")["state"] in ("failed", "timed_out")
    assert insider.call("digests", [5, 6]) == before
    decode.call("receive", "victim", [5, 6])
    assert decode.call("wait", "victim")["state"] == "completed"
    assert decode.call("digests", [5, 6]) == prefill.call("digests", [1, 2])
