"""Checks of the transfer layer that mutation testing (``make mutate``) found unchecked.

tests/mutation/survivors.md names the mutants each test kills.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from kvpolicy.transports import KVLayout, TransferError, control
from kvpolicy.transports.addresses import split_address

from tests.support.transfer import FakeSender, eventually, fake_rank

from .attackers import allowed_dealer
from .conftest import requires_nixl
from .transfer_worker import KEYS_DIR, fill_pattern, new_key

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


# -- in-process sides: the checking functions of peers.py, sender.py and receiver.py driven with real
# transceivers (real NIXL agents, real CURVE sockets) in this process, so that a test can look at a
# role's state on its own service thread between two frames.

IN_PROCESS_TIMEOUT_S = 20.0


@pytest.fixture
def sides():
    """Make in-process transceivers on the tests' allow-list (KEYS_DIR); all closed at teardown.
    ``key``: a (key name, secret file) pair from :func:`transfer_worker.new_key` to share one key
    between several transceivers (each has its own NIXL agent)."""
    from kvpolicy.transports import BlockPool, Limits, NixlTransceiver

    made = []

    def make(name, *, key=None, limits=None, allow_reads=False, seed=0):
        key_name, secret = key or new_key(name)
        pool = BlockPool(LAYOUT, 16, huge_pages=False)
        fill_pattern(pool, seed)
        tx = NixlTransceiver(
            pool, name=name, identity=secret, allowed_peers=KEYS_DIR, timeout_s=IN_PROCESS_TIMEOUT_S,
            limits=Limits(**limits) if limits else None, allow_reads=allow_reads,
            allow_roleless_peers=True,  # (the raw sockets these tests drive stand for other processes)
        )
        tx.key_name = key_name
        made.append(tx)
        return tx

    yield make
    for tx in reversed(made):
        tx.close()


def on_loop(tx, fn):
    """Run ``fn`` on ``tx``'s service thread (where every role runs) and return its result."""
    return tx._loop.submit(fn).result(10)


def stats_change(tx, fn):
    """Run ``fn`` on ``tx``'s service thread; the counters it changed, by how much."""

    def run():
        before = dict(tx.stats)
        fn()
        return {k: v - before.get(k, 0) for k, v in tx.stats.items() if v != before.get(k, 0)}

    return on_loop(tx, run)


def raw(tx, peer, *messages):
    """Send control messages as they are, one frame each, on ``tx``'s connection to sender ``peer``."""
    frames = [control.encode(m) for m in messages]

    def push():
        conn = tx._connections.connection_of(peer)
        for frame in frames:
            conn.socket.send(frame)

    on_loop(tx, push)


def remote_of(sender, receiver):
    """The sender's record of ``receiver`` (a :class:`~kvpolicy.transports.peers.Remote`)."""
    return on_loop(sender, lambda: next(r for r in sender._remotes.remotes.values() if r.rank.agent == receiver._agent_name))


def parked(sender, request_id):
    """How many asks for ``request_id`` wait at ``sender`` for its offer."""
    return on_loop(sender, lambda: len(sender._sender.parked.get(request_id, [])))


def outcome(handle, timeout=10.0):
    """(state, reason) once ``handle`` ended (or what it is after ``timeout``)."""
    try:
        handle.wait(timeout)
    except (TransferError, TimeoutError):
        pass
    return handle.state.value, handle.reason


def connected(sender, *receivers):
    """Connect ``receivers`` to ``sender``; the sender's name on their side."""
    for receiver in receivers:
        receiver.connect(sender.address)
    return sender.key_name


def accept(fake, receiver):
    """Let an in-process receiver connect to a :class:`tests.support.transfer.FakeSender`; its peer name."""
    fake.accept(SimpleNamespace(call=lambda op, address: receiver.connect(address).name))
    return fake.key_name


@pytest.fixture
def fake():
    sender = FakeSender()
    yield sender
    sender.close()


# -- peers.py -------------------------------------------------------------------------------------


