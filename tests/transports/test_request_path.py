"""The request path: batched control frames, wake-ups coalesced, an idle loop that sleeps.

Counters, never clocks: batching is shown by frames against messages, idleness by the service
thread's wake-up counter staying put.
"""

from __future__ import annotations

import threading
import time

import msgpack
import pytest

from kvpolicy.transports import BlockPool, KVLayout, RequestState, control
from kvpolicy.transports.connections import REQUESTS_PER_FRAME
from kvpolicy.transports.peers import RESULTS_PER_FRAME

from .conftest import requires_nixl

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)
BLOCKS = 256


@pytest.fixture
def pair(tmp_path):
    """A sender ``p`` and a receiver ``d`` in this process, ``d`` connected to ``p``."""
    from kvpolicy.transports import NixlTransceiver, create_keys

    create_keys(tmp_path, "p")
    create_keys(tmp_path, "d")
    pools = [BlockPool(LAYOUT, BLOCKS, huge_pages=False) for _ in range(2)]
    for block in range(BLOCKS):
        pools[0].tensor[block].fill_(block % 97 + 1)
    with NixlTransceiver(pools[0], name="p", identity=tmp_path / "p.key_secret", allowed_peers=tmp_path, timeout_s=30) as p, \
            NixlTransceiver(pools[1], name="d", identity=tmp_path / "d.key_secret", allowed_peers=tmp_path, timeout_s=30) as d:
        d.connect(p.address)
        yield p, d


def hold(loop) -> threading.Event:
    """Keep ``loop``'s service thread busy until the returned event is set (so that what callers
    post meanwhile is drained in one iteration)."""
    entered, gate = threading.Event(), threading.Event()
    loop.post(lambda: (entered.set(), gate.wait(10)))
    assert entered.wait(10)
    return gate


