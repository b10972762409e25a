"""Checks of the transfer layer that mutation testing (``make mutate``) found unchecked.

tests/mutation/survivors.md names the mutants each test kills.
"""

from __future__ import annotations

from conftest import requires_nixl
from test_faults import eventually

from kvpolicy.transports import KVLayout, control

pytestmark = requires_nixl

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)


def test_a_receiver_that_gives_up_before_asking_ends_the_senders_offer_as_cancelled(workers):
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", prefill.address)
    prefill.call("send", "given-up", [1, 2], to=decode.key_name)
    # The receiver's final cancel, on its own authenticated connection, before any ask: the offer
    # was for it alone, so nothing more is expected and the blocks can go back at once.
    decode.call("raw", "prefill", [control.encode(control.Cancel("given-up", 0, 1))])
    outcome = prefill.call("wait", "given-up", timeout=10)
    assert (outcome["state"], outcome["reason"]) == ("cancelled", "cancelled by the receiver"), outcome


def test_an_attempt_that_ended_leaves_the_offer_for_a_retry(workers):
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", prefill.address)
    prefill.call("send", "retried", [1, 2], to=decode.key_name)
    before = prefill.call("stats")["late_frames"]
    decode.call("raw", "prefill", [control.encode(control.Cancel("retried", 7, 0))])  # not final
    eventually(lambda: prefill.call("stats")["late_frames"] == before + 1)
    assert prefill.call("state", "retried") == "waiting"
    decode.call("receive", "retried", [5, 6], peers=["prefill"])
    assert decode.call("wait", "retried")["state"] == "completed"
    assert decode.call("digests", [5, 6]) == prefill.call("digests", [1, 2])
