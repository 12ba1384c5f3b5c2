"""What every writer of a run shares when it must *save and stop* (docs/architecture.md, Stopping): `rlckpt
train`'s controller and driver, and the Checkpointer's SaveAndStop in a trainer rlckpt does not own.

- ``DeadlinePlan`` / ``SaveTimes``: the deadline's arithmetic (``--save-by``): stop once the time left is no
  more than another step plus the saves still to come, estimated from the run's own saves;
- ``GracePeriod``: how long a stop may take from the moment it begins, and what is left of it;
- ``StopSignals``: the stop signals (SIGTERM) a process receives, each one counted once — Python may run a
  handler once for several signals that came close together — and handed, in order, to what the driver
  makes of them (`rlckpt train`'s phases: cli/train_stop.py; the Checkpointer's first-saves, second-passes-on:
  checkpointer/stop.py).

Standard library only: `rlckpt --help` and `rlckpt train`'s signal handling import it before anything else.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_GRACE_S = 60.0  # how long a stop may take, by default (`--grace-seconds`, SaveAndStop's grace_s)
UNMEASURED_SAVE_S = 10.0  # what a deadline assumes a save takes until the run has measured one
RECENT_SAVES = 3  # the estimate of the next save is the longest of this run's last few


class SaveTimes:
    """How long this run's saves took, begin to COMMIT: the estimate of the next one."""

    def __init__(self, unmeasured_s: float = UNMEASURED_SAVE_S) -> None:
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

    def due(self, now: float, save_in_flight: bool) -> bool:
        """The run must stop now to have saved by the deadline."""
        return self.seconds_until_stop(now, save_in_flight) <= 0

    def explain(self, now: float, save_in_flight: bool) -> str:
        """The estimate behind a stop, for the log and the run's events."""
        in_flight = " (twice: a save is in flight)" if save_in_flight else ""
        return (
            f"{self.save_by - now:.1f}s to the deadline; a save takes {self.saves.describe()}{in_flight}; "
            f"a step {self.step_s:.1f}s"
        )


class GracePeriod:
    """How long a stop may take (``seconds``) from the moment it begins (``start``, the first call counts),
    on ``clock`` (monotonic seconds: a wall clock that jumps must not move it)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        """
        Raises:
            ValueError: ``seconds`` is not a number of seconds >= 0 (math.inf: no bound).
        """
        if not seconds >= 0:  # NaN too
            raise ValueError(f"a grace period is a number of seconds >= 0, got {seconds!r}")
        self.seconds = seconds
        self.clock = clock
        self.started_at: float | None = None

    @property
    def started(self) -> bool:
        return self.started_at is not None

    def start(self) -> None:
        """The stop begins now (a later call changes nothing: the first request's grace counts)."""
        if self.started_at is None:
            self.started_at = self.clock()

    def left(self) -> float | None:
        """Seconds left of the grace period (never below 0); None before the stop began."""
        if self.started_at is None:
            return None
        return max(0.0, self.seconds - (self.clock() - self.started_at))

    def ends_at(self) -> float | None:
        """The clock's time at which the grace period ends; None before the stop began."""
        return None if self.started_at is None else self.started_at + self.seconds


# What a driver does with one stop signal, in the main thread: `signum` and the frame it interrupted.
SignalAction = Callable[[int, Any], None]


class StopSignals:
    """The stop signals (SIGTERM) this process receives, each handed once to ``on_signal``, in order.

    Python's handler only runs between bytecodes of the main thread, and runs once for several signals that
    came before it could (it keeps a flag per signal, not a count): a job-wide SIGTERM and a scheduler's second
    one may arrive as one call. The C-level handler writes one byte per signal to the wakeup fd
    (``signal.set_wakeup_fd``), so the handler counts what came since it last ran there. ``install`` takes
    the wakeup fd only when none is set; when another is (an asyncio loop's), or something replaced ours
    since, it stays theirs and every handler call counts one signal.

    What each signal means is the driver's (``on_signal``): it may raise (KeyboardInterrupt, to stop at
    once) or hand the signal on to the handler that was there before ``install`` (``pass_on``).
    """

    def __init__(self, on_signal: SignalAction, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> None:
        self.on_signal = on_signal
        self.signals = tuple(signals)
        self.received = 0  # signals handed to on_signal
        self.before: dict[int, Any] = {}  # the handlers install() replaced (kept after uninstall: pass_on)
        self._installed = False
        self._wakeup: tuple[int, int] | None = None  # our pipe (read, write) when we hold the wakeup fd
        self._wakeup_before: int | None = None

    def install(self) -> None:
        """Handle ``signals`` from now on, counted through the wakeup fd when it is free (main thread only).

        Raises:
            RuntimeError: called outside the main thread (Python's signal rule).
        """
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("stop signals are handled from the main thread only (Python's signal rule)")
        if self._installed:
            return
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if previous == -1:
            self._wakeup, self._wakeup_before = (read, write), previous
        else:  # another's (an event loop's): it stays theirs; each handler call counts one
            signal.set_wakeup_fd(previous)
            os.close(read)
            os.close(write)
        self.before = {int(sig): signal.signal(sig, self.handle) for sig in self.signals}
        self._installed = True

    def uninstall(self) -> None:
        """Put back the handlers and the wakeup fd of before ``install``."""
        if self._installed:
            for sig, handler in self.before.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            self._installed = False
        if self._wakeup is not None:
            if self._holds_wakeup():
                signal.set_wakeup_fd(self._wakeup_before if self._wakeup_before is not None else -1)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def pass_on(self, signum: int, frame: Any) -> None:
        """Give signal ``signum`` to the handler that was there before ``install``, and leave it that handler
        from now on (uninstalled): by default the process ends as the signal says (SIGTERM: exit 143)."""
        previous = self.before.get(signum, signal.SIG_DFL)
        self.uninstall()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        signal.raise_signal(signum)

    def handle(self, signum: int, frame: Any) -> None:
        """The installed handler: hands ``on_signal`` every signal that came since it last ran (none when this
        call's own signal was counted by the call before it)."""
        came = self._drain()
        if not came and not self._holds_wakeup():  # no count to go by: this call is one signal
            came = [signum]
        for sig in came:
            self.received += 1
            self.on_signal(sig, frame)

    def _holds_wakeup(self) -> bool:
        """The wakeup fd is still ours (nothing set another since ``install``); asking means setting it."""
        if self._wakeup is None:
            return False
        current = signal.set_wakeup_fd(self._wakeup[1], warn_on_full_buffer=False)
        if current != self._wakeup[1]:
            signal.set_wakeup_fd(current)  # theirs stays; we count one per call from now on
            return False
        return True

    def _drain(self) -> list[int]:
        """The signals of ours the C-level handler wrote to the wakeup fd since the last drain, in order."""
        if self._wakeup is None:
            return []
        ours = {int(sig) for sig in self.signals}
        came: list[int] = []
        while True:
            try:
                data = os.read(self._wakeup[0], 512)
            except BlockingIOError:
                return came
            if not data:
                return came
            came += [byte for byte in data if byte in ours]
