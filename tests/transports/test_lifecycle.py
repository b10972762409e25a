"""Lifecycle: bounded memory over many requests, disconnect and replacement, close after errors."""

from __future__ import annotations

import socket
import time

import pytest

from kvpolicy.transports import BlockPool, KVLayout, RequestState, TransferError

from .conftest import requires_nixl
from .transfer_worker import WorkerError

pytestmark = requires_nixl

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)


@pytest.fixture
def lone(tmp_path):
    from kvpolicy.transports import NixlTransceiver, create_keys

    create_keys(tmp_path, "me")
    tx = NixlTransceiver(BlockPool(LAYOUT, 8, huge_pages=False), name="lone", identity=tmp_path / "me.key_secret", allowed_peers=tmp_path)
    yield tx
    tx.close()


def sizes(tx) -> dict[str, int]:
    """Everything a transceiver keeps per request, counted."""
    sender, receiver = tx._sender, tx._receiver
    return {
        "handles": len(tx._handles),
        "offers": len(sender.offers),
        "ended": len(sender.ended) + len(receiver.ended),
        "parked": len(sender.parked),
        "timers": len(tx._loop._timers),
        "fences": len(receiver.fences),
    }


def test_memory_stays_bounded_over_100000_requests(lone):
    from kvpolicy.transports.local import REMEMBERED

    for batch in range(100):
        handles = [lone.send(f"r{batch}-{i}", [i % 8], timeout_s=0.01) for i in range(1000)]
        for handle in handles:
            with pytest.raises(TransferError, match=r"timed_out: 1 receiver\(s\) did not ask in time"):
                handle.wait(10)
            assert handle.state is RequestState.TIMED_OUT
        if batch == 9:
            after_10k = sizes(lone)
    after_100k = sizes(lone)
    assert after_100k["handles"] == after_100k["offers"] == after_100k["fences"] == 0
    assert after_100k["ended"] <= REMEMBERED and after_100k["timers"] <= 1000
    assert after_100k["ended"] == after_10k["ended"]  # full at 10k already: it does not grow


def test_timers_of_requests_that_ended_early_do_not_pile_up(lone):
    """A request that ends long before its deadline leaves a cancelled timer in the heap; those are
    dropped once they are half of it, so the heap follows what is pending, not the request rate."""
    from kvpolicy.transports.loop import _COMPACT_AT

    assert 2 * _COMPACT_AT + 1 < 3000
    for i in range(3000):
        handle = lone.send(f"early-{i}", [i % 8], timeout_s=600)
        assert lone.cancel(f"early-{i}", role="sender")
        assert handle.state is RequestState.CANCELLED
    assert len(lone._loop._timers) <= 2 * _COMPACT_AT + 1


def test_close_is_idempotent_and_releases_everything_after_an_internal_error(lone):
    lone._loop.submit(lambda: lone._loop.call_at(0.0, lambda: 1 / 0)).result(5)  # a bug in a handler
    handle = lone.send("after-error", [1], timeout_s=0.2)
    with pytest.raises(TransferError, match=r"timed_out: 1 receiver\(s\) did not ask in time"):
        handle.wait(10)
    assert handle.state is RequestState.TIMED_OUT  # the service went on
    assert lone.stats["internal_errors"] == 1
    port = int(lone.address.rsplit(":", 1)[1])
    lone.close()
    lone.close()
    assert lone.registrations == 0
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", port))  # the control port was released
    finally:
        probe.close()
    with pytest.raises(RuntimeError, match="closed"):
        lone.send("after-close", [1])


def test_dead_after_a_plain_disconnect_releases_what_the_first_one_quarantined(workers):
    """Issue 38: the documented release (``disconnect(name, dead=True)`` once the process is known to
    be gone) must work after an earlier plain disconnect too; it raised a TypeError in the service
    thread (the lock wrapper took no keyword arguments) and the blocks stayed held for good."""
    doomed = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", doomed.address)
    decode.call("receive", "held", [1, 2], timeout_s=30)
    doomed.kill()
    assert decode.call("disconnect", doomed.key_name) is True  # plain: its blocks are quarantined
    assert decode.call("wait", "held", timeout=10)["state"] == "failed"
    assert decode.call("released", "held") is False
    assert decode.call("stats")["quarantined_blocks"] == 2
    assert decode.call("quarantined") == {doomed.key_name: 2}  # visible, by sender
    decode.call("disconnect", doomed.key_name, dead=True)  # no connection left: the quarantine goes
    assert decode.call("released", "held") is True
    assert decode.call("quarantined") == {}
    assert decode.call("resources")["handles"] == 0