def test_a_refused_handshake_is_counted_once(sides):
    """One stranger's handshake, refused by the ZAP handler, counts one."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    p = sides("p")
    endpoint, server_key = split_address(p.address)
    public, secret = zmq.curve_keypair()  # a key no allow-list holds
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, -1)  # one handshake, not one per reconnect
    sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = secret, public, server_key
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        sock.connect(endpoint)
        assert monitor.poll(10_000), "no handshake event"
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
    # (the ZAP handler counted it before it answered, and the answer came before the event)
    assert p.stats["refused_handshakes"] == 1


def test_a_batch_frame_within_the_budget_is_served_and_one_past_it_is_dropped_once(sides):
    """The frame budget counts the messages of a batch: a batch of 4 within
    a budget of 8 is handled message by message; the next batch of 10, past what is left, is
    dropped whole and counted once."""
    p = sides("p", limits={"frame_burst": 8, "frames_per_s": 0.001})
    sock, _ = allowed_dealer(p.address, "batcher")
    try:
        cancels = [control.encode(control.Cancel(f"b{i}", i + 1, 0)) for i in range(10)]
        sock.send(control.batch(cancels[:4]))  # 1 + 3 of 8 tokens: handled (it never said hello)
        sock.send(control.batch(cancels))  # 1 + 9 of 4 left: dropped

        def counts():
            return p.stats["dropped_over_budget"], p.stats["dropped_unknown_peer"]

        eventually(lambda: counts()[0] >= 1 and counts()[1] >= 4, seen=counts)
        assert counts() == (1, 4)
    finally:
        sock.close(0)


def test_requests_batched_in_one_frame_are_all_served(sides):
    """A real receiver's requests leave batched in one frame (several receives started
    while its service thread was busy); every one of them is served."""
    p, d = sides("p", seed=1), sides("d", seed=2)
    peer = connected(p, d)
    pending = d.receive("open", [15], peers=[peer], timeout_s=IN_PROCESS_TIMEOUT_S)  # never offered
    eventually(lambda: parked(p, "open") == 1)
    for i in range(3):
        p.send(f"batched-{i}", [i], to=d.key_name)
    frames_before = on_loop(d, lambda: d._connections.frames_sent)
    gate = threading.Event()
    d._loop.submit(lambda: gate.wait(10))  # the three starts run together, their requests leave in one frame
    try:
        handles = [d.receive(f"batched-{i}", [4 + i], peers=[peer], timeout_s=10) for i in range(3)]
    finally:
        gate.set()
    for handle in handles:
        assert outcome(handle)[0] == "completed", outcome(handle)
    assert on_loop(d, lambda: d._connections.frames_sent) == frames_before + 1
    assert d.pool.digests([4, 5, 6]) == p.pool.digests([0, 1, 2])
    assert p.stats["dropped_over_budget"] == 0
    assert d.cancel("open") is False and outcome(pending)[0] == "cancelled"


def test_hellos_past_the_limit_of_metadata_reads_in_flight_are_refused_and_the_first_one_reads(sides, monkeypatch):
    """Hellos without NIXL metadata (read from etcd): the first starts a read, one more
    key past ``fetches`` (1 here) is refused while it is in flight, and so is a second connection of
    the first key; each is told (``refused``, busy, with a retry hint), not left to its timeout."""
    from .attackers import dealer, recv

    p = sides("p", limits={"fetches": 1})
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", "http://127.0.0.1:9")  # nothing listens: the read goes on
    monkeypatch.setenv("KVPOLICY_ETCD_INSECURE_PLAINTEXT", "1")  # (plain http to loopback, for tests)
    name, secret = new_key("fetcher0", KEYS_DIR)
    first = dealer(p.address, secret)
    first.send(control.encode(control.Hello(fake_rank(own_agent(secret, name)))))
    eventually(lambda: on_loop(p, lambda: len(p._remotes.admission._fetching)) == 1)
    again = dealer(p.address, secret)  # another rank of the same key
    other, own = allowed_dealer(p.address, "fetcher1")  # another key, past the limit
    try:
        for sock, agent in ((again, own_agent(secret, name)), (other, own)):
            sock.send(control.encode(control.Hello(fake_rank(agent))))
            answer = recv(sock, 5000)
            assert isinstance(answer, control.Refused) and answer.reason.startswith("busy") and answer.retry_after_ms > 0, answer
        fetching = on_loop(p, lambda: len(p._remotes.admission._fetching))
        assert (fetching, p.stats["refused_hellos"]) == (1, 2)
        assert recv(first, 300) is None  # the first one's read goes on
    finally:
        for sock in (first, again, other):
            sock.close(0)


def own_agent(secret_file: str, name: str) -> str:
    """A NIXL agent name bound to the key in ``secret_file``."""
    import zmq.auth

    from kvpolicy.transports.addresses import fingerprint

    public, _ = zmq.auth.load_certificate(secret_file)
    return f"{name}-{fingerprint(public)}-1-abcd"


def test_a_metadata_read_that_cannot_start_refuses_its_hello_and_frees_its_slot(sides, monkeypatch):
    """(Found next to the limit on metadata reads in flight.) etcd settings the client refuses (plain http without
    KVPOLICY_ETCD_INSECURE_PLAINTEXT): the hello is refused, and its read's slot is free again. (The
    read's thread used to die there, holding the slot: that key was refused for ever, and after
    ``fetches`` such keys every hello without metadata.)"""
    p = sides("p", limits={"fetches": 1})
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", "http://127.0.0.1:9")
    monkeypatch.delenv("KVPOLICY_ETCD_INSECURE_PLAINTEXT", raising=False)
    sock, own = allowed_dealer(p.address, "unread")
    try:
        for attempt in (1, 2):  # the same key again: not "a read for this key is already in flight"
            sock.send(control.encode(control.Hello(fake_rank(own))))
            eventually(lambda attempt=attempt: p.stats["refused_hellos"] == attempt, timeout_s=10, seen=lambda: p.stats["refused_hellos"])
            assert on_loop(p, lambda: len(p._remotes.admission._fetching)) == 0
    finally:
        sock.close(0)


def test_one_key_keeps_its_connections_up_to_remotes_per_peer(sides):
    """Receivers holding one key (one NIXL agent each) each say hello: with ``remotes_per_peer``
    connections (4) none is forgotten, and each is still written to."""
    p = sides("p", seed=1)
    from kvpolicy.transports import Limits

    assert Limits().remotes_per_peer == 4
    shared = new_key("d")
    receivers = [sides(f"d{i}", key=shared, seed=2 + i) for i in range(4)]
    peer = connected(p, *receivers)
    assert on_loop(p, lambda: len(p._remotes.remotes)) == 4
    handles = []
    for i, receiver in enumerate(receivers):
        p.send(f"to-d{i}", [i + 1], to=shared[0])
        handles.append(receiver.receive(f"to-d{i}", [9], peers=[peer], timeout_s=10))
    for i, (receiver, handle) in enumerate(zip(receivers, handles)):
        assert outcome(handle)[0] == "completed", outcome(handle)
        assert receiver.pool.digests([9]) == p.pool.digests([i + 1])
    # One connection more: the key keeps its newest four, never five.
    connected(p, sides("d4", key=shared, seed=6))
    assert on_loop(p, lambda: len(p._remotes.remotes)) == 4


def test_a_proof_nobody_asked_for_is_dropped_as_unexpected(sides):
    """A proof from a connection that was sent no nonce is a dropped frame, not an
    internal error."""
    p = sides("p")
    sock, _ = allowed_dealer(p.address, "prover")
    try:
        sock.send(control.encode(control.Proof("0" * 32)))

        def counts():
            return p.stats["dropped_unexpected"], p.stats["internal_errors"]

        eventually(lambda: sum(counts()) >= 1, seen=counts)
        assert counts() == (1, 0)
    finally:
        sock.close(0)


# -- sender.py ------------------------------------------------------------------------------------


@pytest.fixture
def trio(sides):
    """A sender, its receiver and an insider (another allowed receiver), both connected."""
    p, d, insider = sides("p", seed=1), sides("d", seed=2), sides("insider", seed=3)
    connected(p, d, insider)
    return p, d, insider


def test_a_two_receiver_offer_one_gave_up_on_times_out_waiting_for_the_other(trio):
    """One of two receivers gives up (a final cancel) and the other never
    asks: the offer waits for that one, then times out naming one receiver."""
    p, _, insider = trio
    gone = remote_of(p, insider)
    offer = p.send("pair", [1, 2], receivers=2, timeout_s=3.0)  # (its cancel is the next command of the loop)
    change = stats_change(p, lambda: p._sender.on_cancel(gone, control.Cancel("pair", 0, 1)))
    assert change == {} and offer.state.value == "waiting"
    assert outcome(offer) == ("timed_out", "1 receiver(s) did not ask in time")


def test_a_two_receiver_offer_one_gave_up_on_still_serves_the_other(trio):
    """A final cancel counts one receiver: the other's ask is still written."""
    p, d, insider = trio
    offer = p.send("pair", [1, 2], receivers=2)
    raw(insider, p.key_name, control.Cancel("pair", 7, 1))  # (its answer: a result it never asked for)
    eventually(lambda: insider.stats["dropped_unknown_request"] == 1)
    assert offer.state.value == "waiting"
    received = d.receive("pair", [5, 6], peers=[p.key_name], timeout_s=10)
    assert outcome(received)[0] == "completed", outcome(received)
    assert d.pool.digests([5, 6]) == p.pool.digests([1, 2])
    assert outcome(offer) == ("cancelled", "cancelled by the receiver")  # (one of its two gave up)


