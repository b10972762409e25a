"""Control messages: round trips, and everything off-schema is refused."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpolicy.transports import ControlMessageError, KVLayout, control

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=4, head_dim=8)
RANK = control.RankInfo("decode", "agent-1", b"\x00meta", LAYOUT, 1 << 40, 64, "DRAM", 0)


@pytest.mark.parametrize(
    "message",
    [
        control.Hello(RANK),
        control.Welcome(RANK),
        control.Request("r1", 9, (3, 1, 2), 1, 30_000),
        control.Cancel("r1", 9),
        control.Cancel("r1", 0),
        control.Cancel("r1", 9, 0),
        control.Proof("0123456789abcdef" * 2),
        control.Challenge(control.nonce_digest("0123456789abcdef" * 2)),
        control.Refused("busy: 4 metadata probes running and 16 waiting", 500),
        control.Result("r1", 9, "ok", "", 4096, 64, 1, 12, 34),
        control.Result("r1", 9, "error", "boom"),
        control.Result("r1", 9, "aborted", "deadline"),
        control.Offer("r1", 5, (4, 2), 30_000),
        control.Offer("r1", 5, (), 1),
        control.Release("r1", 5, "ok", "", 4096, 12),
        control.Release("r1", 5, "declined", "no receive took it in time"),
    ],
)
def test_round_trip(message):
    assert control.decode(control.encode(message)) == message


_field_values = st.one_of(
    st.integers(-2, 2**40), st.text(max_size=5), st.binary(max_size=5), st.lists(st.integers(-1, 9), max_size=3),
    st.booleans(), st.none(), st.dictionaries(st.text(max_size=4), st.integers(-(2**63), 2**64 - 1), max_size=2),
)
_near_frames = st.builds(
    lambda version, kind, fields: msgpack.packb([version, kind, *fields], use_bin_type=True),
    st.sampled_from([control.PROTOCOL_VERSION, control.PROTOCOL_VERSION, 3, True, 4.0]),
    st.sampled_from(["hello", "welcome", "request", "cancel", "result", "offer", "release", "nope"]),
    st.lists(_field_values, max_size=10),
)


# Generating near-valid frames is slow on a loaded 2-core machine: that is no failure of the decoder.
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], deadline=None)
@given(st.one_of(st.binary(max_size=200), _near_frames))
def test_arbitrary_bytes_never_crash_the_decoder(frame):
    """Garbage either decodes to a message that encodes back to an equal one, or is refused with
    ControlMessageError; any other exception fails the test."""
    try:
        message = control.decode(frame)
    except ControlMessageError as exc:
        assert str(exc), "a refusal says why"
        return
    assert control.decode(control.encode(message)) == message


def _frame(kind, *fields):
    return msgpack.packb([control.PROTOCOL_VERSION, kind, *fields], use_bin_type=True)


def _result(**fields):
    base = dict(request_id="x", nonce=1, status="ok", reason="", nbytes=0, descriptors_before=0, descriptors=0, queue_us=0, transfer_us=0)
    return _frame("result", *{**base, **fields}.values())


def _request(**fields):
    return _frame("request", *{**dict(request_id="x", nonce=1, blocks=[1], skip_blocks=0, timeout_ms=10), **fields}.values())


def _offer(**fields):
    return _frame("offer", *{**dict(request_id="x", token=1, blocks=[1], timeout_ms=10), **fields}.values())


def _release(**fields):
    return _frame("release", *{**dict(request_id="x", token=1, status="ok", reason="", nbytes=0, transfer_us=0), **fields}.values())


def _hello(**rank):
    return _frame("hello", {**RANK.to_wire(), **rank})


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"\xc1", "not a msgpack"),
        (msgpack.packb({"x": 1}), "not a message"),
        (msgpack.packb([1]), "not a message"),
        (msgpack.packb([1, 2]), "version"),
        (msgpack.packb([True, "cancel", "x", 0]), "version"),
        (msgpack.packb({"v": 3, "kind": "cancel", "request_id": "x", "nonce": 0}), "version 3"),
        (_frame("launch"), "unknown message kind"),
        (_frame(["cancel"]), "unknown message kind"),
        (_frame("cancel"), r"expected 3 fields \(request_id, nonce, final\), got 0"),
        (_frame("cancel", "x", 0, 1, 1), "expected 3 fields"),
        (_frame("cancel", 7, 0, 1), "request_id"),
        (_frame("cancel", "", 0, 1), "request_id"),
        (_frame("cancel", "x" * 300, 0, 1), "request_id"),
        (_frame("cancel", "x", True, 1), "nonce"),
        (_request(blocks=[1, -2]), "blocks"),
        (_request(blocks=[True]), "blocks"),
        (_request(blocks=[2**62]), "blocks"),
        (_request(timeout_ms=0), "timeout_ms"),
        (_request(timeout_ms=control.MAX_TIMEOUT_MS + 1), "timeout_ms"),
        (_request(skip_blocks=2**62), "skip_blocks"),
        (_request(nonce=0), "nonce"),
        (_request(nonce=2**63), "nonce"),
        (_result(status="maybe"), "status"),
        (_result(nbytes=-1), "nbytes"),
        (_result(transfer_us=2**60), "transfer_us"),
        (_result(reason="x" * 5000), "reason"),
        (_offer(token=0), "token"),
        (_offer(token=2**60), "token"),
        (_offer(blocks=[1, -1]), "blocks"),
        (_offer(blocks=[False]), "blocks"),
        (_offer(blocks=[2**30]), "blocks"),
        (_offer(timeout_ms=0), "timeout_ms"),
        (_offer(timeout_ms=2**40), "timeout_ms"),
        (_frame("cancel", "x", 1, 2), "final"),
        (_frame("proof", 0), "nonce"),
        (_frame("proof", "x"), "nonce"),
        (_frame("challenge", "A" * 32), "digest"),
        (_frame("challenge", "0" * 64), "digest"),
        (_frame("challenge", b"0" * 32), "digest"),
        (_frame("offer", "x", 1, [1]), "expected 4 fields"),
        (_release(status="written"), "status"),
        (_release(status="aborted"), "status"),  # a result's status, not a release's
        (_release(nbytes=-5), "nbytes"),
        (_release(transfer_us=2**60), "transfer_us"),
        (_release(reason="x" * 5000), "reason"),
        (_release(token=0), "token"),
        (_hello(**{"memory_type": "DISK"}), "memory_type"),
        (_hello(**{"layout": {"num_layers": 1}}), "layout"),
        (_hello(**{"num_blocks": 2**64 - 1}), "num_blocks"),
        (_hello(**{"num_blocks": 0}), "num_blocks"),
        (_hello(**{"base_address": 2**64 - 4096}), "address space"),
        (_hello(**{"base_address": 0}), "address space"),
        (_hello(**{"metadata": b"x" * (2 << 20)}), "metadata"),
        (_hello(**{"agent": ""}), "agent"),
        (_hello(**{"layout": {**LAYOUT.to_wire(), "head_dim": 1 << 40}}), "layout"),
    ],
)
def test_off_schema_frames_are_refused(frame, match):
    with pytest.raises(ControlMessageError, match=match):
        control.decode(frame)


_GOOD_REQUEST = [control.PROTOCOL_VERSION, "request", "r1", 9, [3, 1], 0, 30_000]
_GOOD_RESULT = [control.PROTOCOL_VERSION, "result", "r1", 9, "ok", "", 1, 1, 1, 1, 1]
_BAD_VALUES = [True, -1, 0, 1 << 53, 1 << 24, 1.5, "x", "", "z" * 300, b"r", None, [1], [True], [-1], [1 << 24], [1.0], "nope", {"a": 1}]


@pytest.mark.parametrize("good", [_GOOD_REQUEST, _GOOD_RESULT], ids=["request", "result"])
def test_the_fast_checks_of_requests_and_results_refuse_what_the_full_check_refuses(good):
    """Requests and results take a one-expression check; every field, set to each off-schema value,
    is refused exactly as the full field-by-field check refuses it, and so are a field too many or
    too few; what the fast check accepts, the full check decodes to the same message."""
    fast = control._request_fast if good[1] == "request" else control._result_fast
    assert fast(list(good)) == control._check_body(list(good))
    for index in range(2, len(good)):
        for value in _BAD_VALUES:
            body = [*good[:index], value, *good[index + 1 :]]
            frame = msgpack.packb(body, use_bin_type=True)
            batch = control.batch([msgpack.packb(good, use_bin_type=True), frame])  # batches take the fast check too
            try:
                expected = control.decode(frame)
            except ControlMessageError:
                assert fast(body) is None, (index, value)
                with pytest.raises(ControlMessageError):
                    control.decode_many(frame)
                with pytest.raises(ControlMessageError, match=r"batch\[1\]"):
                    control.decode_many(batch)
            else:
                assert fast(body) in (None, expected), (index, value)
                assert control.decode_many(frame) == [expected]
                assert control.decode_many(batch)[1] == expected
    for body in ([*good, 1], good[:-1]):
        assert fast(body) is None
        with pytest.raises(ControlMessageError, match="fields"):
            control.decode_many(msgpack.packb(body, use_bin_type=True))
