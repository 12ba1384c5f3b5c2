"""SaveAndStop in one process: a SIGTERM, a request or a deadline makes `should_stop()` True and keeps it so; a
second SIGTERM gets the handler that was there before; the grace period counts from the agreed stop. The
agreement across ranks is in test_multi_rank.py."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from rlckpt import Checkpointer
from rlckpt.checkpointer import SaveAndStop
from support.pause import Background
from support.signals import came_before_the_handler_ran


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def handlers():
    """SIGTERM's handler before the test, put back after it; a recording handler in its place meanwhile."""
    received: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    yield received
    signal.signal(signal.SIGTERM, before)


def test_nothing_asks_for_a_stop_by_itself():
    stop = SaveAndStop()
    assert [stop.should_stop() for _ in range(3)] == [False, False, False]
    assert stop.reason is None and stop.grace_left() is None


def test_a_request_stops_at_the_next_poll_and_for_good():
    stop = SaveAndStop()
    stop.request()
    assert stop.should_stop() and stop.should_stop()
    assert stop.reason == "requested"


def test_a_sigterm_is_a_request_to_save_and_stop(handlers):
    stop = SaveAndStop(grace_s=30)
    stop._grace.clock = lambda: 500.0  # the grace period's clock stands still: a state, not a time, is checked
    stop.install()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.should_stop() and stop.reason == "preempted"
    assert stop.grace_left() == 30  # the SIGTERM began the grace period
    assert handlers == []  # the handler before it did not run
    stop.uninstall()


def test_a_second_sigterm_gets_the_handler_installed_before(handlers):
    stop = SaveAndStop()
    stop.install()
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    assert handlers == [signal.SIGTERM]
    assert stop.should_stop()


def test_two_sigterms_that_python_hands_the_handler_as_one_are_two(handlers):
    """Counted as `rlckpt train` counts them (StopSignals): the first asks to save and stop, the second reaches
    the handler that was there before."""
    stop = SaveAndStop()
    stop.install()
    try:
        came_before_the_handler_ran(signal.SIGTERM)  # a SIGTERM whose handler has not run yet ...
        os.kill(os.getpid(), signal.SIGTERM)  # ... and one more: Python runs the handler once for both
        assert handlers == [signal.SIGTERM]
        assert stop.should_stop() and stop.reason == "preempted"
    finally:
        stop.uninstall()


def test_uninstall_puts_the_previous_handler_back(handlers):
    stop = SaveAndStop()
    stop.install()
    stop.uninstall()
    os.kill(os.getpid(), signal.SIGTERM)
    assert handlers == [signal.SIGTERM] and not stop.should_stop()
    assert signal.set_wakeup_fd(-1) == -1  # and the wakeup fd it took


def test_install_outside_the_main_thread_is_refused():
    with pytest.raises(RuntimeError, match="main thread"):
        Background(SaveAndStop().install).result()
    assert threading.current_thread() is threading.main_thread()


def test_a_deadline_stops_once_the_time_left_is_a_step_and_a_save():
    clock = Clock()
    stop = SaveAndStop(save_by=clock.now + 100, clock=clock)  # no save measured yet: 10 s assumed
    clock.now += 5  # a step takes 5 s
    assert not stop.should_stop()  # 95 s left > 5 + 10
    clock.now += 80  # 15 s left, a step of 80 s: not enough for another step and the save
    assert stop.should_stop() and stop.reason == "deadline"


def test_a_deadline_is_planned_with_the_checkpointers_measured_saves(tmp_path):
    clock = Clock()
    with Checkpointer(str(tmp_path / "run")) as ckpt:
        stop = SaveAndStop(ckpt, save_by=clock.now + 100, clock=clock)
        clock.now += 5
        assert not stop.should_stop()  # 95 s left > a step of 5 s + a save of 10 s (assumed)
        ckpt.save_times.record(90.0)  # this run's saves were measured: one took 90 s
        clock.now += 5
        assert stop.should_stop() and stop.reason == "deadline"  # 90 s left < 5 + 90


def test_no_grace_means_the_final_save_gets_none():
    stop = SaveAndStop(grace_s=0)
    stop.request()
    assert stop.should_stop() and stop.grace_left() == 0.0


@pytest.mark.parametrize("grace", [-1.0, float("nan"), float("inf")])
def test_a_grace_that_is_not_seconds_is_refused(grace):
    with pytest.raises(ValueError, match="grace_s"):
        SaveAndStop(grace_s=grace)
