"""`rlckpt copy SRC DST [--step N]`: replicate a committed bundle into another store as the same bundle —
what a two-tier run does in the background (docs/tiers.md), as a command: promote a bundle from NVMe to
S3, or pull one down before a run."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rlckpt.cli import _common

EPILOG = """\
examples:
  rlckpt copy /nvme/run1 s3://bucket/run1              # the newest bundle that verifies (as a resume picks)
  rlckpt copy s3://bucket/run1 /nvme/run1 --step 200   # pull one down before a run
  rlckpt copy /nvme/run1 s3://bucket/run1 --dest-storage-options '{"endpoint_url": "http://127.0.0.1:7480"}'

The copy is the same bundle: its files are the source's stored bytes, each checked against the
manifest as it is read and hashed again as it is written, and the destination commits the source's
manifest and COMMIT verbatim (digests and signatures are carried, never made anew); the copy is then
verified where it landed. Nothing is committed at DST until every file is there. Interrupted, it
leaves nothing committed; run it again and it keeps the files the interrupted copy finished (each read
back first). The same bundle already at DST is left as it is.

Without --step the bundle is the one a resume of SRC would pick: the newest that verifies. A newer one
whose file does not match its manifest is skipped, named on stderr (and in --json "skipped"), and the
next older one is copied; with --step N a bundle that does not verify fails the copy (exit 1). DST is
opened as --replicated-to is by ls and gc (fail-fast on S3, the same --verify-key).
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "copy",
        help="copy a committed bundle to another store (e.g. NVMe to S3), verified end to end",
        description="Copy committed bundle --step (default: the newest that verifies) of SRC into DST as the same "
        "bundle.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", metavar="SRC", help="the source store: a local path or an fsspec URL")
    parser.add_argument("remote", metavar="DST", help="the destination store")
    parser.add_argument(
        "--storage-options",
        metavar="JSON",
        type=_common.storage_options_arg,
        default=None,
        help="fsspec options of SRC, as a JSON object",
    )
    parser.add_argument(
        "--dest-storage-options",
        dest="remote_storage_options",
        metavar="JSON",
        type=_common.storage_options_arg,
        default=None,
        help="fsspec options of DST, as a JSON object",
    )
    parser.add_argument(
        "--step", type=int, default=None, metavar="N", help="the step (default: the newest bundle that verifies)"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="take each file whose entry is that of the same file of DST's newest bundle below the step from it "
        "(a hard link, a copy inside the server) instead of reading it from SRC and sending it again",
    )
    parser.add_argument("--json", action="store_true", help="print the copy report as JSON")
    _common.add_verify_key_argument(parser)
    _common.add_verbose_argument(parser)
    parser.set_defaults(func=run)


def copy_newest(source: Any, dest: Any, reuse: bool = False) -> tuple[Any, list[dict[str, Any]]]:
    """Copy the newest bundle of `source` that verifies (the rule a resume follows): from the newest committed
    step down, each copied as every copy is — every byte checked against the manifest as it is read — until
    one copies; a step whose bytes do not match is skipped (nothing of it is committed at `dest`). Returns
    the copy's report and the steps skipped, each with why.

    Raises:
        UncommittedBundleError: no committed bundle of `source` verifies.
    """
    from rlckpt.errors import CorruptBundleError, UncommittedBundleError
    from rlckpt.store import copy_bundle

    skipped: list[dict[str, Any]] = []
    for step in sorted(source.steps(), reverse=True):
        try:
            return copy_bundle(source, step, dest, reuse=reuse), skipped
        except CorruptBundleError as exc:  # the source's bytes (copy_bundle quarantines a corrupt DST bundle)
            skipped.append({"step": step, "reason": str(exc)})
            print(f"rlckpt copy: SKIPPED step {step}: it does not verify ({_common.printable(exc)})", file=sys.stderr)
    why = "" if not skipped else f" (skipped: {', '.join(str(s['step']) for s in skipped)})"
    raise UncommittedBundleError(f"{source.url} holds no committed bundle that verifies{why}: nothing to copy")


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from rlckpt.store import copy_bundle

    source = _common.open_store(args)
    dest = _common.open_remote(args)
    skipped: list[dict[str, Any]] = []
    if args.step is None:
        report, skipped = copy_newest(source, dest, args.reuse)
    else:
        report = copy_bundle(source, args.step, dest, reuse=args.reuse)
    dest.open(report.step).verify()  # end to end: every byte as it landed, against the carried manifest
    if args.json:
        record = {"source": args.url, "dest": args.remote, "verified": True, "skipped": skipped}
        _common.print_json({**record, **dataclasses.asdict(report)})
    else:
        print(f"copied {_common.printable(report.describe())} to {_common.printable(args.remote)}; verified there")
    return _common.EXIT_OK
