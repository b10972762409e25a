"""Faults end one request in an error within its timeout; the transceiver keeps serving the others."""

from __future__ import annotations

import msgpack
import pytest

from kvpolicy.transports import KVLayout, control

from tests.support.transfer import FakeSender, eventually

from .conftest import requires_nixl

pytestmark = requires_nixl

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)
SHORT = 2.0  # seconds: the timeout of requests that are meant to fail


@pytest.fixture
def fake_sender():
    fake = FakeSender()
    yield fake
    fake.close()


def serve_ok(prefill, decode, request_id, src, dst, **options):
    """A healthy request next to the faulty ones: it must still complete, bit for bit."""
    prefill.call("send", request_id, src)
    decode.call("receive", request_id, dst, **options)
    outcome = decode.call("wait", request_id)
    assert outcome["state"] == "completed", outcome
    assert decode.call("digests", dst) == prefill.call("digests", src)


def test_sender_killed_mid_stream_fails_only_its_requests(workers):
    doomed = workers("doomed", layout=LAYOUT.to_wire(), seed=1)
    healthy = workers("healthy", layout=LAYOUT.to_wire(), seed=2)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=3)
    decode.call("connect", doomed.address)
    decode.call("connect", healthy.address)
    serve_ok(doomed, decode, "before-kill", [0, 1], [0, 1], peers=["doomed"])
    # The stream goes on: the decode side has asked for more, the sender dies before serving it.
    for i in range(3):
        decode.call("receive", f"lost-{i}", [10 + i], peers=["doomed"], timeout_s=SHORT)
    doomed.kill()
    serve_ok(healthy, decode, "after-kill", [5, 6, 7], [20, 21, 22], peers=["healthy"])
    for i in range(3):
        outcome = decode.call("wait", f"lost-{i}")
        assert outcome["state"] == "timed_out", outcome
        assert "no result frame" in outcome["reason"]
    serve_ok(healthy, decode, "after-timeouts", [8], [30], peers=["healthy"])
    assert decode.call("stats")["registrations"] == 1


def test_receiver_that_never_asks_times_out_the_offer(workers):
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", prefill.address)
    prefill.call("send", "orphan", [3, 4], timeout_s=SHORT)
    serve_ok(prefill, decode, "served", [1], [1])
    outcome = prefill.call("wait", "orphan")
    assert outcome["state"] == "timed_out"
    assert "did not ask" in outcome["reason"]
    # A receiver asking after the offer ended gets an error, not a hang.
    decode.call("receive", "orphan", [5, 6])
    late = decode.call("wait", "orphan")
    assert late["state"] == "failed" and "timed_out" in late["reason"]
    assert prefill.call("stats")["registrations"] == 1


def test_result_frame_that_never_comes(workers, fake_sender):
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", prefill.address)
    fake_sender.accept(decode)
    decode.call("receive", "silent", [7, 8], peers=["fake"], timeout_s=SHORT)
    request = fake_sender.recv()
    assert isinstance(request, control.Request) and request.blocks == (7, 8)
    serve_ok(prefill, decode, "beside-silent", [2, 3], [2, 3], peers=["prefill"])
    outcome = decode.call("wait", "silent")
    assert outcome["state"] == "timed_out"
    # The receiver told the silent sender to stop.
    assert isinstance(fake_sender.recv(), control.Cancel)


def test_malformed_and_foreign_frames_are_dropped_and_counted(workers, fake_sender):
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", prefill.address)

    # An allowed key that never says hello (a stranger without a key does not get this far).
    from .attackers import allowed_dealer

    foreign, _ = allowed_dealer(prefill.address)
    try:
        foreign.send(b"\xc1 not msgpack")
        foreign.send(msgpack.packb([control.PROTOCOL_VERSION, "request", 5]))  # wrong schema
        foreign.send(msgpack.packb([99, "cancel", "x", 0]))  # wrong version
        foreign.send(msgpack.packb({"v": 3, "kind": "cancel", "request_id": "x", "nonce": 0}))  # an older release's map
        # well-formed, but from a peer that never said hello: must not start a write
        foreign.send(control.encode(control.Request("foreign", 7, (0, 1), 0, 30_000)))
        foreign.send(control.encode(control.Cancel("served", 0)))
        serve_ok(prefill, decode, "served", [1, 2], [1, 2])

        def counters():
            return {k: v for k, v in prefill.call("stats").items() if k.startswith("dropped")}

        # Counted before the socket closes: the frames wait in it until its CURVE handshake is done,
        # and a close with LINGER 0 would drop any still waiting (on a loaded machine the handshake
        # may take longer than serving one request).
        eventually(lambda: prefill.call("stats")["dropped_malformed"] == 4, seen=counters)
        eventually(lambda: prefill.call("stats")["dropped_unknown_peer"] == 2, seen=counters)
    finally:
        foreign.close(0)

    # Toward the receiver: a result for a request it never made, garbage, a wrong-kind frame.
    fake_sender.accept(decode)
    fake_sender.send(control.encode(control.Result("never-made", 5, "ok", "", 1 << 30)))
    fake_sender.send(b"\x00garbage")
    fake_sender.send(control.encode(control.Request("wrong-way", 5, (0,), 0, 30_000)))
    serve_ok(prefill, decode, "still-served", [3], [3], peers=["prefill"])
    eventually(lambda: decode.call("stats")["dropped_unknown_request"] == 1)
    eventually(lambda: decode.call("stats")["dropped_malformed"] == 1)
    eventually(lambda: decode.call("stats")["dropped_unexpected"] == 1)
    assert prefill.call("stats")["registrations"] == decode.call("stats")["registrations"] == 1


def test_cancel_from_either_side(workers):
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", prefill.address)

    # Sender cancels an offer nobody asked for yet: immediate, pages released.
    prefill.call("send", "sender-cancel", [1, 2])
    assert prefill.call("cancel", "sender-cancel") is True
    assert prefill.call("wait", "sender-cancel")["state"] == "cancelled"
    decode.call("receive", "sender-cancel", [1, 2])
    assert decode.call("wait", "sender-cancel")["state"] == "cancelled"

    # Receiver cancels a request it has sent: the sender may be writing, so the answer is False and
    # the request ends (cancelled) when the sender confirms.
    decode.call("receive", "receiver-cancel", [3])
    decode.call("state", "receiver-cancel")
    assert decode.call("cancel", "receiver-cancel") is False
    assert decode.call("wait", "receiver-cancel", timeout=10)["state"] == "cancelled"
    assert decode.call("cancel", "receiver-cancel") is False  # already ended

    serve_ok(prefill, decode, "after-cancels", [4], [4])
