"""Fuzz: mutated hellos and frames, from an allowed peer that never got a welcome and from an
admitted receiver, against a live sender for a fixed example budget. The sender never crashes, never
counts an internal error, and still serves its real receiver bit for bit afterwards."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpolicy.transports import KVLayout, control

from tests.support.transfer import eventually

from .attackers import allowed_dealer
from .conftest import requires_nixl

pytestmark = requires_nixl

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)
EXAMPLES = 150

_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.text(max_size=40),
    st.binary(max_size=64),
    st.lists(st.integers(min_value=-(2**63), max_value=2**64 - 1), max_size=8),
    st.none(),
    st.booleans(),
    st.dictionaries(st.text(max_size=12), st.integers(min_value=-(2**63), max_value=2**64 - 1), max_size=4),
)
_rank_fields = sorted({"name", "agent", "metadata", "layout", "base_address", "num_blocks", "memory_type", "device_id", "x"})


def _templates(agent: str) -> list[bytes]:
    name = b"someone-else"
    metadata = b"nixlSerDes|Agent" + len(name).to_bytes(8, "little") + name + b"\x00" * 32
    rank = control.RankInfo("fuzz", agent, metadata, LAYOUT, 1 << 30, 64, "DRAM", 0)
    deadline = 60_000  # timeout_ms: counted by the sender from when it reads the frame
    return [
        control.encode(control.Hello(rank)),
        control.encode(control.Welcome(rank)),
        control.encode(control.Request("victim", 5, (1, 2), 0, deadline)),
        control.encode(control.Cancel("victim", 0)),
        control.encode(control.Result("victim", 5, "ok", "", 1 << 20)),
    ]


def _mutate(template: bytes, data: st.DataObject) -> bytes:
    how = data.draw(st.sampled_from(["flip", "truncate", "fields", "splice"]))
    frame = bytearray(template)
    if how == "flip":
        for position in data.draw(st.lists(st.integers(0, len(frame) - 1), min_size=1, max_size=6)):
            frame[position] ^= data.draw(st.integers(1, 255))
        return bytes(frame)
    if how == "truncate":
        return bytes(frame[: data.draw(st.integers(0, len(frame) - 1))])
    if how == "splice":
        return bytes(frame) + data.draw(st.binary(max_size=32))
    # A message is [version, kind, field, ...]: replace fields (the version and kind too), add one,
    # or change a key of a hello's rank map.
    body = msgpack.unpackb(template, raw=False)
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.integers(0, len(body)))
        value = data.draw(_values)
        if where == len(body):
            body.append(value)
        elif isinstance(body[where], dict) and data.draw(st.booleans()):
            body[where][data.draw(st.sampled_from(_rank_fields))] = value
        else:
            body[where] = value
    return msgpack.packb(body, use_bin_type=True)


@pytest.fixture(scope="module")
def live():
    from .transfer_worker import Worker

    prefill = Worker("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = Worker("decode", layout=LAYOUT.to_wire(), seed=2)
    insider = Worker("insider", layout=LAYOUT.to_wire(), seed=3)
    try:
        decode.call("connect", prefill.address)
        insider.call("connect", prefill.address)
        yield prefill, decode, insider
    finally:
        for worker in (insider, decode, prefill):
            worker.stop()


def test_mutated_frames_never_stop_the_sender(live):
    prefill, decode, insider = live
    stranger, agent = allowed_dealer(prefill.address, "fuzzer")
    templates = _templates(agent)
    prefill.call("send", "victim", [1, 2], to=decode.key_name, timeout_s=120)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def feed(data):
        frames = [_mutate(data.draw(st.sampled_from(templates)), data) for _ in range(data.draw(st.integers(1, 4)))]
        for frame in frames:
            stranger.send(frame)
        insider.call("raw", "prefill", frames)

    try:
        feed()
    finally:
        stranger.close(0)
    eventually(lambda: sum(prefill.call("stats").values()) >= EXAMPLES, timeout_s=30)
    assert prefill.process.is_alive()
    stats = prefill.call("stats")
    assert stats["internal_errors"] == 0, stats
    assert prefill.call("state", "victim") == "waiting"  # nobody else took or ended it
    decode.call("receive", "victim", [30, 31], peers=["prefill"])
    assert decode.call("wait", "victim")["state"] == "completed"
    assert decode.call("digests", [30, 31]) == prefill.call("digests", [1, 2])