def test_quarantine_is_bounded_per_sender_name(workers):
    """A sender name whose earlier processes keep more blocks quarantined than
    Limits.quarantined_per_peer gets no new receive, also from a new process under that name: a
    sender that never answers cannot pin more of the pool over any number of restarts."""
    from .transfer_worker import new_key

    key_name, identity = new_key("prefill")
    first = workers("prefill-first", layout=LAYOUT.to_wire(), seed=1, identity=identity, key_name=key_name)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2, limits={"quarantined_per_peer": 3})
    decode.call("connect", first.address)
    decode.call("receive", "held", [1, 2, 3, 4], timeout_s=30)
    first.kill()
    decode.call("disconnect", key_name)  # plain: 4 blocks quarantined, over the bound of 3
    assert decode.call("quarantined") == {key_name: 4}
    second = workers("prefill-second", layout=LAYOUT.to_wire(), seed=3, identity=identity, key_name=key_name)
    assert decode.call("connect", second.address) == key_name  # another process: the quarantine stays
    with pytest.raises(WorkerError, match="keeps 4 blocks quarantined"):
        decode.call("receive", "refused", [9], peers=[key_name])
    decode.call("disconnect", key_name, dead=True)  # the first process is known dead: released
    assert decode.call("quarantined") == {}
    decode.call("connect", second.address)
    second.call("send", "served", [5], to=decode.key_name)
    decode.call("receive", "served", [9], peers=[key_name])
    assert decode.call("wait", "served")["state"] == "completed"


def test_disconnect_removes_a_dead_sender_so_its_replacement_serves(workers):
    doomed = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    decode.call("connect", doomed.address)
    decode.call("receive", "lost", [1, 2], timeout_s=30)
    doomed.kill()
    replacement = workers("prefill", layout=LAYOUT.to_wire(), seed=3)
    # Another process with its own key: named by that key, beside the dead one (never in its place).
    assert decode.call("connect", replacement.address) == replacement.key_name != doomed.key_name
    with pytest.raises(WorkerError, match="overlap|more than once|twice|cover"):
        decode.call("receive", "ambiguous", [3, 4])  # two senders hold the same layers and heads
    # The caller knows the process is dead (it was killed): what it held is released at once.
    assert decode.call("disconnect", doomed.key_name, dead=True) is True
    outcome = decode.call("wait", "lost", timeout=10)
    assert outcome["state"] == "failed" and "disconnected" in outcome["reason"]  # at once, not at its timeout
    assert decode.call("released", "lost") is True
    replacement.call("send", "fresh", [5, 6], to=decode.key_name)
    decode.call("receive", "fresh", [1, 2])
    assert decode.call("wait", "fresh")["state"] == "completed"
    assert decode.call("digests", [1, 2]) == replacement.call("digests", [5, 6])
    assert decode.call("resources")["handles"] == 0


def test_a_connect_for_another_key_at_a_live_endpoint_never_ends_the_session(workers):
    """Issue 38, item 4: a record naming the honest prefill's host:port with another (allowed) key made
    the decoder close its live session there, failing the request in flight. Connections are keyed by
    (endpoint, key): such a connect is refused, naming both, and the live session goes on."""
    from kvpolicy.transports.addresses import address_with_key, split_address

    honest = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    rogue = workers("prefill", layout=LAYOUT.to_wire(), seed=9)
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2)
    assert decode.call("connect", honest.address) == honest.key_name
    decode.call("receive", "in-flight", [1, 2], timeout_s=30)
    endpoint, _ = split_address(honest.address)
    squatted = address_with_key(endpoint, rogue.call("public_key").encode())
    with pytest.raises(WorkerError, match=f"has a live session with the sender {honest.key_name!r}"):
        decode.call("connect", squatted)
    honest.call("send", "in-flight", [5, 6], to=decode.key_name)
    assert decode.call("wait", "in-flight")["state"] == "completed"
    assert decode.call("digests", [1, 2]) == honest.call("digests", [5, 6])


