"""`rlckpt train`'s stop options and its SIGTERM: save and stop (the default), or stop at once.

``--on-sigterm save`` makes the first SIGTERM a request the driver forwards to the controller, which
saves the step reached and stops within ``--grace-seconds`` (docs/architecture.md, Stopping); a
second SIGTERM, or the first with ``--on-sigterm exit``, stops the run at once like Ctrl-C, its
save in flight aborted. ``--save-by`` / ``--save-by-seconds`` set a deadline
by which the run has saved and stopped. Kept apart from train.py's other options and steps.

What each SIGTERM does is ``StopState``'s: one state machine, one outcome per phase of the run and
SIGTERM (docs/cli.md has the table). A SIGTERM that stops something at once (the start-up, or the
run) raises KeyboardInterrupt, as Ctrl-C does: it is the one exception every wait unwinds on (Ray's
own waits turn whatever a signal handler raises into a KeyboardInterrupt), and the state records
that it was a SIGTERM (``startup_stopped``, ``stopped_at_once``).
"""

from __future__ import annotations

import argparse
import enum
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

# both stopping modules are stdlib only: `rlckpt --help` stays fast
from rlckpt.checkpoint.stopping import DEFAULT_GRACE_S, GracePeriod, StopSignals
from rlckpt.cli import _common
from rlckpt.controller.stopping import STOP_MARGIN_S, StopRequest
from rlckpt.errors import FinalSaveAbortedError

if TYPE_CHECKING:
    from rlckpt.store import BundleStore

LIST_WAIT_S = 5.0  # how long the report of a stop waits for the run dir's listing


def add_stop_arguments(parser: argparse.ArgumentParser) -> None:
    """--on-sigterm, --grace-seconds and the deadline (--save-by | --save-by-seconds, both into ``save_by``)."""
    group = parser.add_argument_group("stopping (preemption, deadlines)")
    group.add_argument(
        "--on-sigterm",
        choices=("save", "exit"),
        default="save",
        help="save: on SIGTERM finish the step in progress, save it, wait for the commit and exit 0 (default); "
        "exit: stop at once, aborting a save in flight, like Ctrl-C (exit 143)",
    )
    group.add_argument(
        "--grace-seconds",
        type=_common.positive_seconds_arg,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help="how long a stop (SIGTERM or deadline) may take; then the final save is aborted cleanly and the "
        f"run exits 143, within S + {STOP_MARGIN_S:.0f} s whatever the storage does (default {DEFAULT_GRACE_S:.0f})",
    )
    deadline = group.add_mutually_exclusive_group()
    deadline.add_argument(
        "--save-by",
        dest="save_by",
        type=_deadline_at,
        default=None,
        metavar="ISO-TIME",
        help="a deadline (e.g. 2026-12-01T18:00:00Z; local time without a zone): the run saves once and "
        "stops so that its bundle is committed by then, estimating the save from its own saves",
    )
    deadline.add_argument(
        "--save-by-seconds",
        dest="save_by",
        type=_deadline_in,
        metavar="N",
        help="the same deadline, N seconds after the command starts",
    )


