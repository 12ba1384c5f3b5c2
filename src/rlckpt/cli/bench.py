"""`rlckpt bench barrier`: how long finished rollouts stall while a checkpoint is saved, the benchmark of the
job users run (code in rlckpt.bench); every other benchmark is `python -m benchmarks.NAME` (benchmarks/__init__.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rlckpt.bench.args import (
    add_destination_arguments,
    check_destinations,
    command_line,
    csv_list,
    ends_on_sigterm,
    float_list,
    open_destinations,
)
from rlckpt.cli import _common

BARRIER_EPILOG = """\
what it does:
  Starts a private Ray cluster with TransferQueue, fills the data plane through the replay buffer
  to each size, then for each destination x upload timing runs a rollout pump (RATE groups/s,
  oldest groups trimmed so the size stays put) and saves every GAP seconds through rlckpt's real
  save path.
  upload timings: inline = TQ snapshot *and upload* inside the barrier window (how the reference
  implementation saves, see docs/architecture.md); staged = snapshot to local staging inside the
  window, upload after it; pinned = only the index is captured (no window at all), the captured
  rows are copied and uploaded afterwards while commits go on (rlckpt's default).
  Reports each commit's wait at the barrier (outside saves / during saves), each whole commit (put
  included: a copy reading the data plane can slow puts), the window, the snapshot (TQ's own, or the
  pinned copy) and the whole save; writes barrier_stall.{json,md,png} to --out-dir.

examples:
  rlckpt bench barrier                                   # 16/64/256 MiB x local/S3(moto) x inline/staged
  rlckpt bench barrier --sizes 16,64 --saves 5
  rlckpt bench barrier --rgw-endpoint http://127.0.0.1:7480   # adds Ceph RGW (scripts/rgw.sh start)
  rlckpt bench barrier --quick --out-dir /tmp/smoke      # tiny, for a smoke run
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help=(
            "the barrier-window stall benchmark (barrier); every other benchmark is python -m benchmarks.NAME "
            "(benchmarks/__init__.py lists them)"
        ),
        description="Checkpoint benchmarks on a private local Ray + TransferQueue; results go to --out-dir.",
    )
    sub = parser.add_subparsers(
        dest="bench_command", metavar="BENCHMARK", required=True, parser_class=_common.UsageExitParser
    )
    _add_barrier(sub)


def _add_barrier(sub: Any) -> None:
    p = sub.add_parser(
        "barrier",
        help="rollout commit stall while a save holds the barrier window",
        description=(
            "How long finished rollouts wait at commit while a checkpoint is saved, by data-plane size, "
            "destination and upload timing."
        ),
        epilog=BARRIER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--sizes",
        type=float_list,
        default=[16.0, 64.0, 256.0],
        metavar="MIB,...",
        help="data-plane sizes in MiB (default 16,64,256)",
    )
    p.add_argument(
        "--upload-timings",
        "--modes",
        dest="upload_timings",
        type=csv_list,
        default=["inline", "staged", "pinned"],
        metavar="LIST",
        help="when the data plane is snapshotted and uploaded: inline,staged,pinned (default all; --modes too)",
    )
    p.add_argument("--saves", type=int, default=3, metavar="N", help="saves per point (default 3)")
    p.add_argument(
        "--save-gap", type=float, default=2.0, metavar="SECONDS", help="idle time between saves (default 2.0)"
    )
    p.add_argument(
        "--rate", type=float, default=20.0, metavar="GROUPS_PER_S", help="commit rate of the rollout pump (default 20)"
    )
    p.add_argument(
        "--policy-mib", type=float, default=16.0, metavar="MIB", help="policy blob written by each save (default 16)"
    )
    p.add_argument("--quick", action="store_true", help="tiny run for a smoke test: 1 and 2 MiB, 1 save, short gaps")
    p.add_argument(
        "--replot",
        metavar="JSON",
        default=None,
        help="measure nothing: redraw the table and plot from an earlier barrier_stall.json into --out-dir",
    )
    add_destination_arguments(p)
    p.set_defaults(func=ends_on_sigterm(run_barrier))


