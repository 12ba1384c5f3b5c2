"""SaveAndStop: SIGTERM and deadlines for a training loop rlckpt does not own — polled, agreed, bounded.

A scheduler that preempts a job sends SIGTERM to every process (torchrun forwards it to each worker, then
SIGKILLs them `--shutdown_timeout` seconds later, 30 by default); a job may also have a deadline by which it
must have saved. Either is a request to *save and stop*: the loop finishes its step, saves the step reached,
waits for the commit and exits. Here:

- ``install()`` handles SIGTERM: the first one is recorded (nothing else happens in the handler); a second
  one gets the handler that was there before (by default: the process ends at once, exit 143);
- ``should_stop()`` is polled by the loop once per step on every rank: it is True on every rank at the same
  call when any rank has a reason — a SIGTERM, ``request()``, or the deadline (``save_by``) leaving no more
  time than a step and the saves still to come, estimated from the Checkpointer's own saves (the deadline
  arithmetic is `rlckpt train`'s: ``DeadlinePlan``, ``SaveTimes``) — an all-reduce over the Checkpointer's
  control group, so every rank saves the same step;
- ``grace_left()`` is what remains of the grace period from that moment, to give ``Checkpointer.wait`` as
  its timeout: a final save that has not committed by then is aborted (``SaveTimeoutError``), and the
  newest committed bundle stays the resume point.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from rlckpt.controller.stopping import DeadlinePlan, SaveTimes

from .config import UNMEASURED_SAVE_S
from .ranks import RankGroup

if TYPE_CHECKING:
    from .checkpointer import Checkpointer

logger = logging.getLogger(__name__)

StopReason = Literal["preempted", "deadline", "requested"]
_CODES: dict[StopReason, int] = {"requested": 1, "deadline": 2, "preempted": 3}  # agreed as the largest
DEFAULT_GRACE_S = 60.0


class SaveAndStop:
    """When a training loop must save and stop; one per rank, polled at the same point on every rank."""

    def __init__(
        self,
        checkpointer: Checkpointer | None = None,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        save_by: float | None = None,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM,),
        clock: Callable[[], float] = time.time,
    ) -> None:
        """
        Args:
            checkpointer: the job's Checkpointer: its ranks agree through its control group, and its saves'
                durations estimate the next (without one: this process alone, `unmeasured` saves).
            grace_s: how long the stop may take from the moment it is agreed: the final save's bound.
            save_by: a deadline (unix seconds, `clock`'s time) by which the final save must have committed.
            signals: the signals `install` handles (SIGTERM; add SIGUSR1 for a scheduler's early warning).
            clock: the wall clock the deadline is planned on.
        Raises:
            ValueError: grace_s is not a number of seconds >= 0.
        """
        if not (math.isfinite(grace_s) and grace_s >= 0):
            raise ValueError(f"grace_s must be a number of seconds >= 0, got {grace_s!r}")
        self.checkpointer = checkpointer
        self.grace_s = grace_s
        self.signals = signals
        self.clock = clock
        self.ranks: RankGroup = checkpointer.ranks if checkpointer is not None else RankGroup.alone()
        times = checkpointer.save_times if checkpointer is not None else SaveTimes(UNMEASURED_SAVE_S)
        self.deadline = DeadlinePlan(save_by, times) if save_by is not None else None
        self.reason: StopReason | None = None  # once agreed: why this job stops
        self._local: StopReason | None = None  # this process's own reason, before the agreement
        self._received = 0
        self._previous: dict[int, Any] = {}
        self._grace_at: float | None = None  # time.monotonic() by which the stop must be done
        if self.deadline is not None:
            self.deadline.step_finished(self.clock())  # the first step is timed from here

    # --- asking -----------------------------------------------------------------------------------

    def install(self) -> None:
        """Handle `signals` in this process (from the main thread, as Python requires): the first is a
        request to save and stop, a second gets the handler installed before (default: the process ends)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("SaveAndStop.install() must run in the main thread (Python's signal rule)")
        for sig in self.signals:
            self._previous[int(sig)] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Put back the handlers `install` replaced."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        self._received += 1
        if self._received == 1:
            self._local = "preempted"
            return
        previous = self._previous.get(signum, signal.SIG_DFL)
        self.uninstall()
        if callable(previous):
            previous(signum, frame)
        else:
            signal.signal(signum, previous)
            signal.raise_signal(signum)

    def request(self, reason: StopReason = "requested") -> None:
        """Ask for a save and stop from code (a scheduler's notice read from a file, a test)."""
        if self._local is None:
            self._local = reason

    # --- the loop's poll ---------------------------------------------------------------------------

    def should_stop(self) -> bool:
        """Whether the job saves and stops now: True on every rank at the same call once any rank has a
        reason (a collective of the Checkpointer's control group: call it on every rank, once per step).

        Raises:
            RankGroupError: a rank died or did not reach this call within the group's timeout.
        """
        if self.reason is not None:
            return True
        now = self.clock()
        local = self._local or self._deadline_reached(now)
        code = self.ranks.most(_CODES[local] if local else 0, self.ranks.control_group, "agreeing on a stop")
        if code == 0:
            return False
        self.reason = next(reason for reason, value in _CODES.items() if value == code)
        self._grace_at = time.monotonic() + self.grace_s
        plan = self.deadline
        detail = f"; {plan.explain(now, self._saving())}" if self.reason == "deadline" and plan is not None else ""
        logger.warning(
            "rank %d: stop agreed (%s): saving the step reached, %.0fs grace%s",
            self.ranks.rank,
            self.reason,
            self.grace_s,
            detail,
        )
        return True

    def grace_left(self) -> float | None:
        """Seconds left of the grace period once a stop is agreed (never below 0); None before."""
        if self._grace_at is None:
            return None
        return max(0.0, self._grace_at - time.monotonic())

    def _deadline_reached(self, now: float) -> StopReason | None:
        """The deadline's reason when the time left is what stopping costs (a step and the saves to come)."""
        if self.deadline is None:
            return None
        self.deadline.step_finished(now)  # polled once per step: the time since the last poll is a step
        return "deadline" if self.deadline.seconds_until_stop(now, self._saving()) <= 0 else None

    def _saving(self) -> bool:
        return self.checkpointer is not None and self.checkpointer.saving