def test_an_early_ask_that_is_then_served_is_not_counted_as_not_addressed(trio):
    """An ask for an id not offered yet waits; it is not a frame for someone else."""
    p, d, _ = trio
    received = d.receive("early", [5, 6], peers=[p.key_name], timeout_s=10)
    eventually(lambda: parked(p, "early") == 1)
    p.send("early", [1, 2], to=d.key_name)
    assert outcome(received)[0] == "completed", outcome(received)
    assert p.stats["dropped_not_addressee"] == 0


def test_each_ask_past_the_parked_budget_is_refused_and_counted_once(sides):
    """With ``parked_per_peer`` 2 the third early ask of one key is refused
    at once, and counted once."""
    p, d = sides("p", limits={"parked_per_peer": 2}), sides("d")
    peer = connected(p, d)
    handles = [d.receive(f"early-{i}", [i], peers=[peer], timeout_s=IN_PROCESS_TIMEOUT_S) for i in range(2)]
    eventually(lambda: parked(p, "early-0") + parked(p, "early-1") == 2)
    third = d.receive("early-2", [2], peers=[peer], timeout_s=10)
    state, reason = outcome(third)
    assert state == "failed" and "too many asks waiting" in reason, (state, reason)
    assert p.stats["dropped_over_budget"] == 1
    assert [h.state.value for h in handles] == ["waiting", "waiting"]


