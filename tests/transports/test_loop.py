"""The service loop's timer heap, without a transceiver around it."""

from __future__ import annotations

import time

from kvpolicy.transports.loop import ServiceLoop


def test_a_timer_cancelled_by_another_thread_while_it_comes_due_is_not_called():
    """``cancel()`` (a caller's thread) sets ``cancelled`` then drops ``fn``; the service thread may
    have tested ``cancelled`` just before. What it then finds is no function: nothing runs, and
    nothing is reported as a handler's error."""
    errors: list[str] = []
    loop = ServiceLoop("timers", busy=lambda: False, progress=lambda: False, on_error=errors.append)
    try:
        timer = loop.call_at(0.0, lambda: None)
        timer.fn = None  # what the service thread sees once it is past its test of ``cancelled``
        loop._run_timers(time.monotonic())
        assert errors == []
        assert timer.cancelled and not loop._timers
    finally:
        loop.close_pipe()


def test_a_call_that_holds_the_service_thread_is_logged_with_its_name(caplog, monkeypatch):
    """Every deadline and frame of a side waits behind what its service thread runs: a timer or a
    command that holds it for ``SLOW_CALL_S`` or more is logged with its name and how long it took;
    a quick one is not."""
    import kvpolicy.transports.loop as loop_module

    monkeypatch.setattr(loop_module, "SLOW_CALL_S", 0.05)
    loop = ServiceLoop("slow", busy=lambda: False, progress=lambda: False, on_error=lambda where: None)

    def sleepy_timer() -> None:
        time.sleep(0.1)

    def quick_timer() -> None:
        pass

    try:
        loop.call_at(0.0, sleepy_timer)
        loop.call_at(0.0, quick_timer)
        with caplog.at_level("WARNING", logger="kvpolicy.transports"):
            loop._run_timers(time.monotonic())
        slow = [r.getMessage() for r in caplog.records if "held the service thread" in r.getMessage()]
        assert len(slow) == 1 and "sleepy_timer" in slow[0] and "a timer" in slow[0], slow
    finally:
        loop.close_pipe()
