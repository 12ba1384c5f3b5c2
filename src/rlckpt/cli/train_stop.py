"""`rlckpt train`'s stop options and its SIGTERM: save and stop (the default), or stop at once.

``--on-sigterm save`` makes the first SIGTERM a request the driver forwards to the controller, which
saves the step reached and stops within ``--grace-seconds`` (docs/architecture.md, Stopping); a
second SIGTERM, or the first with ``--on-sigterm exit``, stops the run at once like Ctrl-C, its
save in flight aborted. ``--save-by`` / ``--save-by-seconds`` set a deadline
by which the run has saved and stopped. Kept apart from train.py's other options and steps.

The SIGTERM that stops at once raises KeyboardInterrupt, as Ctrl-C does: it is the one exception
every wait unwinds on (Ray's own waits turn whatever a signal handler raises into a
KeyboardInterrupt), and the handler records that it was a SIGTERM (``stopped_at_once``).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rlckpt.cli import _common
from rlckpt.errors import FinalSaveAbortedError

if TYPE_CHECKING:
    from rlckpt.controller.stopping import StopRequest
    from rlckpt.store import BundleStore

DEFAULT_GRACE_S = 60.0


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
        type=_positive_seconds,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help="how long a stop (SIGTERM or deadline) may take; then the final save is aborted cleanly and the "
        f"run exits 143 (default {DEFAULT_GRACE_S:.0f})",
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


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


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
    return time.time() + _positive_seconds(text)


class SigtermHandler:
    """SIGTERM in `rlckpt train`. With ``save`` the first one is only recorded: the driver polls
    ``pending()`` and asks the controller to save and stop; the second stops at once (raises
    KeyboardInterrupt, ``stopped_at_once`` set). With ``exit`` the first does. After that later
    SIGTERMs are ignored so the abort and the shutdown of Ray and TransferQueue can finish (a
    scheduler's SIGKILL is the backstop)."""

    def __init__(self, on_sigterm: str, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.on_sigterm, self.grace_s, self.clock = on_sigterm, grace_s, clock
        self.received = 0
        self.stopped_at_once = False
        self._first_at: float | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum: int, frame: Any) -> None:
        self.received += 1
        if self.received == 1 and self.on_sigterm == "save":
            self._first_at = self.clock()
        elif not self.stopped_at_once:
            self.stopped_at_once = True
            raise KeyboardInterrupt(f"signal {signum}: stopping at once")

    def pending(self) -> StopRequest | None:
        """The stop the first SIGTERM asked for, with what is left of its grace; None before one."""
        from rlckpt.controller.stopping import StopRequest

        if self._first_at is None:
            return None
        return StopRequest("preempted", max(0.0, self.grace_s - (self.clock() - self._first_at)))


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


def stopped_line(summary: dict[str, Any]) -> str | None:
    """The last stderr line of a run that stopped early: the step it saved (its resume point)."""
    reason = summary["stop_reason"]
    if reason == "completed":
        return None
    last = summary["last_committed_step"]
    saved = "nothing to save yet" if last is None else f"saved step {last}"
    return f"rlckpt train: {reason}: {saved}, stopped"


def report_unsaved(exc: BaseException, store: BundleStore, run_dir: str, *, reason: str, as_json: bool) -> int:
    """A stop that ended without its final save (a SIGTERM that stops at once, or FinalSaveAbortedError:
    the grace period over): say so and what the resume point is; EXIT_TERMINATED."""
    cause = getattr(exc, "cause", exc)  # a failure of the controller actor arrives wrapped by Ray
    if isinstance(cause, FinalSaveAbortedError):
        reason, message = cause.reason, str(cause)
    else:
        message = "SIGTERM: stopped at once; a save in flight was aborted (nothing of it is committed)"
    bundles = store.steps()
    last = bundles[-1] if bundles else None
    print(f"rlckpt train: {_common.printable(message)}; resume point: {last}", file=sys.stderr)
    if as_json:
        print(
            json.dumps(
                {
                    "stop_reason": reason,
                    "final_save_aborted": True,
                    "last_committed_step": last,
                    "bundles": bundles,
                    "run_dir": run_dir,
                },
                sort_keys=True,
            )
        )
    return _common.EXIT_TERMINATED
