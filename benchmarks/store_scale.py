"""Commit cost by number of participants, and a writer's cost by number of files, local and S3.
`python -m benchmarks.store_scale --help`; results benchmarks/results/store_scale.{json,md}."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlckpt.bench.args import (
    DEFAULT_OUT_DIR,
    command_line,
    counts_list,
    csv_list,
    ends_on_sigterm,
)
from rlckpt.cli._common import add_verbose_argument, configure_logging

STORE_EPILOG = """\
what it does:
  For each destination and count N: N participants join one transaction, each writes one 1 KiB
  shard and seals (--threads at a time), then one commit of all; and, separately, one writer writes N
  small files, then commits. Reports time, storage calls (every call on the store's filesystem and its
  files, counted by the fault-injection wrapper of the tests) and, on S3, HTTP requests, each per
  participant or per file: flat columns mean linear growth. No Ray, no TransferQueue.
  Writes store_scale.{json,md} to --out-dir.

examples:
  python -m benchmarks.store_scale                                      # 16,256,4096 participants; 2000,8000 files
  python -m benchmarks.store_scale --participants 16,256,4096 --files 0 --destinations local
  python -m benchmarks.store_scale --quick --out-dir /tmp/smoke         # tiny, for a smoke run
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks.store_scale",
        description=(
            "Time, storage calls and S3 requests per participant of one commit, and per file of one writer, "
            "as the counts grow: linear growth shows as flat per-item columns."
        ),
        epilog=STORE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--participants",
        type=counts_list,
        default=[16, 256, 4096],
        metavar="N,...",
        help="participant counts (default 16,256,4096; 0 for none)",
    )
    p.add_argument(
        "--files", type=counts_list, default=[2000, 8000], metavar="N,...", help="file counts (default 2000,8000)"
    )
    p.add_argument(
        "--threads", type=int, default=8, metavar="N", help="participants (or files) written at a time (default 8)"
    )
    p.add_argument(
        "--destinations",
        type=csv_list,
        default=["local", "s3"],
        metavar="LIST",
        help="comma list of: local (scratch dir on disk), s3 (moto server on loopback); default local,s3",
    )
    p.add_argument(
        "--scratch-dir", default=None, metavar="DIR", help="where the local destination lives (default: temp dir)"
    )
    p.add_argument("--quick", action="store_true", help="tiny run for a smoke test: 2,4 participants, 10,20 files")
    p.add_argument(
        "--out-dir",
        default=DEFAULT_OUT_DIR,
        metavar="DIR",
        help=f"where results are written (default {DEFAULT_OUT_DIR})",
    )
    add_verbose_argument(p)
    return p


def run_store(args: argparse.Namespace) -> int:
    from benchmarks.lib.store_scale import ScalePoint, StoreScaleConfig, result_document, run_sweep, scale_tables
    from rlckpt.bench.harness import destinations, run_metadata
    from rlckpt.bench.report import write_json

    unknown = set(args.destinations) - {"local", "s3"}
    if unknown:
        raise SystemExit(f"benchmarks.store_scale: unknown destinations {sorted(unknown)} (use local, s3)")
    if args.threads < 1:
        raise SystemExit(f"benchmarks.store_scale: --threads must be >= 1, got {args.threads}")
    config = StoreScaleConfig(
        participants=[2, 4] if args.quick else args.participants,
        files=[10, 20] if args.quick else args.files,
        threads=args.threads,
    )
    meta = run_metadata(command_line())

    def show(p: ScalePoint) -> None:
        per = p.per_item(p.commit)
        print(
            f"  {p.destination:<8} {p.count:>6} {p.kind:<12} work {p.work.seconds:8.2f} s  "
            f"commit {p.commit.seconds:8.3f} s ({per['us']:8.1f} µs each, {p.commit.calls} calls)",
            file=sys.stderr,
        )

    with destinations(args.destinations, scratch_root=args.scratch_dir) as dests:
        points = run_sweep(config, dests.destinations, on_point=show)
    out = Path(args.out_dir)
    write_json(out / "store_scale.json", result_document(points, config, meta))
    markdown = scale_tables(points, config.threads)
    (out / "store_scale.md").write_text(
        f"Command: `{meta['command']}` ({meta['date_utc']}, commit {meta.get('git_commit')}, "
        f"load average at start {meta.get('load_average_1m', 0):.1f})\n\n" + markdown
    )
    print(markdown)
    print(f"wrote {out}/store_scale.json, .md", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    return ends_on_sigterm(run_store)(args)


if __name__ == "__main__":
    sys.exit(main())
