"""How `rlckpt train` ends before its last step: a stop request (SIGTERM, a deadline), what a stop left, its bounds.

A stop is a request to *save and stop* (docs/architecture.md, Stopping): the train step in progress
finishes, a save in flight is finished if that fits the grace period, one final save of the step
reached commits, and the run returns. ``StopRequest.grace_s`` bounds all of it; the controller loop
aborts the final save cleanly when it runs out.

The deadline's arithmetic (``DeadlinePlan``, ``SaveTimes``) and the grace period (``GracePeriod``) are
rlckpt.checkpoint.stopping's, shared with the Checkpointer's SaveAndStop.

The grace period is a bound whatever storage does: work a stop cancels (a save whose thread waits on a
store that does not answer) is waited for ``ABORT_WAIT_S`` at most and then left behind; the driver
stops waiting for the controller ``DRIVER_WAIT_S`` after the grace; and the whole stop, its shutdown of
the actors, TransferQueue and Ray included, ends within ``STOP_MARGIN_S`` after it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

# Why a run ended (`rlckpt train --json`: stop_reason).
StopReason = Literal["completed", "preempted", "deadline"]
EarlyStop = Literal["preempted", "deadline"]

ABORT_WAIT_S = 5.0  # how long a stop waits for the work it cancelled before leaving it behind
DRIVER_WAIT_S = ABORT_WAIT_S + 5.0  # beyond the grace: the driver gives up on the controller
STOP_MARGIN_S = 30.0  # beyond the grace: the bound on a whole stop, shutdown included (docs/cli.md)


@dataclass(frozen=True)
class StopRequest:
    """Save and stop at the next safe point, within ``grace_s`` seconds of the controller receiving it."""

    reason: EarlyStop
    grace_s: float

    def __post_init__(self) -> None:
        if self.reason not in ("preempted", "deadline"):
            raise ValueError(f"a stop request is 'preempted' or 'deadline', got {self.reason!r}")

    def later(self, elapsed_s: float) -> StopRequest:
        """The same request ``elapsed_s`` seconds after it was received: that much less grace."""
        return dataclasses.replace(self, grace_s=max(0.0, self.grace_s - elapsed_s))


@dataclass(frozen=True)
class StopOutcome:
    """What a run that was stopped at once leaves: the step it had reached and its newest committed step
    (``step`` None: the controller did not say, or had not started training)."""

    step: int | None
    last_committed_step: int | None

    @property
    def lost_nothing(self) -> bool:
        """The step reached is committed, or nothing was trained: a resume goes on where the run stopped."""
        return self.step is not None and (self.step == 0 or self.step == self.last_committed_step)
