"""`rlckpt gc URL`: remove what crashed writers left and, with retention flags, old committed bundles (the
same flags as `rlckpt train`; with --replicated-to, never a bundle that remote tier does not hold yet)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from rlckpt.cli import _common, retention_args
from rlckpt.errors import StoreConfigError

EPILOG = """\
examples:
  rlckpt gc /data/run1 --dry-run             # show what would be removed
  rlckpt gc /data/run1                       # remove debris of crashed writers only
  rlckpt gc s3://bucket/run1 --keep-last 3   # ... and all but the 3 newest committed bundles
  rlckpt gc /data/run1 --stale-after 600     # treat transactions older than 10 min as dead
  rlckpt gc /nvme/run1 --keep-last 2 --keep-best 3 --metric reward --replicated-to s3://bucket/run1
                                             # ... and never a bundle S3 does not hold yet

A bundle goes when no rule keeps it (--keep-last, --keep-every, --keep-best; none: no committed
bundle goes). gc never removes the newest committed bundle that verifies, nor one that fails a check,
nor a transaction that is still live (its writer runs on this host, or it started less than
--stale-after seconds ago); with --replicated-to, nor a bundle newer than the newest one the remote
tier holds as this very bundle of the run (same run id and manifest digest in COMMIT), nor one being
copied there (read from the remote store). A --replicated-to of another run is refused (exit 3).
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "gc",
        help="remove debris of crashed writers and old bundles",
        description=(
            "Garbage-collect a store: staging dirs, partial prefixes and incomplete multipart\n"
            "uploads left by crashed writers and, with retention flags, committed bundles no\n"
            "rule keeps."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common.add_common_arguments(parser)
    retention_args.add_retention_arguments(parser)
    _common.add_remote_tier_arguments(
        parser, "keep every bundle newer than the newest one it holds as this run's same bundle (docs/tiers.md)"
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
    why = record.get("kept_reasons", {})
    if record["kept_steps"] and not why:
        lines.append("kept committed steps: " + ", ".join(str(s) for s in record["kept_steps"]))
    lines += [f"kept committed step {step}: {name(why[step])}" for step in record["kept_steps"] if step in why]
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


def retention(args: argparse.Namespace, store: Any) -> Any:
    """The store.Retention of the flags; with --replicated-to, holding what that tier does not have yet
    (refused when it is another run's)."""
    from rlckpt.store import Retention
    from rlckpt.tiers import replication_holds

    try:
        rules = Retention(**retention_args.retention_fields(args), **retention_args.metric_fields(args))
    except ValueError as exc:
        raise StoreConfigError(f"{exc} (see rlckpt gc --help)") from None
    if args.remote is None:
        return rules
    remote = _common.open_remote(args)
    _common.check_one_run(store, remote, "nothing removed")
    return dataclasses.replace(rules, holds=replication_holds(store, remote))


def run(args: argparse.Namespace) -> int:
    store = _common.open_store(args)
    rules = retention(args, store)
    record = report_record(store.gc(retention=rules, dry_run=args.dry_run, stale_after=args.stale_after))
    if args.json:
        _common.print_json({"url": args.url, **record})
    else:
        print("\n".join(describe(record)))
    return _common.EXIT_OK
