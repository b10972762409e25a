"""Attacks on the control plane, each by a real process or socket on loopback, each ending defended:
no theft, no crash, no forged completion; the sender keeps serving its real receiver bit for bit."""

from __future__ import annotations

import time

import msgpack
import pytest

from kvpolicy.transports import KVLayout, control

from tests.support.transfer import eventually, fake_rank

from .attackers import allowed_dealer, dealer, plain_dealer, recv, try_send
from .conftest import requires_nixl
from .transfer_worker import KEYS_DIR, WorkerError, new_key

pytestmark = requires_nixl

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)


@pytest.fixture
def cluster(workers):
    """A prefill rank, its real decode rank connected to it, and a third rank whose key is allowed
    (an insider: part of the cluster, but not the receiver any request is offered to)."""
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1, limits={"parked_per_peer": 64})
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    insider = workers("insider", layout=LAYOUT.to_wire(), seed=3)
    decode.call("connect", prefill.address)
    insider.call("connect", prefill.address)
    return prefill, decode, insider


def served(prefill, decode, request_id, src, dst):
    """The real receiver gets its request, bit for bit."""
    prefill.call("send", request_id, src, to=decode.key_name)
    decode.call("receive", request_id, dst, peers=["prefill"])
    outcome = decode.call("wait", request_id)
    assert outcome["state"] == "completed", outcome
    assert prefill.call("wait", request_id)["state"] == "completed"
    assert decode.call("digests", dst) == prefill.call("digests", src)


def metadata_header(agent: str) -> bytes:
    """The first field of NIXL metadata, naming ``agent``, followed by junk."""
    name = agent.encode()
    return b"nixlSerDes|Agent" + len(name).to_bytes(8, "little") + name + b"|Conns" + b"\x00" * 64


def test_stranger_without_a_key_gets_no_welcome_and_takes_nothing(cluster):
    prefill, decode, _ = cluster
    prefill.call("send", "victim", [1, 2], to=decode.key_name)
    agent, metadata = decode.call("metadata")
    for sock in (dealer(prefill.address), plain_dealer(prefill.address)):  # an unknown key; no CURVE at all
        try:
            try_send(sock, control.encode(control.Hello(fake_rank(agent, metadata))))
            try_send(sock, control.encode(control.Request("victim", 1, (5, 6), 0, 5000)))
            assert recv(sock, 1500) is None  # no welcome, no result: not even the sender's agent name
        finally:
            sock.close(0)
    assert prefill.call("stats")["refused_handshakes"] >= 1
    decode.call("receive", "victim", [5, 6], peers=["prefill"])
    assert decode.call("wait", "victim")["state"] == "completed"
    assert decode.call("digests", [5, 6]) == prefill.call("digests", [1, 2])


