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
        control.Request("r1", 9, (3, 1, 2), 1, 1_700_000_000_000),
        control.Cancel("r1", 9),
        control.Cancel("r1", 0),
        control.Result("r1", 9, "ok", "", 4096, 64, 1, 12, 34),
        control.Result("r1", 9, "error", "boom"),
        control.Result("r1", 9, "aborted", "deadline"),
    ],
)
def test_round_trip(message):
    assert control.decode(control.encode(message)) == message


_near_frames = st.builds(
    lambda kind, fields: msgpack.packb({"v": 1, "kind": kind, **fields}, use_bin_type=True),
    st.sampled_from(["hello", "welcome", "request", "cancel", "result", "nope"]),
    st.dictionaries(
        st.sampled_from(["id", "rank", "blocks", "status", "error", "deadline_ms", "x"]),
        st.one_of(st.integers(-2, 2**40), st.text(max_size=5), st.binary(max_size=5), st.lists(st.integers(-1, 9), max_size=3)),
        max_size=5,
    ),
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


def _frame(**fields):
    return msgpack.packb({"v": 3, **fields}, use_bin_type=True)


def _result(**fields):
    base = dict(kind="result", request_id="x", nonce=1, status="ok", reason="", nbytes=0, descriptors_before=0,
                descriptors=0, queue_us=0, transfer_us=0)
    return _frame(**{**base, **fields})


def _request(**fields):
    return _frame(**{**dict(kind="request", request_id="x", nonce=1, blocks=[1], skip_blocks=0, deadline_ms=10), **fields})


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"\xc1", "not a msgpack"),
        (msgpack.packb([1, 2]), "not a map"),
        (msgpack.packb({"v": 1, "kind": "cancel", "request_id": "x", "nonce": 0}), "version"),
        (_frame(kind="launch"), "unknown message kind"),
        (_frame(kind="cancel"), "missing fields"),
        (_frame(kind="cancel", request_id="x", nonce=0, extra=1), "unexpected fields"),
        (_frame(kind="cancel", request_id=7, nonce=0), "request_id"),
        (_frame(kind="cancel", request_id="", nonce=0), "request_id"),
        (_frame(kind="cancel", request_id="x" * 300, nonce=0), "request_id"),
        (_request(blocks=[1, -2]), "blocks"),
        (_request(blocks=[True]), "blocks"),
        (_request(blocks=[2**62]), "blocks"),
        (_request(deadline_ms=0), "deadline_ms"),
        (_request(skip_blocks=2**62), "skip_blocks"),
        (_request(nonce=0), "nonce"),
        (_request(nonce=2**63), "nonce"),
        (_result(status="maybe"), "status"),
        (_result(nbytes=-1), "nbytes"),
        (_result(transfer_us=2**60), "transfer_us"),
        (_result(reason="x" * 5000), "reason"),
        (_frame(kind="hello", rank={**RANK.to_wire(), "memory_type": "DISK"}), "memory_type"),
        (_frame(kind="hello", rank={**RANK.to_wire(), "layout": {"num_layers": 1}}), "layout"),
        (_frame(kind="hello", rank={**RANK.to_wire(), "num_blocks": 2**64 - 1}), "num_blocks"),
        (_frame(kind="hello", rank={**RANK.to_wire(), "num_blocks": 0}), "num_blocks"),
        (_frame(kind="hello", rank={**RANK.to_wire(), "base_address": 2**64 - 4096}), "address space"),
        (_frame(kind="hello", rank={**RANK.to_wire(), "base_address": 0}), "address space"),
        (_frame(kind="hello", rank={**RANK.to_wire(), "metadata": b"x" * (2 << 20)}), "metadata"),
        (_frame(kind="hello", rank={**RANK.to_wire(), "agent": ""}), "agent"),
        (_frame(kind="hello", rank={**RANK.to_wire(), "layout": {**LAYOUT.to_wire(), "head_dim": 1 << 40}}), "layout"),
    ],
)
def test_off_schema_frames_are_refused(frame, match):
    with pytest.raises(ControlMessageError, match=match):
        control.decode(frame)


_GOOD_REQUEST = {"v": control.PROTOCOL_VERSION, "kind": "request", "request_id": "r1", "nonce": 9, "blocks": [3, 1], "skip_blocks": 0, "deadline_ms": 10**12}
_GOOD_RESULT = {"v": control.PROTOCOL_VERSION, "kind": "result", "request_id": "r1", "nonce": 9, "status": "ok", "reason": "",
                "nbytes": 1, "descriptors_before": 1, "descriptors": 1, "queue_us": 1, "transfer_us": 1}
_BAD_VALUES = [True, -1, 0, 1 << 53, 1 << 24, 1.5, "x", "", "z" * 300, b"r", None, [1], [True], [-1], [1 << 24], [1.0], "nope"]


@pytest.mark.parametrize("good", [_GOOD_REQUEST, _GOOD_RESULT], ids=["request", "result"])
def test_the_fast_checks_of_requests_and_results_refuse_what_the_full_check_refuses(good):
    """Requests and results take a one-expression check; every field, set to each off-schema value,
    is refused exactly as the full field-by-field check refuses it, and an extra field too."""
    fast = control._request_fast if good["kind"] == "request" else control._result_fast
    assert fast(dict(good)) is not None
    for key in [k for k in good if k not in ("v", "kind")]:
        for value in _BAD_VALUES:
            body = {**good, key: value}
            try:
                expected = control.decode(msgpack.packb(body, use_bin_type=True))
            except ControlMessageError:
                assert fast(body) is None, (key, value)
                with pytest.raises(ControlMessageError):
                    control.decode_many(msgpack.packb(body, use_bin_type=True))
            else:
                assert fast(body) in (None, expected), (key, value)
    assert fast({**good, "extra": 1}) is None
    with pytest.raises(ControlMessageError, match="unexpected fields"):
        control.decode(msgpack.packb({**good, "extra": 1}, use_bin_type=True))
