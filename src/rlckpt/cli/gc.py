"""`rlckpt gc URL`: remove what crashed writers left and, with --keep-last, old committed bundles."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from rlckpt.cli import _common

EPILOG = """\
examples:
  rlckpt gc /data/run1 --dry-run             # show what would be removed
  rlckpt gc /data/run1                       # remove debris of crashed writers only
  rlckpt gc s3://bucket/run1 --keep-last 3   # ... and all but the 3 newest committed bundles
  rlckpt gc /data/run1 --stale-after 600     # treat transactions older than 10 min as dead

gc never removes the newest committed bundle, and never a transaction that is still live
(its writer runs on this host, or it started less than --stale-after seconds ago).
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "gc",
        help="remove debris of crashed writers and old bundles",
        description=(
            "Garbage-collect a store: staging dirs, partial prefixes and incomplete multipart\n"
            "uploads left by crashed writers and, with --keep-last, committed bundles beyond\n"
            "the newest K."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common.add_common_arguments(parser)
    parser.add_argument(
        "--keep-last", type=_positive_int, metavar="K", help="keep only the K newest committed bundles (K >= 1)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    parser.add_argument(
        "--stale-after",
        type=_non_negative_float,
        metavar="SECONDS",
        help="a transaction older than this is presumed dead (default: the store's lease, 3600 s)",
    )
    parser.add_argument("--json", action="store_true", help="print the gc report as JSON")
    parser.set_defaults(func=run)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def report_record(report: Any) -> dict[str, Any]:
    """The store's GcReport as a plain dict (the --json form)."""
    return dataclasses.asdict(report)


def describe(record: dict[str, Any]) -> list[str]:
    """Human lines for a gc report: what went (or would go), then what was deliberately left alone."""
    verb = "would remove" if record["dry_run"] else "removed"
    name = _common.printable  # paths, keys and txids come from the store
    lines = [f"{verb} committed step {step} (retention)" for step in record["deleted_steps"]]
    lines += [f"{verb} {name(path)}" for path in record["removed"]]
    lines += [f"{verb} incomplete upload {name(key)}" for key in record["aborted_uploads"]]
    if len(lines) == 0:
        lines.append("nothing to remove")
    if record["kept_steps"]:
        lines.append("kept committed steps: " + ", ".join(str(s) for s in record["kept_steps"]))
    lines += [f"left alone live transaction {name(txid)}" for txid in record["live"]]
    reasons = record.get("corrupt_reasons", {})
    lines += [
        f"left alone corrupt step {step} (has a COMMIT; {name(reasons.get(step, 'inspect with rlckpt verify'))})"
        for step in record["corrupt_steps"]
    ]
    lines += [f"left alone quarantined bundle _quarantine/{name(q)}" for q in record.get("quarantined", [])]
    lines += [f"left alone non-regular file {name(p)}" for p in record.get("irregular", [])]
    lines += [f"skipped {name(s)}" for s in record.get("skipped", [])]
    return lines


def run(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    record = report_record(store.gc(keep_last=args.keep_last, dry_run=args.dry_run, stale_after=args.stale_after))
    if args.json:
        _common.print_json({"url": args.url, **record})
    else:
        print("\n".join(describe(record)))
    return _common.EXIT_OK
