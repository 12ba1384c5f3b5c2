"""`rlckpt export RUN --out DIR|URL`: a bundle's consolidated tensors as safetensors files for serving and eval."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from rlckpt.cli import _common

EPILOG = """\
examples:
  rlckpt export /data/run1 --out /models/run1-step200 --step 200
  rlckpt export s3://bucket/run1 --out s3://bucket/exports/run1 --dtype bf16 --max-shard-size 2GB
  rlckpt export /data/run1 --out /tmp/policy --rename 'model.=' --json
  rlckpt export /data/run1 --out /tmp/everything --only all          # the optimizer's moments too

What it writes: model.safetensors, or model-0000K-of-0000N.safetensors and model.safetensors.index.json
(the Hugging Face layout), and rlckpt-export.json naming the bundle (step, txid, manifest digest) and
each file's size and BLAKE3. Every shard file read from the bundle is digest-checked before a byte of it
is used; with --verify-key only a bundle that key signed for the run is exported. On local disk the
files are written beside --out and renamed into place last; on S3 the index goes last: an interrupted
export leaves nothing that looks complete.

exit codes: 0 exported, 1 the bundle is corrupt, unsigned or badly signed (the message names the
file), 2 no such committed bundle, 3 --out exists and is not empty (without --overwrite), the store
cannot be read, or the bundle holds no such piece, 64 bad command line.
"""

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def size_arg(text: str) -> int:
    """`5GB`, `500MB`, `2GiB` or a number of bytes."""
    match = _SIZE.match(text)
    unit = (match.group(2) or "").upper() if match else None
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"a size like 5GB, 500MB, 2GiB or a number of bytes, got {text!r}")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, got {text!r}")
    return size


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a bundle's policy as safetensors files",
        description=(
            "Export the tensors of a bundle's DCP piece (policy/ of rlckpt train, state/ of the\n"
            "Checkpointer), each consolidated whole whatever world size saved it, as safetensors files.\n"
            "One process, no process group; memory holds one output shard at a time."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common.add_common_arguments(parser)
    parser.add_argument("--step", type=int, default=None, metavar="N", help="the bundle (default: the newest)")
    parser.add_argument("--out", required=True, metavar="DIR|URL", help="where the files go: absent or empty")
    parser.add_argument(
        "--out-storage-options",
        metavar="JSON",
        type=_common.storage_options_arg,
        default=None,
        help="fsspec options of --out, as a JSON object",
    )
    parser.add_argument(
        "--piece", choices=("policy", "state"), default=None, help="the DCP piece (default: whichever it holds)"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="KEY",
        help="a top-level key of the saved state to export, repeatable ('model': model.*; 'all': everything, "
        "the optimizer's state included); default: the model's tensors, or everything if there is no 'model'",
    )
    parser.add_argument(
        "--dtype", choices=("bf16", "fp16", "fp32"), default=None, help="cast floating tensors (default: as saved)"
    )
    parser.add_argument(
        "--max-shard-size", type=size_arg, default="5GB", metavar="SIZE", help="bytes per file at most (default 5GB)"
    )
    parser.add_argument(
        "--rename",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="a name prefix rule, repeatable, the first that matches applies ('model.=' drops 'model.')",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    parser.add_argument("--json", action="store_true", help="print the tensors, bytes and digests written as JSON")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr (default: when stderr is a terminal)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlckpt.export import export_safetensors

    store = _common.open_store(args)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    report = export_safetensors(
        store,
        args.step,
        out=args.out,
        piece=args.piece,
        only=args.only,
        dtype=args.dtype,
        max_shard_size=args.max_shard_size,
        rename=args.rename,
        overwrite=args.overwrite,
        out_storage_options=args.out_storage_options,
        progress=progress,
    )
    if args.json:
        _common.print_json(report.to_json())
    else:
        size = _common.format_size(report.bytes)
        print(
            f"exported {report.tensors} tensors ({size}) of step {report.step} in {len(report.files)} file(s) to "
            f"{_common.printable(args.out)} in {report.seconds:.1f}s"
        )
    return _common.EXIT_OK