def test_a_stranger_with_its_own_key_and_real_metadata_fails_the_handshake(cluster, workers, tmp_path):
    """The hello of a stranger that does everything right (its own key pair, a NIXL agent bound to
    that key, that agent's real metadata) except being on the allow-list: the CURVE handshake itself
    is refused (seen from the stranger's socket), so not one frame of it is read."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    prefill, decode, _ = cluster
    key_name, secret = new_key("stranger", str(tmp_path))  # a key no allow-list holds
    stranger = workers("stranger", layout=LAYOUT.to_wire(), identity=secret, key_name=key_name)
    agent, metadata = stranger.call("metadata")
    refused, remotes = prefill.call("stats")["refused_handshakes"], prefill.call("resources")["remotes"]
    sock = dealer(prefill.address, secret)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        try_send(sock, control.encode(control.Hello(control.RankInfo(key_name, agent, metadata, LAYOUT, 1 << 30, 64, "DRAM", 0))))
        assert monitor.poll(5000), "no handshake event"
        event = recv_monitor_message(monitor)["event"]
        assert event == zmq.EVENT_HANDSHAKE_FAILED_AUTH, event
        assert recv(sock, 500) is None
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
    eventually(lambda: prefill.call("stats")["refused_handshakes"] > refused)
    assert prefill.call("resources")["remotes"] == remotes  # (the decoder and the insider)


def test_insider_cannot_take_a_request_offered_to_another_receiver(cluster):
    prefill, decode, insider = cluster
    insider.call("fill", 77)
    before = insider.call("digests", [3, 4, 5, 6])
    # Asking before the offer (a guessed id), and after it.
    insider.call("receive", "early", [3, 4], peers=["prefill"], timeout_s=2.0)
    prefill.call("send", "early", [10, 11], to=decode.key_name)
    prefill.call("send", "late", [12, 13], to=decode.key_name)
    insider.call("receive", "late", [5, 6], peers=["prefill"], timeout_s=2.0)
    for request_id in ("early", "late"):
        assert insider.call("wait", request_id)["state"] in ("failed", "timed_out")
    assert insider.call("digests", [3, 4, 5, 6]) == before  # not a byte of it arrived
    assert prefill.call("stats")["dropped_not_addressee"] >= 1
    for request_id, src, dst in (("early", [10, 11], [20, 21]), ("late", [12, 13], [22, 23])):
        decode.call("receive", request_id, dst, peers=["prefill"])
        assert decode.call("wait", request_id)["state"] == "completed"
        assert decode.call("digests", dst) == prefill.call("digests", src)


def test_insider_cannot_cancel_or_fail_another_receivers_request(cluster):
    prefill, decode, insider = cluster
    prefill.call("send", "victim", [1, 2], to=decode.key_name)
    deadline = 10_000  # timeout_ms: counted by the sender from when it reads the frame
    insider.call("raw", "prefill", [
        control.encode(control.Cancel("victim", 0)),
        control.encode(control.Request("victim", 3, (63, 63), 0, deadline)),  # repeated ids: would fail the offer
        control.encode(control.Request("victim", 4, (1_000_000,), 0, deadline)),  # past the receiver's pool
    ])
    eventually(lambda: prefill.call("stats")["dropped_not_addressee"] >= 1)
    assert prefill.call("state", "victim") == "waiting"
    decode.call("receive", "victim", [7, 8], peers=["prefill"])
    assert decode.call("wait", "victim")["state"] == "completed"
    assert prefill.call("wait", "victim")["state"] == "completed"
    assert decode.call("digests", [7, 8]) == prefill.call("digests", [1, 2])


def test_confused_deputy_cannot_name_the_decoders_agent(cluster):
    prefill, decode, _ = cluster
    agent, metadata = decode.call("metadata")
    sock, own = allowed_dealer(prefill.address, "deputy")
    try:
        # The decoder's agent name and its real metadata, sent under another (allowed) key.
        sock.send(control.encode(control.Hello(fake_rank(agent, metadata))))
        # An agent name bound to this key, with metadata naming the decoder's agent.
        sock.send(control.encode(control.Hello(fake_rank(own, metadata))))
        assert recv(sock, 1500) is None
    finally:
        sock.close(0)
    eventually(lambda: prefill.call("stats")["refused_hellos"] >= 2)
    served(prefill, decode, "after-deputy", [3, 4], [9, 10])


def test_corrupted_and_oversized_hellos_and_frames_are_refused_and_the_sender_lives(cluster):
    prefill, decode, insider = cluster
    sock, own = allowed_dealer(prefill.address, "corrupt")
    try:
        hello = control.Hello(fake_rank(own, metadata_header("someone-else")))
        frame = bytearray(control.encode(hello))
        for offset in range(0, len(frame), 7):  # byte flips all over a hello
            mutated = bytearray(frame)
            mutated[offset] ^= 0xFF
            sock.send(bytes(mutated))
        sock.send(control.encode(control.Hello(fake_rank(own, metadata_header(own), num_blocks=1 << 24))))  # 2**24 blocks
        huge = msgpack.packb([control.PROTOCOL_VERSION, "hello", {**fake_rank(own).to_wire(), "num_blocks": 2**64 - 1}])
        sock.send(huge)
        assert recv(sock, 1000) is None
    finally:
        sock.close(0)
    # An admitted peer asks for block 2**62 and for a huge skip: dropped at the boundary.
    deadline = 10_000  # timeout_ms: counted by the sender from when it reads the frame
    insider.call("raw", "prefill", [
        msgpack.packb([control.PROTOCOL_VERSION, "request", "x", 1, [2**62], 0, deadline]),
        msgpack.packb([control.PROTOCOL_VERSION, "request", "x", 1, [1], 2**63, deadline]),
    ])
    eventually(lambda: prefill.call("stats")["dropped_malformed"] >= 3)
    stats = prefill.call("stats")
    assert stats["refused_hellos"] >= 1 and stats["internal_errors"] == 0
    served(prefill, decode, "after-corruption", [5, 6], [11, 12])


def test_many_asks_are_bounded_per_peer(cluster):
    prefill, decode, insider = cluster
    deadline = 20_000  # timeout_ms: counted by the sender from when it reads the frame
    frames = [control.encode(control.Request(f"guess-{i}", i + 1, (1,), 0, deadline)) for i in range(3000)]
    insider.call("raw", "prefill", frames)
    eventually(lambda: prefill.call("stats")["dropped_over_budget"] >= 3000 - 64, timeout_s=20)
    assert prefill.call("resources")["parked"] <= 64
    served(prefill, decode, "beside-flood", [1, 2], [3, 4])


def test_a_peer_flooding_nixl_notifications_is_drained_and_the_service_goes_on(workers):
    # The protocol sends no NIXL notification, but NIXL queues every one an agent holding this side's
    # metadata sends, with no bound, until it is taken: the receiver drains and counts them while it
    # is awake anyway (an idle side does not wake for it), and keeps draining while they come.
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2, limits={"notification_drain_s": 0.2})
    insider = workers("insider", layout=LAYOUT.to_wire(), seed=3)
    decode.call("connect", prefill.address)

    def dropped_after_a_command() -> int:  # (a command wakes the decoder's service thread)
        assert decode.call("cancel", "no-such-request") is False
        return decode.call("stats")["dropped_notifications"]

    served(prefill, decode, "before-notifications", [1, 2], [3, 4])
    time.sleep(0.3)
    assert dropped_after_a_command() == 0  # a drain ran after the transfer: real transfers send none
    _, metadata = decode.call("metadata")  # what its sender got in the hello
    sent = insider.call("notify_flood", metadata, 3000, 16 << 10)
    served(prefill, decode, "during-notifications", [5, 6], [7, 8])
    eventually(lambda: dropped_after_a_command() == sent, timeout_s=20)
    served(prefill, decode, "after-notifications", [9, 10], [11, 12])
    assert decode.call("stats")["dropped_notifications"] == sent


def test_many_hellos_cost_no_threads_no_descriptors(workers):
    # The sender may read metadata from etcd (an address where nothing listens): hellos without
    # metadata must not start a thread each.
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1, env={"NIXL_ETCD_ENDPOINTS": "http://127.0.0.1:9"})
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", prefill.address)
    before = prefill.call("resources")
    sockets = []
    try:
        for i in range(40):  # 40 allowed keys, each says hello 10 times without metadata
            sock, own = allowed_dealer(prefill.address, f"flood{i}")
            for _ in range(10):
                sock.send(control.encode(control.Hello(fake_rank(own))))
            sockets.append(sock)
        for _ in range(200):  # and strangers open connection after connection
            stranger = dealer(prefill.address)
            try_send(stranger, control.encode(control.Hello(fake_rank("x-y-1-2"))))
            sockets.append(stranger)
        eventually(lambda: prefill.call("stats")["refused_hellos"] >= 40 * 10 - 8 * 10, timeout_s=20)
        during = prefill.call("resources")
        assert during["threads"] <= before["threads"] + 8  # Limits.fetches
    finally:
        for sock in sockets:
            sock.close(0)
    time.sleep(1.0)
    after = prefill.call("resources")
    assert after["fds"] <= before["fds"] + 16, (before, after)
    assert after["remotes"] == 1
    served(prefill, decode, "after-hellos", [1, 2], [3, 4])


def test_a_receiver_refuses_a_sender_whose_key_it_does_not_allow(workers, tmp_path):
    # A rank record pointing at a rogue sender (its own key, not on the decoder's list) leads nowhere.
    rogue_keys = tmp_path / "rogue"
    key_name, secret = new_key("rogue", str(rogue_keys))
    rogue = workers("rogue", layout=LAYOUT.to_wire(), identity=secret, key_name=key_name, allowed_peers=KEYS_DIR)
    decode = workers("decode", layout=LAYOUT.to_wire())
    with pytest.raises(WorkerError, match="not in allowed_peers"):
        decode.call("connect", rogue.address)


def test_hellos_again_from_a_live_agent_cost_no_descriptors(workers):
    # A receiver that reconnects says hello again with the same NIXL agent (a new connection, the
    # same metadata). NIXL's remove_remote_agent leaves the UCX connection to a live agent open and
    # the next add_remote_agent opens another: the sender keeps the agent loaded instead.
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", prefill.address)
    served(prefill, decode, "before-rehellos", [1, 2], [3, 4])
    before = prefill.call("resources")
    for _ in range(15):  # (within the hello burst)
        decode.call("disconnect", "prefill")
        decode.call("connect", prefill.address)
    time.sleep(1.0)
    after = prefill.call("resources")
    assert after["fds"] <= before["fds"] + 4, (before, after)
    assert after["remotes"] == 1
    served(prefill, decode, "after-rehellos", [5, 6], [7, 8])