def _deadline_at(text: str) -> float:
    """An ISO 8601 time as unix seconds; refused when it is not in the future."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time (e.g. 2026-12-01T18:00:00Z): {text!r}") from None
    try:
        at = moment.timestamp()  # a time without a zone is local time
    except (OverflowError, OSError, ValueError):  # e.g. 0001-01-01 in a zone east of UTC is before year 1
        at = None
    if at is None:  # a moment this system cannot count in seconds: say which side of now it is on
        after = moment.replace(tzinfo=None) > datetime.now()
        raise argparse.ArgumentTypeError(
            f"{text!r} is too far in the future to be a deadline" if after else f"{text!r} is not in the future"
        )
    if at <= time.time():
        raise argparse.ArgumentTypeError(f"{text!r} is not in the future")
    return at


def _deadline_in(text: str) -> float:
    return time.time() + _common.positive_seconds_arg(text)


class Phase(enum.Enum):
    """Where `rlckpt train` is when a SIGTERM comes (the rows of the stop's table, docs/cli.md)."""

    STARTING = "starting"  # from the command's start until the controller runs: Ray, TransferQueue, restore
    TRAINING = "training"  # the controller runs; no stop asked for
    SAVING = "saving"  # a save-and-stop asked for: the step in progress, a save in flight, the final save
    COMMITTED = "committed"  # the step reached is committed; retention and the replication wait may still run
    SHUTTING_DOWN = "shutting down"  # the run has ended: its actors, TransferQueue and Ray are being stopped


class StopState:
    """`rlckpt train`'s stop as one state machine: the phase (``enter``, by the driver) and the SIGTERMs
    received decide what each SIGTERM does, one outcome per cell (docs/cli.md, the table):

    - starting: the first SIGTERM stops the start-up where it is (raises KeyboardInterrupt,
      ``startup_stopped``); nothing was trained, so nothing is lost: exit 0. Later ones are ignored.
    - training: with ``save`` the first is a request (``pending()``) the driver forwards: saving.
    - saving, committed (or training with ``exit``): the SIGTERM that stops at once (raises
      KeyboardInterrupt, ``stopped_at_once``). The driver asks the controller what that left: exit 0 if
      the step reached is committed, 143 if its save was aborted.
    - shutting down: ignored; the run's own outcome stands.

    The SIGTERMs are counted by ``rlckpt.checkpoint.stopping.StopSignals`` (each one once, also when Python
    hands several to one handler call), as the Checkpointer's SaveAndStop counts them; the grace period is
    its ``GracePeriod``, from the first SIGTERM. The first SIGTERM also arms the backstop: the process ends
    ``grace_s + STOP_MARGIN_S`` after it whatever happens meanwhile (``on_overrun`` with the exit code the
    state stands for)."""

    def __init__(
        self,
        on_sigterm: str,
        grace_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_overrun: Callable[[int], None] | None = None,
        margin_s: float = STOP_MARGIN_S,
    ) -> None:
        self.on_sigterm, self.grace_s, self.margin_s = on_sigterm, grace_s, margin_s
        self.grace = GracePeriod(grace_s, clock)
        self.on_overrun = on_overrun or _exit_now
        self.signals = StopSignals(self._one_sigterm)
        self.phase = Phase.STARTING
        self.startup_stopped = False
        self.stopped_at_once = False
        self.outcome: int | None = None  # the exit code, once the run's end has decided it
        self._backstop: threading.Timer | None = None

    @property
    def received(self) -> int:
        """SIGTERMs acted on."""
        return self.signals.received

    # --- the driver's side ---------------------------------------------------------------------

    def install(self) -> None:
        """The SIGTERM handler from now on, and the wakeup fd that counts SIGTERMs (main thread only)."""
        self.signals.install()

    def uninstall(self) -> None:
        """The handler and wakeup fd from before ``install``; the backstop disarmed."""
        if self._backstop is not None:
            self._backstop.cancel()
        self.signals.uninstall()

    def enter(self, phase: Phase) -> None:
        """The run moved on. Entering training after a SIGTERM stopped the start-up (something swallowed
        the KeyboardInterrupt on the way) raises it again; a stop already asked for is never undone."""
        if phase is Phase.TRAINING and self.startup_stopped:
            raise KeyboardInterrupt("SIGTERM during start-up")
        if phase is Phase.TRAINING and self.phase is not Phase.STARTING:
            return
        self.phase = phase

    def pending(self) -> StopRequest | None:
        """The save-and-stop the first SIGTERM asked for, with what is left of its grace; None before one."""
        left = self.grace.left()
        if left is None or self.on_sigterm != "save" or self.startup_stopped:
            return None
        return StopRequest("preempted", left)

    def exit_code(self) -> int:
        """What the process exits with if it must end now: the run's outcome once known; else 0 when nothing
        is lost (start-up stopped, step reached committed), 143 when the step reached is not saved."""
        if self.outcome is not None:
            return self.outcome
        if self.startup_stopped or self.phase is Phase.COMMITTED:
            return _common.EXIT_OK
        return _common.EXIT_TERMINATED

    # --- the signal's side ---------------------------------------------------------------------

    def handle(self, signum: int, frame: Any) -> None:
        """The SIGTERM handler: acts once for every SIGTERM that came since it last ran."""
        self.signals.handle(signum, frame)

    def _one_sigterm(self, signum: int, frame: Any) -> None:
        if not self.grace.started:
            self.grace.start()
            self._arm_backstop()
        if self.phase is Phase.SHUTTING_DOWN or self.startup_stopped or self.stopped_at_once:
            return  # the outcome is decided: the shutdown must finish (a scheduler's SIGKILL is the backstop)
        if self.phase is Phase.STARTING:
            self.startup_stopped = True
            raise KeyboardInterrupt("SIGTERM during start-up")
        if self.phase is Phase.TRAINING and self.on_sigterm == "save":
            self.phase = Phase.SAVING
            return
        self.stopped_at_once = True
        raise KeyboardInterrupt("SIGTERM: stopping at once")

    def _arm_backstop(self) -> None:
        self._backstop = threading.Timer(self.grace_s + self.margin_s, lambda: self.on_overrun(self.exit_code()))
        self._backstop.daemon = True
        self._backstop.start()


def _exit_now(code: int) -> None:
    """The backstop: the stop overran its bound. The reaper stops what is left of the Ray cluster."""
    print(
        f"rlckpt train: the stop did not end within the grace period + {STOP_MARGIN_S:.0f}s: exiting now ({code})",
        file=sys.stderr,
        flush=True,
    )
    os._exit(code)


def describe_event(event: dict[str, Any]) -> str | None:
    """The line `rlckpt train` writes for a stop event of the run, or None for other events."""
    kind = event.get("event")
    if kind == "stop_requested":
        return (
            f"rlckpt train: SIGTERM: saving at the next safe point, then stopping ({event['grace_s']:.0f}s grace; "
            "a second SIGTERM aborts the save)"
        )
    if kind == "stop" and event.get("reason") == "deadline":
        return f"rlckpt train: deadline: stopping at step {event['step']} to save ({event.get('detail', '')})"
    return None


def stopped_line(reason: str, last_committed_step: int | None, *, trained: bool, step: int) -> str:
    """The last stderr line of a run that stopped early and lost nothing: the step it saved (its resume
    point), or that it had trained nothing new since the step it stands at (restored, or 0)."""
    if trained and last_committed_step is not None:
        return f"rlckpt train: {reason}: saved step {last_committed_step}, stopped"
    resume = "" if last_committed_step in (None, step) else f"; resume point: {last_committed_step}"
    return f"rlckpt train: {reason}: nothing new to save, at step {step}, stopped{resume}"


def standing_at(step: int | None, last_committed_step: int | None) -> int:
    """The step a stopped run stands at: the step it reached, when known; else its resume point (0 fresh)."""
    if step is not None:
        return step
    return 0 if last_committed_step is None else last_committed_step


def report_stopped(
    store: BundleStore | None, run_dir: str, *, reason: str, step: int | None, known_last: int | None, as_json: bool
) -> int:
    """A stop that lost nothing though the run did not return its summary (start-up stopped, or a SIGTERM
    that stopped at once after the step reached had committed): the stderr line, the ``--json`` line; 0."""
    bundles, last = _bundles_within(store, known_last)
    trained = step is not None and step > 0 and step == last
    at = standing_at(step, last)
    print(stopped_line(reason, last, trained=trained, step=at), file=sys.stderr)
    _print_stop_json(as_json, reason=reason, aborted=False, step=at, last=last, bundles=bundles, run_dir=run_dir)
    return _common.EXIT_OK


def report_unsaved(
    exc: BaseException, store: BundleStore | None, run_dir: str, *, reason: str, known_last: int | None, as_json: bool
) -> int:
    """A stop that ended without its final save (a SIGTERM that stops at once, or FinalSaveAbortedError:
    the grace period over): say so and what the resume point is; EXIT_TERMINATED."""
    cause = getattr(exc, "cause", exc)  # a failure of the controller actor arrives wrapped by Ray
    if isinstance(cause, FinalSaveAbortedError):
        reason, message = cause.reason, str(cause)
        known_last = cause.last_committed_step if known_last is None else known_last
    else:
        message = "SIGTERM: stopped at once; a save in flight was aborted (nothing of it is committed)"
    bundles, last = _bundles_within(store, known_last)
    print(f"rlckpt train: {_common.printable(message)}; resume point: {last}", file=sys.stderr)
    at = standing_at(None, last)  # what it trained past its resume point is lost
    _print_stop_json(as_json, reason=reason, aborted=True, step=at, last=last, bundles=bundles, run_dir=run_dir)
    return _common.EXIT_TERMINATED


def _print_stop_json(
    as_json: bool,
    *,
    reason: str,
    aborted: bool,
    step: int,
    last: int | None,
    bundles: list[int] | None,
    run_dir: str,
) -> None:
    if as_json:
        record = {
            "step": step,
            "stop_reason": reason,
            "final_save_aborted": aborted,
            "last_committed_step": last,
            "bundles": bundles,
            "run_dir": run_dir,
        }
        print(json.dumps(record, sort_keys=True), flush=True)


def _bundles_within(store: BundleStore | None, known_last: int | None) -> tuple[list[int] | None, int | None]:
    """The run dir's committed steps and the newest, listed in LIST_WAIT_S at most: a stop must not wait on a
    store that does not answer. Else (None, ``known_last``): the newest step the run knew committed (None
    too when the run stopped before it opened its store)."""
    if store is None:
        return None, known_last
    listed: list[list[int]] = []

    def listing() -> None:
        try:
            listed.append(store.steps())
        except Exception as exc:  # reported as "not listed"; the run's own knowledge stands in
            logging.getLogger(__name__).warning("listing %s after the stop failed: %s", store.url, exc)

    thread = threading.Thread(target=listing, name="stop-listing", daemon=True)  # never joined at exit
    thread.start()
    thread.join(LIST_WAIT_S)
    if not listed:
        print(f"rlckpt train: {store.url} was not listed within {LIST_WAIT_S:.0f}s after the stop", file=sys.stderr)
        return None, known_last
    steps = listed[0]
    return steps, steps[-1] if steps else None
