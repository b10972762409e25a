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