def run_barrier(args: argparse.Namespace) -> int:
    from rlckpt.bench.barrier import (
        BarrierConfig,
        evaluate_targets,
        result_document,
        run_sweep,
    )
    from rlckpt.bench.harness import private_transfer_queue, run_metadata
    from rlckpt.bench.report import (
        barrier_plot,
        barrier_table,
        targets_table,
        write_json,
    )
    from rlckpt.checkpoint.row_copy import start_ray_row_copier
    from rlckpt.controller.connect import ConnectOnlyDataPlane
    from rlckpt.dataplane.tq_session import connect_client, reset_tq_state

    if args.replot:
        return _replot(args)
    check_destinations(args)
    bad = set(args.upload_timings) - {"inline", "staged", "pinned"}
    if bad:
        raise SystemExit(f"rlckpt bench barrier: unknown upload timings {sorted(bad)} (use inline, staged, pinned)")
    config = BarrierConfig(
        sizes_mib=[1.0, 2.0] if args.quick else args.sizes,
        upload_timings=args.upload_timings,
        saves=1 if args.quick else args.saves,
        save_gap_s=0.3 if args.quick else args.save_gap,
        warmup_s=0.2 if args.quick else 1.0,
        tail_s=0.2 if args.quick else 0.5,
        commit_rate=args.rate,
        policy_mib=1.0 if args.quick else args.policy_mib,
        staging_root=args.staging_dir,
        compress=not args.no_compress,
    )
    meta = run_metadata(command_line())

    def show(p: Any) -> None:
        d = p.commits_during_save
        print(
            f"  {p.size_mib:>6g} MiB  {p.destination:<8} {p.upload_timing:<7} "
            f"stall p99 {d.p99_ms:8.1f} ms  max {d.max_ms:8.1f} ms  "
            f"window {p.window_ms:8.1f} ms  snapshot {p.snapshot_ms:8.1f} ms",
            file=sys.stderr,
        )

    print("rlckpt bench barrier: starting Ray + TransferQueue ...", file=sys.stderr)
    with (
        private_transfer_queue(),
        open_destinations(args) as dests,
    ):
        copier = start_ray_row_copier(ConnectOnlyDataPlane()) if "pinned" in config.upload_timings else None
        points = run_sweep(
            config, dests.destinations, connect=connect_client, reset=reset_tq_state, on_point=show, row_copier=copier
        )
    out = Path(args.out_dir)
    document = result_document(points, config, meta)
    write_json(out / "barrier_stall.json", document)
    markdown = barrier_table(points) + "\n" + targets_table(evaluate_targets(points))
    (out / "barrier_stall.md").write_text(f"Command: `{meta['command']}` ({meta['date_utc']})\n\n" + markdown)
    barrier_plot(points, out / "barrier_stall.png")
    print(markdown)
    print(f"wrote {out}/barrier_stall.json, .md, .png", file=sys.stderr)
    return _common.EXIT_OK


def _replot(args: argparse.Namespace) -> int:
    """Table and plot again from a results JSON (e.g. after a change to the plot), keeping its command line."""
    import json

    from rlckpt.bench.barrier import evaluate_targets, points_from_document
    from rlckpt.bench.report import barrier_plot, barrier_table, targets_table

    document = json.loads(Path(args.replot).read_text())
    points = points_from_document(document)
    meta = document["meta"]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    markdown = barrier_table(points) + "\n" + targets_table(evaluate_targets(points))
    (out / "barrier_stall.md").write_text(f"Command: `{meta['command']}` ({meta['date_utc']})\n\n" + markdown)
    barrier_plot(points, out / "barrier_stall.png")
    print(markdown)
    return _common.EXIT_OK