@pytest.mark.parametrize("final", [0, 1], ids=["attempt", "final"])
def test_a_cancel_for_every_attempt_ends_the_receivers_waiting_ask(trio, final):
    """A cancel with nonce 0 (every attempt of this receiver) matches its
    ask waiting for the offer: the ask is answered ``cancelled`` at once."""
    p, d, _ = trio
    received = d.receive("parked", [5, 6], peers=[p.key_name], timeout_s=IN_PROCESS_TIMEOUT_S)
    eventually(lambda: parked(p, "parked") == 1)
    mine = remote_of(p, d)
    assert stats_change(p, lambda: p._sender.on_cancel(mine, control.Cancel("parked", 0, final))) == {}
    assert parked(p, "parked") == 0
    assert outcome(received) == ("cancelled", f"{p.key_name}: cancelled by the receiver")


def test_a_cancel_leaves_the_waiting_asks_of_other_receivers_and_other_attempts(trio):
    """An insider's cancel (nonce 0, every attempt) of the victim's request, and the
    victim's own cancel of another attempt, leave the victim's ask waiting; it is served."""
    p, d, insider = trio
    received = d.receive("victim", [5, 6], peers=[p.key_name], timeout_s=IN_PROCESS_TIMEOUT_S)
    eventually(lambda: parked(p, "victim") == 1)
    nonce = on_loop(p, lambda: p._sender.parked["victim"][0].request.nonce)
    victim, other = remote_of(p, d), remote_of(p, insider)
    assert stats_change(p, lambda: p._sender.on_cancel(other, control.Cancel("victim", 0, 1))) == {"late_frames": 1}
    assert stats_change(p, lambda: p._sender.on_cancel(victim, control.Cancel("victim", nonce + 1, 0))) == {"late_frames": 1}
    assert parked(p, "victim") == 1
    p.send("victim", [1, 2], to=d.key_name)
    assert outcome(received)[0] == "completed", outcome(received)
    assert d.pool.digests([5, 6]) == p.pool.digests([1, 2])


