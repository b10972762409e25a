"""Control messages: round trips, and everything off-schema is refused."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpolicy.transports import ControlMessageError, KVLayout, control

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=4, head_dim=8)
RANK = control.RankInfo("decode", "agent-1", b"\x00meta", LAYOUT, 1 << 40, 64, "DRAM", 0)


@pytest.mark.parametrize(
    "message",
    [
        control.Hello(RANK),
        control.Welcome(RANK),
        control.Request("r1", (3, 1, 2), 1, 5000),
        control.Cancel("r1"),
        control.Result("r1", "ok", "", 4096, 64, 1, 12, 34),
        control.Result("r1", "error", "boom"),
    ],
)
def test_round_trip(message):
    assert control.decode(control.encode(message)) == message


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash_the_decoder(frame):
    try:
        control.decode(frame)
    except ControlMessageError:
        pass


def _frame(**fields):
    return msgpack.packb({"v": 1, **fields}, use_bin_type=True)


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"\xc1", "not a msgpack"),
        (msgpack.packb([1, 2]), "not a map"),
        (msgpack.packb({"v": 2, "kind": "cancel", "request_id": "x"}), "version"),
        (_frame(kind="launch"), "unknown message kind"),
        (_frame(kind="cancel"), "missing fields"),
        (_frame(kind="cancel", request_id="x", extra=1), "unexpected fields"),
        (_frame(kind="cancel", request_id=7), "request_id"),
        (_frame(kind="request", request_id="x", blocks=[1, -2], skip_blocks=0, timeout_ms=10), "non-negative"),
        (_frame(kind="request", request_id="x", blocks=[True], skip_blocks=0, timeout_ms=10), "non-negative"),
        (_frame(kind="request", request_id="x", blocks=[1], skip_blocks=0, timeout_ms=0), "timeout_ms"),
        (
            _frame(kind="result", request_id="x", status="maybe", reason="", nbytes=0, descriptors_before=0,
                   descriptors=0, queue_us=0, transfer_us=0),
            "status",
        ),
        (_frame(kind="hello", rank={**RANK.to_wire(), "memory_type": "DISK"}), "memory_type"),
        (_frame(kind="hello", rank={**RANK.to_wire(), "layout": {"num_layers": 1}}), "layout"),
    ],
)
def test_off_schema_frames_are_refused(frame, match):
    with pytest.raises(ControlMessageError, match=match):
        control.decode(frame)
