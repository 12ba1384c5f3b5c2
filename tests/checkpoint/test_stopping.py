"""What every writer of a run shares when it saves and stops (rlckpt.checkpoint.stopping): a save's estimate,
the deadline's plan, the grace period. `rlckpt train`'s SIGTERMs are in tests/cli/test_train_stop.py, the
Checkpointer's in tests/checkpointer/test_stop.py: both count them with StopSignals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from rlckpt.checkpoint.stopping import DeadlinePlan, GracePeriod, SaveTimes, StopSignals


def test_a_save_is_estimated_as_the_longest_of_the_runs_last_three():
    saves = SaveTimes(unmeasured_s=10.0)
    assert saves.estimate() == 10.0
    for seconds in (9.0, 2.0, 3.0, 4.0):
        saves.record(seconds)
    assert saves.estimate() == 4.0  # 9 s is older than the last three
    assert saves.describe() == "4.0s, the longest of this run's last 3 saves"


def test_the_deadline_leaves_time_for_the_step_in_progress_and_the_final_save():
    plan = DeadlinePlan(save_by=1000.0, saves=SaveTimes(unmeasured_s=10.0))
    plan.step_finished(900.0)
    plan.step_finished(920.0)  # a step takes 20 s
    assert plan.seconds_until_stop(now=960.0, save_in_flight=False) == 10.0  # 40 s left, 30 s needed
    assert plan.seconds_until_stop(now=975.0, save_in_flight=False) == -5.0


def test_a_save_in_flight_counts_once_more_before_the_deadline():
    plan = DeadlinePlan(save_by=1000.0, saves=SaveTimes(unmeasured_s=10.0))
    assert plan.seconds_until_stop(now=975.0, save_in_flight=False) == 15.0
    assert plan.seconds_until_stop(now=975.0, save_in_flight=True) == 5.0


def test_the_deadline_plan_explains_its_estimate():
    plan = DeadlinePlan(save_by=1000.0, saves=SaveTimes(unmeasured_s=10.0))
    plan.saves.record(2.5)
    text = plan.explain(now=990.0, save_in_flight=True)
    assert text == (
        "10.0s to the deadline; a save takes 2.5s, as this run's one save so far (twice: a save is in flight); "
        "a step 0.0s"
    )


def test_the_deadline_is_due_once_no_time_is_left_before_stopping():
    plan = DeadlinePlan(save_by=1000.0, saves=SaveTimes(unmeasured_s=10.0))
    assert not plan.due(now=989.0, save_in_flight=False)
    assert plan.due(now=990.0, save_in_flight=False)


def test_a_grace_period_counts_from_its_first_start_and_never_below_zero():
    now = [100.0]
    grace = GracePeriod(30.0, clock=lambda: now[0])
    assert grace.left() is None
    grace.start()
    now[0] = 110.0
    grace.start()  # a second request does not restart it
    assert grace.left() == 20.0
    now[0] = 200.0
    assert grace.left() == 0.0


def test_the_stop_arithmetic_imports_nothing_beyond_the_standard_library():
    """`rlckpt train` handles SIGTERM with it from its first line, and `rlckpt --help` imports it."""
    code = (
        "import sys, rlckpt.checkpoint.stopping\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith(('rlckpt.', 'torch', 'ray')) "
        "and m not in ('rlckpt.checkpoint', 'rlckpt.checkpoint.stopping'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_a_wakeup_fd_another_holds_stays_theirs_and_each_handler_call_counts_one():
    """An asyncio loop's wakeup fd dispatches its own signal handlers: taking it would silence them."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    handler_before = signal.getsignal(signal.SIGTERM)
    theirs_before = signal.set_wakeup_fd(write)
    received: list[int] = []
    signals = StopSignals(lambda signum, frame: received.append(signum))
    try:
        signals.install()
        assert signal.set_wakeup_fd(write) == write  # still theirs
        signals.handle(signal.SIGTERM, None)
        signals.handle(signal.SIGTERM, None)
        assert received == [signal.SIGTERM, signal.SIGTERM]
        signals.uninstall()
        assert signal.set_wakeup_fd(write) == write and signal.getsignal(signal.SIGTERM) is handler_before
    finally:
        signals.uninstall()
        signal.set_wakeup_fd(theirs_before)
        os.close(read)
        os.close(write)
