"""`rlckpt train`'s stop request and the grace it carries (the deadline: tests/checkpoint/test_stopping.py)."""

from __future__ import annotations

import pytest

from rlckpt.controller.stopping import StopRequest


def test_a_stop_request_received_later_has_that_much_less_grace_and_never_less_than_none():
    request = StopRequest("preempted", grace_s=60.0)
    assert request.later(15.0).grace_s == 45.0
    assert request.later(90.0).grace_s == 0.0


def test_a_stop_request_is_preempted_or_deadline():
    with pytest.raises(ValueError, match="'completed'"):
        StopRequest("completed", grace_s=1.0)  # type: ignore[arg-type]
