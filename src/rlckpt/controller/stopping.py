"""How a run ends before its last step: a stop request (SIGTERM, a deadline) and the deadline's plan.

A stop is a request to *save and stop* (docs/architecture.md, Stopping): the train step in progress
finishes, a save in flight is finished if that fits the grace period, one final save of the step
reached commits, and the run returns. ``StopRequest.grace_s`` bounds all of it; the controller loop
aborts the final save cleanly when it runs out.

``DeadlinePlan`` is the deadline's arithmetic (``--save-by``): the run stops once the time left is
no more than another step plus the saves still to come, estimated from this run's own saves.

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

RECENT_SAVES = 3  # the estimate of the next save is the longest of this run's last few
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


class SaveTimes:
    """How long this run's saves took, begin to COMMIT: the estimate of the next one."""

    def __init__(self, unmeasured_s: float) -> None:
        self.unmeasured_s = unmeasured_s  # stands in until this run has measured a save
        self.seconds: list[float] = []

    def record(self, seconds: float) -> None:
        self.seconds.append(seconds)

    def estimate(self) -> float:
        """The longest of this run's last RECENT_SAVES saves (``unmeasured_s`` before the first)."""
        recent = self.seconds[-RECENT_SAVES:]
        return max(recent) if recent else self.unmeasured_s

    def describe(self) -> str:
        if not self.seconds:
            return f"{self.unmeasured_s:.1f}s, assumed: no save measured yet in this run"
        count = min(len(self.seconds), RECENT_SAVES)
        if count == 1:
            return f"{self.estimate():.1f}s, as this run's one save so far"
        return f"{self.estimate():.1f}s, the longest of this run's last {count} saves"


@dataclass
class DeadlinePlan:
    """When a run with a deadline (``save_by``, the run's clock: unix seconds) must stop so that its
    final save has committed by then."""

    save_by: float
    saves: SaveTimes
    step_s: float = 0.0  # the last train step, its wait for rollouts included
    _last_step_at: float | None = None

    def step_finished(self, now: float) -> None:
        """A train step ended at ``now`` (or the run started): the time since the last is the step estimate."""
        if self._last_step_at is not None:
            self.step_s = now - self._last_step_at
        self._last_step_at = now

    def seconds_until_stop(self, now: float, save_in_flight: bool) -> float:
        """How long the run may go on before it must stop (≤ 0: now). Stopping costs the step in
        progress, the save in flight (finished first) and the final save."""
        saves = 2 if save_in_flight else 1
        return self.save_by - now - self.step_s - saves * self.saves.estimate()

    def explain(self, now: float, save_in_flight: bool) -> str:
        """The estimate behind a stop, for the log and the run's events."""
        in_flight = " (twice: a save is in flight)" if save_in_flight else ""
        return (
            f"{self.save_by - now:.1f}s to the deadline; a save takes {self.saves.describe()}{in_flight}; "
            f"a step {self.step_s:.1f}s"
        )
