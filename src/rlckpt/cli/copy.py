"""`rlckpt copy SRC DST [--step N]`: replicate a committed bundle into another store as the same bundle —
what a two-tier run does in the background (docs/tiers.md), as a command: promote a bundle from NVMe to
S3, or pull one down before a run."""

from __future__ import annotations

import argparse
from typing import Any

from rlckpt.cli import _common

EPILOG = """\
examples:
  rlckpt copy /nvme/run1 s3://bucket/run1              # the newest bundle that verifies
  rlckpt copy s3://bucket/run1 /nvme/run1 --step 200   # pull one down before a run
  rlckpt copy /nvme/run1 s3://bucket/run1 --dest-storage-options '{"endpoint_url": "http://127.0.0.1:7480"}'

The copy is the same bundle: its files are the source's stored bytes, each checked against the
manifest as it is read and hashed again as it is written, and the destination commits the source's
manifest and COMMIT verbatim (digests and signatures are carried, never made anew); the copy is then
verified where it landed. Nothing is committed at DST until every file is there. Interrupted, it
leaves nothing committed; run it again and it keeps the files the interrupted copy finished (each read
back first). The same bundle already at DST is left as it is.
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "copy",
        help="copy a committed bundle to another store (e.g. NVMe to S3), verified end to end",
        description="Copy committed bundle --step (default: the newest committed) of SRC into DST as the same bundle.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", metavar="SRC", help="the source store: a local path or an fsspec URL")
    parser.add_argument("dest", metavar="DST", help="the destination store")
    parser.add_argument(
        "--storage-options",
        metavar="JSON",
        type=_common.storage_options_arg,
        default=None,
        help="fsspec options of SRC, as a JSON object",
    )
    parser.add_argument(
        "--dest-storage-options",
        metavar="JSON",
        type=_common.storage_options_arg,
        default=None,
        help="fsspec options of DST, as a JSON object",
    )
    parser.add_argument("--step", type=int, default=None, metavar="N", help="the step (default: the newest committed)")
    parser.add_argument("--json", action="store_true", help="print the copy report as JSON")
    _common.add_verify_key_argument(parser)
    _common.add_verbose_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from rlckpt.errors import UncommittedBundleError
    from rlckpt.store import copy_bundle

    source = _common.open_store(args)
    dest = _common.open_store(
        argparse.Namespace(
            url=args.dest, storage_options=args.dest_storage_options, verify_key=args.verify_key, run_id=args.run_id
        )
    )
    step = source.latest() if args.step is None else args.step
    if step is None:
        raise UncommittedBundleError(f"{args.url} holds no committed bundle that verifies: nothing to copy")
    report = copy_bundle(source, step, dest)
    dest.open(step).verify()  # end to end: every byte as it landed, against the carried manifest
    if args.json:
        _common.print_json({"source": args.url, "dest": args.dest, "verified": True, **dataclasses.asdict(report)})
    else:
        print(f"copied {_common.printable(report.describe())} to {_common.printable(args.dest)}; verified there")
    return _common.EXIT_OK
