"""What every benchmark's command line shares (`rlckpt bench` and `python -m benchmarks.NAME`): list
arguments, the command as typed for the results, and SIGTERM ending a run as Ctrl-C does."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from collections.abc import Callable
from typing import Any

DEFAULT_OUT_DIR = "benchmarks/results"
EXIT_TERMINATED = 143  # 128 + SIGTERM, as the CLI exits on it


def csv_list(text: str) -> list[str]:
    """Comma-separated words, blanks dropped."""
    return [x.strip() for x in text.split(",") if x.strip()]


def counts_list(text: str) -> list[int]:
    """Comma-separated counts; 0 alone means none."""
    try:
        values = [int(x) for x in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected counts >= 0, got {text!r}")
    return [v for v in values if v > 0]


def int_list(text: str) -> list[int]:
    """Comma-separated positive integers."""
    try:
        values = [int(x) for x in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def float_list(text: str) -> list[float]:
    """Comma-separated numbers."""
    try:
        return [float(x) for x in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def command_line() -> list[str]:
    """The command as typed, for the results: `rlckpt bench ...`, else `python ARGV...`."""
    argv = sys.argv
    if "bench" in argv:
        return ["rlckpt", *argv[argv.index("bench") :]]
    return ["python", *argv]


def ends_on_sigterm(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A bench run that SIGTERM ends as Ctrl-C does: SystemExit(143) unwinds it, so the servers, clusters and
    ranks it started (moto, the ETag proxy, Ray, spawned ranks) are stopped on its way out, not left behind."""

    @functools.wraps(run)
    def ending(args: argparse.Namespace) -> int:
        def stop(signum: int, frame: Any) -> None:
            raise SystemExit(EXIT_TERMINATED)

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            return run(args)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return ending