@requires_nixl
def test_many_concurrent_receives_travel_batched_and_all_land(pair):
    p, d = pair
    n = 200
    src = [(7 * i) % BLOCKS for i in range(n)]
    dst = list(range(n))
    sent = [p.send(f"r{i}", [src[i]], to="d") for i in range(n)]
    frames_before, messages_before = d._connections.frames_sent, d._connections.messages_sent
    results_before = p._remotes.frames_sent
    direct_before = d._receiver.direct
    gate = hold(d._loop)
    try:
        received = [d.receive(f"r{i}", [dst[i]]) for i in range(n)]
    finally:
        gate.set()
    for handle in received + sent:
        handle.wait(30)
    assert all(h.state is RequestState.COMPLETED for h in received + sent)
    assert d._connections.messages_sent - messages_before == n
    # The first ask, made with nothing else open, left from the caller's thread; the other 199, made
    # while it was open, went through the (held) service thread, in frames of REQUESTS_PER_FRAME.
    assert d._receiver.direct - direct_before == 1
    assert d._connections.frames_sent - frames_before == 1 + -(-(n - 1) // REQUESTS_PER_FRAME)
    assert p._remotes.frames_sent < p._remotes.messages_sent  # results went back batched too, in frames of a few
    assert RESULTS_PER_FRAME <= 32 and p._remotes.frames_sent - results_before >= -(-(n - 1) // RESULTS_PER_FRAME)
    assert all(h.released for h in received)
    assert d.pool.digests(dst) == p.pool.digests(src)


@requires_nixl
def test_posting_a_burst_wakes_the_loop_once(pair):
    p, d = pair
    gate = hold(d._loop)
    try:
        writes_before = d._loop.wakeups
        done = [threading.Event() for _ in range(50)]
        for event in done:
            d._loop.post(event.set)
        assert d._loop._wake_pending  # one byte on its way, whatever the number of commands
    finally:
        gate.set()
    assert all(event.wait(10) for event in done)
    assert d._loop.wakeups - writes_before <= 2


@requires_nixl
def test_an_idle_pair_does_not_wake_up(pair):
    p, d = pair
    p.send("warm", [1], to="d")
    d.receive("warm", [2]).wait(30)
    loops = (p._loop, d._loop)

    def settled() -> tuple[int, int]:
        before = tuple(loop.wakeups for loop in loops)
        time.sleep(0.3)
        return before

    deadline = time.monotonic() + 10
    while True:  # the request's last frames and timers may still be in flight: wait until quiet
        before = settled()
        if before == tuple(loop.wakeups for loop in loops) or time.monotonic() > deadline:
            break
    time.sleep(1.0)
    assert tuple(loop.wakeups for loop in loops) == before
    assert all(not [t for t in loop._timers if not t[2].cancelled] for loop in loops)


def test_a_batch_is_checked_message_by_message():
    request = control.Request("a", 5, (1, 2), 0, 30_000)
    result = control.Result("a", 5, "ok")
    frame = control.batch([control.encode(request), control.encode(result)])
    assert control.decode_many(frame) == [request, result]
    with pytest.raises(control.ControlMessageError, match="a batch of messages where one"):
        control.decode(frame)  # a lone-message reader never takes a batch
    bad = control.batch([control.encode(request), msgpack.packb([control.PROTOCOL_VERSION, "request", "b"])])
    with pytest.raises(control.ControlMessageError, match=r"batch\[1\]"):
        control.decode_many(bad)


def test_hellos_never_travel_in_a_batch():
    rank = control.RankInfo("d", "agent-1", b"meta", LAYOUT, 1 << 40, 64, "DRAM", 0)
    frame = control.batch([control.encode(control.Hello(rank)), control.encode(control.Cancel("a", 0))])
    with pytest.raises(control.ControlMessageError, match="only requests, cancels, results, offers and releases"):
        control.decode_many(frame)


def test_batches_are_bounded_in_count_and_split_when_sending():
    cancel = control.encode(control.Cancel("a", 0))
    too_many = b"\xdc" + (control.MAX_BATCH + 1).to_bytes(2, "big") + cancel * (control.MAX_BATCH + 1)
    with pytest.raises(control.ControlMessageError, match="batch of"):
        control.decode_many(too_many)
    frames = control.frames([cancel] * (2 * control.MAX_BATCH + 1))
    assert [len(control.decode_many(f)) for f in frames] == [control.MAX_BATCH, control.MAX_BATCH, 1]
    big = control.encode(control.Request("b", 1, tuple(range(100_000)), 0, 30_000))
    assert len(control.frames([big] * 5)) >= 2  # kept under control.BATCH_BYTES per frame


@requires_nixl
def test_a_request_its_socket_refuses_fails_at_once_and_fences_nothing(pair):
    """A frame the DEALER will not queue (a full send queue) was never sent: its attempts end now,
    with their blocks free, instead of waiting out their deadline fenced."""
    import zmq

    from kvpolicy.transports import TransferError

    p, d = pair
    conn = d._connections.connection_of("p")
    real = conn.socket

    class Full:
        def __getattr__(self, name):
            return getattr(real, name)

        def send(self, *args, **kwargs):
            raise zmq.Again()

    d._loop.submit(lambda: setattr(conn, "socket", Full())).result(5)
    try:
        handle = d.receive("full", [3], timeout_s=20)
        with pytest.raises(TransferError, match="send queue is full"):
            handle.wait(10)
        assert handle.state is RequestState.FAILED and handle.released
    finally:
        d._loop.submit(lambda: setattr(conn, "socket", real)).result(5)
    p.send("after", [1], to="d")
    d.receive("after", [3]).wait(10)  # the same block, free again, over the same connection
    assert d.pool.digests([3]) == p.pool.digests([1])


@requires_nixl
def test_receives_from_several_caller_threads_all_land_whichever_thread_sends(pair):
    """Callers send their own requests when nothing else is open, and hand them to the service
    thread otherwise; both at once, from four threads: every frame is read (a send on one thread
    never hides a result that arrived meanwhile from the loop) and every request lands."""
    p, d = pair
    per_thread, threads = 40, 4
    direct_before = d._receiver.direct
    errors: list[BaseException] = []

    def caller(t: int) -> None:
        try:
            for i in range(per_thread):
                block = t * per_thread + i
                p.send(f"t{t}-{i}", [block % BLOCKS], to="d")
                d.receive(f"t{t}-{i}", [block]).wait(30)
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    workers = [threading.Thread(target=caller, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert not errors and not any(w.is_alive() for w in workers)
    assert d._receiver.direct > direct_before  # some went from a caller's thread
    blocks = list(range(per_thread * threads))
    assert d.pool.digests(blocks) == p.pool.digests([b % BLOCKS for b in blocks])


@requires_nixl
def test_a_request_seen_done_is_already_released_and_forgotten(pair, monkeypatch):
    """Done is the last thing a request's end records: whoever sees it may at once reuse the request
    id (both sides) and, for a completed receive, the same blocks."""
    from kvpolicy.transports.request import TransferHandle

    p, d = pair
    seen = []
    finish = TransferHandle._finish

    def recording_finish(handle, state, reason=""):
        owner = p if handle.role == "sender" else d
        seen.append((handle.role, handle.released, (handle.role, handle.request_id) in owner._handles))
        finish(handle, state, reason)

    monkeypatch.setattr(TransferHandle, "_finish", recording_finish)
    for i in range(50):
        sent = p.send("again", [i % BLOCKS], to="d")
        received = d.receive("again", [3])
        received.wait(30)
        assert received.released and received.state is RequestState.COMPLETED
        sent.wait(30)
    assert sorted(seen) == [("receiver", True, False)] * 50 + [("sender", True, False)] * 50
    assert d.pool.digests([3]) == p.pool.digests([49])


@requires_nixl
def test_an_ask_for_a_reused_request_id_waits_for_the_offer_posted_before_it(pair):
    """``send()`` returns before the service thread has registered its offer. An ask for a request
    id whose last request ended, arriving in between, is read again after the commands posted before
    it (the new offer among them) and served, not refused as the ended request's."""
    p, d = pair
    p.send("again", [1], to="d")
    d.receive("again", [3]).wait(30)
    ask = p._remotes._on_request
    raced = []

    def offer_posted_while_the_ask_is_read(remote, request):
        if not raced:  # the new offer is posted (not run yet: this thread is reading frames)
            raced.append(p.send("again", [2], to="d"))
        ask(remote, request)

    p._remotes._on_request = offer_posted_while_the_ask_is_read
    try:
        received = d.receive("again", [4])
        received.wait(30)
        raced[0].wait(30)
    finally:
        p._remotes._on_request = ask
    assert received.state is RequestState.COMPLETED
    assert d.pool.digests([4]) == p.pool.digests([2])