def test_a_cancel_matching_nothing_counts_once_as_late_or_as_not_addressed(trio):
    """A cancel for no offer is a late frame; one from a receiver an offer is
    not for is not addressed to it; each counts one."""
    p, d, insider = trio
    p.send("for-d", [1, 2], to=d.key_name)
    eventually(lambda: on_loop(p, lambda: "for-d" in p._sender.offers))
    mine, other = remote_of(p, d), remote_of(p, insider)
    assert stats_change(p, lambda: p._sender.on_cancel(mine, control.Cancel("nothing", 5, 0))) == {"late_frames": 1}
    assert stats_change(p, lambda: p._sender.on_cancel(other, control.Cancel("for-d", 0, 1))) == {"dropped_not_addressee": 1}


def test_final_cancels_while_writes_are_in_flight_count_only_the_cancellers_own_writes(trio):
    """While the receiver's write of offer X is in flight (NIXL
    said "in progress"): the insider's final cancel of X (an offer for two) counts it as gone; the
    receiver's final cancel of offer Y (no ask of its own) ends Y; the receiver's cancel of X itself
    is a late frame, counted once (its write's result follows)."""
    p, d, insider = trio
    received = d.receive("X", [5, 6], peers=[p.key_name], timeout_s=IN_PROCESS_TIMEOUT_S)
    eventually(lambda: parked(p, "X") == 1)
    x = p._new_handle("X", "sender", [1, 2], IN_PROCESS_TIMEOUT_S)
    y = p._new_handle("Y", "sender", [3], IN_PROCESS_TIMEOUT_S)
    d_remote, insider_remote = remote_of(p, d), remote_of(p, insider)
    sender, agent = p._sender, p._local.agent

    def during_the_write():
        real = agent.transfer
        agent.transfer = lambda xfer: (real(xfer), "PROC")[1]  # posted; its end is seen by the next poll
        try:
            sender.offer(x, 2, None)  # the waiting ask starts the write
        finally:
            agent.transfer = real
        sender.offer(y, 1, frozenset((d_remote.key,)))
        assert [w.ask.remote for w in sender.writes] == [d_remote]
        seen = {}
        for name, remote, cancel in (
            ("insider X", insider_remote, control.Cancel("X", 0, 1)),
            ("d Y", d_remote, control.Cancel("Y", 0, 1)),
            ("d X", d_remote, control.Cancel("X", 0, 1)),
        ):
            before = dict(p.stats)
            sender.on_cancel(remote, cancel)
            seen[name] = {k: v - before[k] for k, v in p.stats.items() if v != before[k]}
        seen["X cancelled"] = sender.offers["X"].cancelled
        seen["Y"] = y.state.value
        return seen

    assert on_loop(p, during_the_write) == {"insider X": {}, "d Y": {}, "d X": {"late_frames": 1}, "X cancelled": 1, "Y": "cancelled"}
    assert outcome(received)[0] == "completed", outcome(received)
    assert d.pool.digests([5, 6]) == p.pool.digests([1, 2])
    assert outcome(x) == ("cancelled", "cancelled by the receiver")  # served one, the other gave up


