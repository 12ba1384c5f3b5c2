"""The driver's side of a stop, on the session's Ray cluster (``tq_session``): it never waits on the
controller actor without a bound. A stand-in controller whose event loop is blocked (as by a storage
call made on it) answers nothing; the driver gives up on it once the stop's grace period and its own
margin are over, and says what the run had reported committed."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rlckpt.controller.setup import SingleController
from rlckpt.controller.stopping import StopRequest
from rlckpt.errors import FinalSaveAbortedError

pytestmark = pytest.mark.slow
BLOCKED_FOR_S = 60.0  # the stand-in unblocks after this anyway: a driver that waits for it fails, not hangs


class BlockedController:
    """Its ``run`` blocks the actor's event loop: no other call is answered until it returns."""

    async def run(self) -> dict[str, Any]:
        time.sleep(BLOCKED_FOR_S)
        raise AssertionError("the driver waited for a controller that answered nothing")

    async def request_stop(self, request: StopRequest) -> None:
        pass

    def drain_events(self) -> list[dict[str, Any]]:
        return []


def test_the_driver_gives_up_on_a_controller_that_does_not_end_its_stop(tq_session):
    import ray

    actor = ray.remote(BlockedController).options(num_cpus=0).remote()
    controller = SingleController(actor, trainer_side=None, store=None, restored=None, give_up_after_s=1.0)  # type: ignore[arg-type]
    controller.last_committed_step = 4  # as the run's events said
    try:
        with pytest.raises(FinalSaveAbortedError, match=r"did not end within its 0s grace period \+ 1s.*step 4"):
            controller.run(stop_request=lambda: StopRequest("preempted", grace_s=0.0))
    finally:
        ray.kill(actor, no_restart=True)
