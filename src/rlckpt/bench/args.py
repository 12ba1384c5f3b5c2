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


def add_destination_arguments(parser: argparse.ArgumentParser) -> None:
    """--destinations, the RGW endpoint and its keys, the scratch and staging dirs, --no-compress, --out-dir, -v."""
    parser.add_argument(
        "--destinations",
        type=csv_list,
        default=["local", "s3"],
        metavar="LIST",
        help="comma list of: local (scratch dir on disk), s3 (moto server on loopback); default local,s3",
    )
    parser.add_argument(
        "--rgw-endpoint",
        metavar="URL",
        default=None,
        help="also run against this S3 endpoint (e.g. Ceph RGW from scripts/rgw.sh) as s3-rgw",
    )
    parser.add_argument(
        "--rgw-key", default="testing", metavar="KEY", help="access key for --rgw-endpoint (default testing)"
    )
    parser.add_argument(
        "--rgw-secret", default="testing", metavar="SECRET", help="secret key for --rgw-endpoint (default testing)"
    )
    parser.add_argument(
        "--scratch-dir",
        default=None,
        metavar="DIR",
        help="where the local destination lives (default: system temp dir)",
    )
    parser.add_argument(
        "--staging-dir", default=None, metavar="DIR", help="snapshot staging root (default: /dev/shm when available)"
    )
    parser.add_argument("--no-compress", action="store_true", help="store data-plane files without zstd")
    parser.add_argument(
        "--out-dir",
        default=DEFAULT_OUT_DIR,
        metavar="DIR",
        help=f"where results are written (default {DEFAULT_OUT_DIR})",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log to stderr: -v info, -vv debug")


def open_destinations(args: argparse.Namespace) -> Any:
    """The benchmark destinations the command line names (a context manager: S3 servers run inside it)."""
    from rlckpt.bench.harness import destinations

    return destinations(
        args.destinations,
        scratch_root=args.scratch_dir,
        rgw_endpoint=args.rgw_endpoint,
        rgw_key=args.rgw_key,
        rgw_secret=args.rgw_secret,
    )


def check_destinations(args: argparse.Namespace) -> None:
    """Refuse a destination the harness does not know (RGW is --rgw-endpoint, not a name)."""
    unknown = set(args.destinations) - {"local", "s3"}
    if unknown:
        raise SystemExit(f"unknown destinations {sorted(unknown)} (use local, s3; RGW via --rgw-endpoint)")