# -- receiver.py ----------------------------------------------------------------------------------


def test_late_results_of_a_fenced_attempt_and_of_an_ended_request_count_once_each(sides, fake):
    """The result of an attempt that timed out (its blocks fenced) lifts the
    fence and counts one late frame; a second result of a request that completed counts one more."""
    d = sides("d")
    writer = accept(fake, d)
    fenced = d.receive("fenced", [4], peers=[writer], timeout_s=1.0)
    request = fake.recv()
    assert outcome(fenced)[0] == "timed_out" and not fenced.released
    cancel = fake.recv()  # (this attempt only: a retry could still ask)
    assert (type(cancel), cancel.nonce, cancel.final) == (control.Cancel, request.nonce, 0)
    fake.send(control.encode(control.Result("fenced", request.nonce, "cancelled", "the attempt ended; nothing written")))
    assert fenced.wait_released(10)
    assert d.stats["late_frames"] == 1

    done = d.receive("done", [5], peers=[writer], timeout_s=10)
    request = fake.recv()
    result = control.encode(control.Result("done", request.nonce, "ok", "", 4096))
    fake.send(result)
    assert outcome(done)[0] == "completed"
    fake.send(result)  # again
    fake.send(control.encode(control.Result("never-made", 1, "ok")))  # (behind it on the same connection)
    eventually(lambda: d.stats["dropped_unknown_request"] == 1)
    assert d.stats["late_frames"] == 2


def test_a_replayed_result_of_an_earlier_attempt_is_dropped_as_stale(sides, fake):
    """The request failed once and is retried; the first attempt's result, replayed
    while the retry waits for the same sender, is a stale attempt's, and does not end the retry."""
    d = sides("d")
    writer = accept(fake, d)
    first = d.receive("retried", [4], peers=[writer], timeout_s=10)
    old = fake.recv()
    fake.send(control.encode(control.Result("retried", old.nonce, "error", "not yet")))
    assert outcome(first)[0] == "failed"
    retry = d.receive("retried", [4], peers=[writer], timeout_s=10)
    new = fake.recv()
    assert new.nonce != old.nonce
    fake.send(control.encode(control.Result("retried", old.nonce, "ok", "", 4096)))  # replayed
    fake.send(control.encode(control.Result("retried", new.nonce, "ok", "", 4096)))
    assert outcome(retry)[0] == "completed"
    assert (d.stats["dropped_stale_attempt"], d.stats["dropped_unknown_request"], d.stats["late_frames"], d.stats["internal_errors"]) == (1, 0, 0, 0)


def test_a_results_times_are_read_as_microseconds(sides, fake):
    """``transfer_us`` and ``queue_us`` of a result become seconds in the metrics."""
    d = sides("d")
    writer = accept(fake, d)
    received = d.receive("timed", [4], peers=[writer], timeout_s=10)
    request = fake.recv()
    fake.send(control.encode(control.Result("timed", request.nonce, "ok", "", 4096, 1, 1, 250, 1500)))
    metrics = received.wait(10)
    assert (metrics.queue_s, metrics.transfer_s) == (pytest.approx(250e-6), pytest.approx(1500e-6))


def test_a_cancelled_result_without_a_reason_ends_the_receive_as_plainly_cancelled(sides, fake):
    """A ``cancelled`` result with no reason adds no empty reason of its own."""
    d = sides("d")
    writer = accept(fake, d)
    received = d.receive("quiet", [4], peers=[writer], timeout_s=10)
    request = fake.recv()
    fake.send(control.encode(control.Result("quiet", request.nonce, "cancelled", "")))
    assert outcome(received) == ("cancelled", "cancelled")


