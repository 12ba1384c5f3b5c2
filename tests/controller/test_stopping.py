"""The arithmetic of stopping early: a stop request's grace, a save's estimate, the deadline's plan."""

from __future__ import annotations

import pytest

from rlckpt.controller.stopping import DeadlinePlan, SaveTimes, StopRequest


def test_a_stop_request_received_later_has_that_much_less_grace_and_never_less_than_none():
    request = StopRequest("preempted", grace_s=60.0)
    assert request.later(15.0).grace_s == 45.0
    assert request.later(90.0).grace_s == 0.0


def test_a_stop_request_is_preempted_or_deadline():
    with pytest.raises(ValueError, match="'completed'"):
        StopRequest("completed", grace_s=1.0)  # type: ignore[arg-type]


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
