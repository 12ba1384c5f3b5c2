"""Policy compression: rlckpt.dcp with and without byte planes + zstd, beside the AWS connector and DCP's own
writers, on states drawn like trained weights and on random bits. `python -m benchmarks.compression --help`;
results benchmarks/results/policy_compression.{json,md} (docs/benchmarks.md#policy-compression)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.policy import add_rgw_arguments, destination_names, open_destinations
from rlckpt.bench.args import DEFAULT_OUT_DIR, command_line, csv_list, ends_on_sigterm, float_list, int_list
from rlckpt.cli._common import add_verbose_argument, configure_logging

EPILOG = """\
what it does:
  The sweep of `python -m benchmarks.policy` (same ranks, same processes, every system one after the other,
  each load checked bitwise) with one more system, rlckpt-zstd (BundleStorageWriter(compression="on")), over
  states drawn as --draws says: trained-bf16 / trained-fp32 (weights normal with std 0.02, three AdamW steps:
  real moments), random-bf16 (every bit uniform: the case where compression must cost nothing). Each save
  records the bytes it stored and the CPU its ranks spent. Goals (issue 40): trained bf16 stored <= 0.80x raw,
  S3 save <= 0.85x the connector and <= 0.85x the raw PUT ceiling of the raw bytes (from --ceiling, measured by
  python -m benchmarks.s3_ceiling: RGW direct and through the ETag proxy), load <= 1.10x uncompressed; random
  bits stored <= 1.001x raw, save <= 1.05x uncompressed.

examples:
  python -m benchmarks.compression                                   # 1024 MiB x 1,2 ranks x local,moto
  bash scripts/rgw.sh start
  python -m benchmarks.compression --destinations rgw-proxy --rgw-endpoint http://127.0.0.1:7480 \\
      --rgw-reclaim 'bash scripts/rgw.sh gc' --ranks 1,2,4
  python -m benchmarks.compression --quick --out /tmp/compression_smoke.json
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks.compression",
        description="Save and load a sharded policy through rlckpt with and without byte-plane compression.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", type=float_list, default=[1024.0], metavar="MIB,...", help="state sizes (default 1024)")
    p.add_argument("--ranks", type=int_list, default=[1, 2], metavar="N,...", help="rank counts (default 1,2)")
    p.add_argument(
        "--draws",
        type=csv_list,
        default=["trained-bf16", "trained-fp32", "random-bf16"],
        metavar="LIST",
        help="how the states are drawn: {init,trained,random}-{fp32,bf16} "
        "(default trained-bf16,trained-fp32,random-bf16)",
    )
    p.add_argument(
        "--destinations",
        type=csv_list,
        default=["local", "moto"],
        metavar="LIST",
        help="comma list of local, moto, rgw, rgw-proxy (as benchmarks.policy; default local,moto)",
    )
    add_rgw_arguments(p)
    p.add_argument("--repeats", type=int, default=3, metavar="N", help="save+load repetitions per system (default 3)")
    p.add_argument("--scratch-dir", default=None, metavar="DIR", help="where local disk and scratch live")
    p.add_argument(
        "--ceiling",
        default=f"{DEFAULT_OUT_DIR}/s3_ceiling.json",
        metavar="JSON",
        help="the raw PUT ceiling the S3 saves are held to (default: benchmarks/results/s3_ceiling.json)",
    )
    p.add_argument("--quick", action="store_true", help="tiny run for a smoke test: 4 MiB, 1 rank, 1 repeat")
    p.add_argument(
        "--out",
        default=f"{DEFAULT_OUT_DIR}/policy_compression.json",
        metavar="JSON",
        help="results JSON; the .md goes beside it (default benchmarks/results/policy_compression.json)",
    )
    p.add_argument("--replot", metavar="JSON", default=None, help="measure nothing: rewrite the .md from a JSON")
    add_verbose_argument(p)
    return p


def run(args: argparse.Namespace) -> int:
    from benchmarks.lib import compression_report as report
    from benchmarks.lib.policy import DRAWS, PolicyBenchConfig, points_from_document, result_document, run_sweep
    from rlckpt.bench.harness import run_metadata
    from rlckpt.bench.report import write_json

    out = Path(args.out)
    if args.replot:
        document = json.loads(Path(args.replot).read_text())
    else:
        unknown = sorted(set(args.draws) - set(DRAWS))
        if unknown:
            raise SystemExit(f"benchmarks.compression: unknown draws {unknown} (use {', '.join(DRAWS)})")
        names = destination_names(args, "benchmarks.compression")
        config = PolicyBenchConfig(
            sizes_mib=[4.0] if args.quick else args.sizes,
            ranks=[1] if args.quick else args.ranks,
            repeats=1 if args.quick else args.repeats,
            warm_up=not args.quick,
            rgw_reclaim=args.rgw_reclaim,
            draws=args.draws,
            compress=True,
        )
        meta = run_metadata(command_line())
        with open_destinations(args, names) as (chosen, scratch):
            print(f"benchmarks.compression: {', '.join(d.name for d in chosen)}", file=sys.stderr)
            points = run_sweep(
                config,
                chosen,
                tempfile.mkdtemp(prefix="rlckpt-compression-bench-", dir=scratch),
                on_points=lambda done: write_json(out, result_document(done, config, {**meta, "complete": False})),
                reclaim={d.name: args.rgw_reclaim for d in chosen if args.rgw_reclaim and "rgw" in d.name},
            )
        meta["load_average_1m_end"] = os.getloadavg()[0]
        document = {**result_document(points, config, meta), "benchmark": "compression"}
        write_json(out, document)
    points = points_from_document(document)
    meta = document["meta"]
    checks = report.goals(points, report.ceilings(Path(args.ceiling)))
    markdown = (
        f"Command: `{meta['command']}` ({meta['date_utc']}, commit {meta.get('git_commit')}, load average at start "
        f"{meta.get('load_average_1m', 0):.1f}, at end {meta.get('load_average_1m_end', float('nan')):.1f})\n\n"
        f"Medians of {document['config']['repeats']} repeats. rlckpt: BundleStorageWriter/Reader uncompressed (raw) "
        'and with compression="on" (zstd: byte planes + zstd for each shard file whose first MiB shrinks to 95 %, '
        "raw otherwise); s3tc: s3torchconnector.dcp; fsspec: DCP's FsspecWriter over s3fs; DCP: FileSystemWriter. "
        "Stored: the bytes each checkpoint occupies. Save CPU: every rank's process, user + system, per GiB of state. "
        "Times are the slowest rank's; every load is checked bitwise.\n\n"
        + report.table(points)
        + "\nGoals:\n\n"
        + report.goals_table(checks)
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
    print(f"wrote {out} and {out.with_suffix('.md')}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    return ends_on_sigterm(run)(args)


if __name__ == "__main__":
    raise SystemExit(main())