def test_a_second_cancel_before_the_senders_confirmation_sends_nothing_more(sides, fake):
    """`cancel()` while a receive waits for the sender's confirmation of an
    earlier cancel() answers False and sends no second cancel."""
    d = sides("d")
    writer = accept(fake, d)
    received = d.receive("twice", [4], peers=[writer], timeout_s=10)
    request = fake.recv()
    assert d.cancel("twice") is False
    cancel = fake.recv()
    assert (type(cancel), cancel.nonce, cancel.final) == (control.Cancel, request.nonce, 1)
    assert received.state.value == "cancelling"
    assert d.cancel("twice") is False
    after = d.receive("after", [5], peers=[writer], timeout_s=10)
    following = fake.recv()  # what the receiver sent next, on the same connection
    assert (type(following), following.request_id) == (control.Request, "after"), following
    fake.send(control.encode(control.Result("twice", request.nonce, "cancelled", "cancelled by the receiver")))
    fake.send(control.encode(control.Result("after", following.nonce, "ok", "", 4096)))
    assert outcome(received)[0] == "cancelled"
    assert outcome(after)[0] == "completed"


def test_cancelling_a_read_that_stops_at_once_ends_the_receive_now(sides):
    """A receive reading an announced offer, cancelled before NIXL was next
    polled: its READ is stopped at once, so cancel() answers True and the receive has ended."""
    p, d = sides("p", allow_reads=True, seed=1), sides("d", seed=2)
    peer = connected(p, d)
    p.send("warm", [3], to=d.key_name)  # a first read, so that NIXL's connection is made before the one cancelled
    eventually(lambda: on_loop(d, lambda: "warm" in d._receiver.reads.offers))
    assert outcome(d.receive("warm", [7], peers=[peer], timeout_s=10))[0] == "completed"
    assert on_loop(d, lambda: d._receiver.reads.done) == 1  # (read, not written)
    p.send("read", [1, 2], to=d.key_name)
    eventually(lambda: on_loop(d, lambda: "read" in d._receiver.reads.offers))
    gate = threading.Event()
    d._loop.submit(lambda: gate.wait(10))  # the read is posted and cancelled in one turn of the loop
    try:
        received = d.receive("read", [5, 6], peers=[peer], timeout_s=10)
        cancelled = d._loop.submit(lambda: (d._receiver.cancel("read"), received.state.value, received.released))
    finally:
        gate.set()
    assert cancelled.result(10) == (True, "cancelled", True)
    assert received.reason == "cancelled"


def test_a_cancel_after_the_receiver_was_served_is_late_and_changes_nothing(trio):
    """Of an offer for two, the receiver is served (its write done, none in flight); its
    final cancel of that request, arriving after, is one late frame: it does not count the receiver
    again as gone, so the offer still waits for the other receiver, who is served and completes it."""
    p, d, insider = trio
    offer = p.send("served", [1, 2], receivers=2)
    received = d.receive("served", [5, 6], peers=[p.key_name], timeout_s=10)
    assert outcome(received)[0] == "completed", outcome(received)
    mine = remote_of(p, d)
    assert on_loop(p, lambda: (p._sender.writes, p._sender.offers["served"].served)) == ([], 1)
    assert stats_change(p, lambda: p._sender.on_cancel(mine, control.Cancel("served", 0, 1))) == {"late_frames": 1}
    assert on_loop(p, lambda: p._sender.offers["served"].cancelled) == 0
    assert offer.state.value == "waiting"
    other = insider.receive("served", [7, 8], peers=[p.key_name], timeout_s=10)
    assert outcome(other)[0] == "completed", outcome(other)
    assert d.pool.digests([5, 6]) == insider.pool.digests([7, 8]) == p.pool.digests([1, 2])
    assert outcome(offer)[0] == "completed", outcome(offer)