def test_a_busy_sender_answers_a_hello_with_a_retry_hint_instead_of_silence(workers):
    """Issue 38, item 6: when the sender's metadata probes are full, a receiver's first connect fails at
    once with why and when to retry (a `refused` frame), not at its connect timeout; the retry works."""
    import threading

    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1, probe=(1, 0, 1))  # one probe at a time
    first = workers("decode-a", layout=LAYOUT.to_wire(), seed=2, timeout_s=30.0)
    second = workers("decode-b", layout=LAYOUT.to_wire(), seed=3, timeout_s=30.0)
    outcomes: dict[str, object] = {}

    def connect(worker, label):
        started = time.monotonic()
        try:
            outcomes[label] = (worker.call("connect", prefill.address), time.monotonic() - started)
        except WorkerError as exc:
            outcomes[label] = (str(exc), time.monotonic() - started)

    threads = [threading.Thread(target=connect, args=(w, label)) for w, label in ((first, "a"), (second, "b"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    refused = [(text, took) for text, took in outcomes.values() if "is busy" in str(text)]
    welcomed = [text for text, _ in outcomes.values() if "is busy" not in str(text)]
    assert len(refused) == 1 and len(welcomed) == 1, outcomes
    text, took = refused[0]
    assert "ConnectionRefusedError" in text and "retry in about 500 ms" in text
    assert took < 10.0  # at once, not at the 30 s connect timeout
    late = first if outcomes["a"][0] is text else second
    time.sleep(0.5)
    assert late.call("connect", prefill.address) == prefill.key_name  # the retry is welcomed


def test_ranks_sharing_one_key_connect_at_once(workers):
    """Ranks that share one key (up to ``remotes_per_peer``, 4, the connections a key keeps) connect to
    a new sender at the same moment: each is proved and welcomed, and each is served. Before, the
    sender kept one metadata probe per key and a newer hello of the key ended the one before it: 3 of
    4 such connects timed out with no welcome, and none of them was told why."""
    import threading

    from .transfer_worker import new_key

    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1)
    shared, secret = new_key("ranks")
    ranks = [workers(f"rank-{i}", identity=secret, key_name=shared, layout=LAYOUT.to_wire(), seed=2 + i, timeout_s=20.0) for i in range(4)]
    outcomes: list[object] = [None] * len(ranks)

    def connect(i: int) -> None:
        try:
            outcomes[i] = ranks[i].call("connect", prefill.address, timeout=60)
        except WorkerError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=connect, args=(i,)) for i in range(len(ranks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert outcomes == [prefill.key_name] * len(ranks), outcomes
    stats = prefill.call("stats")
    assert stats["refused_proofs"] == 0 and stats["proofs_asked"] == len(ranks), stats
    for i, rank in enumerate(ranks):
        prefill.call("send", f"to-{i}", [i + 1], to=shared)
        rank.call("receive", f"to-{i}", [9])
        assert rank.call("wait", f"to-{i}")["state"] == "completed"
        assert rank.call("digests", [9]) == prefill.call("digests", [i + 1])


def test_a_hello_over_its_keys_rate_is_told_to_retry_instead_of_timing_out(workers):
    """A key's hellos are limited per second (``hellos_per_s``, ``hello_burst``): one more is answered
    busy with a retry hint, so the connect fails at once and says why (it used to be dropped in
    silence, and the connect waited for its timeout, blaming the allow-list); after a pause the
    key connects again."""
    prefill = workers("prefill", layout=LAYOUT.to_wire(), seed=1, limits={"hellos_per_s": 0.5, "hello_burst": 2})
    decode = workers("decode", layout=LAYOUT.to_wire(), seed=2, timeout_s=30.0)
    for _ in range(2):  # the burst
        assert decode.call("connect", prefill.address) == prefill.key_name
        decode.call("disconnect", prefill.key_name)
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"ConnectionRefusedError: .* is busy \(busy: too many hellos of this key .*retry in about 500 ms"):
        decode.call("connect", prefill.address)
    assert time.monotonic() - started < 10.0  # at once, not at the 30 s connect timeout
    time.sleep(2.2)  # a token again (0.5 per second)
    assert decode.call("connect", prefill.address) == prefill.key_name
