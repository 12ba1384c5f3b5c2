"""`rlckpt bench barrier` and `rlckpt bench save`: the benchmarks of the job users run (code in rlckpt.bench);
every other benchmark is `python -m benchmarks.NAME` (benchmarks/__init__.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rlckpt.bench.args import DEFAULT_OUT_DIR, command_line, csv_list, ends_on_sigterm, float_list
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

SAVE_EPILOG = """\
what it does:
  Fills TransferQueue to --size MiB, then on each destination: saves a whole bundle (policy blob of
  --policy-mib + data plane) through rlckpt and copies the same bytes with plain fsspec; restores
  the bundle through rlckpt (verified, into an emptied TQ) and downloads + loads the raw copy.
  Then (unless --no-first-step) runs the real main job on S3: `rlckpt train` writes a bundle, and a
  second `rlckpt train` on a fresh Ray cluster resumes it; timed from process start to its first
  train step. Writes save_restore.{json,md} to --out-dir.

  With --async it measures instead how long a save blocks the train pump: synchronous saves (the
  whole save) against async ones (begin + policy staging + the window; the rest runs beside
  training), next to the time the policy takes to stage to host memory (real tensors, cloned as
  DCP's async_save stager does). Pinned upload timing. Writes save_downtime.{json,md}.

examples:
  rlckpt bench save                                      # 256 MiB data plane + 64 MiB policy, local + S3
  rlckpt bench save --size 64 --repeats 3 --no-first-step
  rlckpt bench save --async --policy-mib 256             # train-pump downtime, sync vs async
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help=(
            "benchmarks: barrier-window stall (barrier), end-to-end save/restore (save); the others are "
            "python -m benchmarks.NAME (benchmarks/__init__.py lists them)"
        ),
        description="Checkpoint benchmarks on a private local Ray + TransferQueue; results go to --out-dir.",
    )
    sub = parser.add_subparsers(
        dest="bench_command", metavar="BENCHMARK", required=True, parser_class=_common.UsageExitParser
    )
    _add_barrier(sub)
    _add_save(sub)


def _common_bench_args(parser: argparse.ArgumentParser) -> None:
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
    _common.add_verbose_argument(parser)


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
    _common_bench_args(p)
    p.set_defaults(func=ends_on_sigterm(run_barrier))


def _add_save(sub: Any) -> None:
    p = sub.add_parser(
        "save",
        help="end-to-end save and restore of a whole bundle vs a raw fsspec copy",
        description=(
            "End-to-end save and restore time of a whole bundle (policy + data plane) against a raw copy of the "
            "same bytes, and restore on a fresh cluster from S3 to the first train step."
        ),
        epilog=SAVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--size", type=float, default=256.0, metavar="MIB", help="data-plane size in MiB (default 256)")
    p.add_argument("--policy-mib", type=float, default=64.0, metavar="MIB", help="policy blob size in MiB (default 64)")
    p.add_argument("--repeats", type=int, default=2, metavar="N", help="repetitions per destination (default 2)")
    p.add_argument("--no-first-step", action="store_true", help="skip the fresh-cluster `rlckpt train` resume from S3")
    p.add_argument(
        "--async",
        dest="async_saves",
        action="store_true",
        help="measure train-pump downtime per save, synchronous vs async, against policy staging time",
    )
    p.add_argument(
        "--two-tier",
        action="store_true",
        help="measure two tiers (docs/tiers.md): downtime with replication beside the save vs local only and "
        "straight to S3, and the lag from local commit to remote commit",
    )
    p.add_argument("--quick", action="store_true", help="tiny run for a smoke test: 2 MiB, 1 repeat, no first-step run")
    _common_bench_args(p)
    p.set_defaults(func=ends_on_sigterm(run_save))


def _destinations(args: argparse.Namespace) -> Any:
    """The benchmark destinations the command line names (a context manager: S3 servers run inside it)."""
    from rlckpt.bench.harness import destinations

    return destinations(
        args.destinations,
        scratch_root=args.scratch_dir,
        rgw_endpoint=args.rgw_endpoint,
        rgw_key=args.rgw_key,
        rgw_secret=args.rgw_secret,
    )


def _check_destinations(args: argparse.Namespace) -> None:
    unknown = set(args.destinations) - {"local", "s3"}
    if unknown:
        raise SystemExit(
            f"rlckpt bench: unknown destinations {sorted(unknown)} (use local, s3; RGW via --rgw-endpoint)"
        )


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
    _check_destinations(args)
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
        _destinations(args) as dests,
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


def run_save(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    if args.async_saves:
        return run_save_downtime(args)
    if args.two_tier:
        return run_save_two_tier(args)

    from rlckpt.bench.first_step import measure_first_step
    from rlckpt.bench.harness import private_transfer_queue, run_metadata
    from rlckpt.bench.report import save_restore_table, write_json
    from rlckpt.bench.save_restore import SaveRestoreConfig, run_save_restore
    from rlckpt.dataplane.tq_session import connect_client, reset_tq_state

    _check_destinations(args)
    config = SaveRestoreConfig(
        size_mib=2.0 if args.quick else args.size,
        policy_mib=1.0 if args.quick else args.policy_mib,
        repeats=1 if args.quick else args.repeats,
        staging_root=args.staging_dir,
        compress=not args.no_compress,
    )
    meta = run_metadata(command_line())
    print("rlckpt bench save: starting Ray + TransferQueue ...", file=sys.stderr)
    first_step = None
    with _destinations(args) as dests:
        with private_transfer_queue():
            results = run_save_restore(config, dests.destinations, connect=connect_client, reset=reset_tq_state)
        s3 = next((d for d in dests.destinations if d.is_s3), None)
        if s3 is not None and not (args.quick or args.no_first_step):
            print("rlckpt bench save: fresh-cluster resume from S3 (two `rlckpt train` runs) ...", file=sys.stderr)
            first_step = measure_first_step(s3.run_url("train"), s3.storage_options)
    out = Path(args.out_dir)
    document = {
        "benchmark": "save_restore",
        "config": asdict(config),
        "meta": meta,
        "results": [{**asdict(r), "raw_save_s": r.raw_save_s, "raw_restore_s": r.raw_restore_s} for r in results],
        "first_step": asdict(first_step) if first_step else None,
    }
    write_json(out / "save_restore.json", document)
    markdown = save_restore_table(results, first_step)
    (out / "save_restore.md").write_text(f"Command: `{meta['command']}` ({meta['date_utc']})\n\n" + markdown)
    print(markdown)
    print(f"wrote {out}/save_restore.json, .md", file=sys.stderr)
    return _common.EXIT_OK


def run_save_downtime(args: argparse.Namespace) -> int:
    import asyncio

    from rlckpt.bench.harness import private_transfer_queue, run_metadata
    from rlckpt.bench.report import write_json
    from rlckpt.bench.save_downtime import DowntimeConfig, DowntimeResult, downtime_table, result_document, run_downtime
    from rlckpt.checkpoint.row_copy import start_ray_row_copier
    from rlckpt.controller.connect import ConnectOnlyDataPlane
    from rlckpt.dataplane.tq_session import connect_client, reset_tq_state

    _check_destinations(args)
    config = DowntimeConfig(
        size_mib=2.0 if args.quick else args.size,
        policy_mib=2.0 if args.quick else args.policy_mib,
        repeats=1 if args.quick else args.repeats,
        staging_root=args.staging_dir,
        compress=False if args.no_compress else None,
    )
    meta = run_metadata(command_line())

    def show(r: DowntimeResult) -> None:
        print(
            f"  {r.destination:<8} {r.mode:<5} staging {r.median('staging_s') * 1e3:7.0f} ms  "
            f"downtime {r.median('downtime_s') * 1e3:7.0f} ms  ({r.ratio:.2f}x)  "
            f"whole save {r.median('total_s'):.2f} s",
            file=sys.stderr,
        )

    print("rlckpt bench save --async: starting Ray + TransferQueue ...", file=sys.stderr)
    keepalive: list[Any] = []
    with (
        private_transfer_queue(),
        _destinations(args) as dests,
    ):
        reset_tq_state()
        copier = start_ray_row_copier(ConnectOnlyDataPlane())
        try:
            results = asyncio.run(
                run_downtime(connect_client(), config, dests.destinations, copier, keepalive, on_result=show)
            )
        finally:
            keepalive.clear()
            reset_tq_state()
    out = Path(args.out_dir)
    write_json(out / "save_downtime.json", result_document(results, config, meta))
    markdown = downtime_table(results)
    (out / "save_downtime.md").write_text(f"Command: `{meta['command']}` ({meta['date_utc']})\n\n" + markdown)
    print(markdown)
    print(f"wrote {out}/save_downtime.json, .md", file=sys.stderr)
    return _common.EXIT_OK


def run_save_two_tier(args: argparse.Namespace) -> int:
    from rlckpt.bench.harness import private_transfer_queue, run_metadata
    from rlckpt.bench.report import write_json
    from rlckpt.bench.save_downtime import DowntimeConfig
    from rlckpt.bench.two_tiers import run_two_tiers, two_tier_document, two_tier_table
    from rlckpt.checkpoint.row_copy import start_ray_row_copier
    from rlckpt.controller.connect import ConnectOnlyDataPlane
    from rlckpt.dataplane.tq_session import connect_client, reset_tq_state

    _check_destinations(args)
    if set(args.destinations) != {"local", "s3"} and args.rgw_endpoint is None:
        raise SystemExit("rlckpt bench save --two-tier: needs --destinations local,s3 (the two tiers)")
    config = DowntimeConfig(
        size_mib=2.0 if args.quick else args.size,
        policy_mib=2.0 if args.quick else args.policy_mib,
        repeats=1 if args.quick else args.repeats,
        staging_root=args.staging_dir,
        compress=False if args.no_compress else None,
    )
    meta = run_metadata(command_line())
    print("rlckpt bench save --two-tier: starting Ray + TransferQueue ...", file=sys.stderr)
    with private_transfer_queue(), _destinations(args) as dests:
        local = next(d for d in dests.destinations if not d.is_s3)
        remote = next(d for d in reversed(dests.destinations) if d.is_s3)  # RGW when given, else moto
        reset_tq_state()
        copier = start_ray_row_copier(ConnectOnlyDataPlane())
        try:
            result = run_two_tiers(
                connect_client(), config, local, remote, copier, lambda line: print(f"  {line}", file=sys.stderr)
            )
        finally:
            reset_tq_state()
    out = Path(args.out_dir)
    write_json(out / "save_two_tier.json", two_tier_document(result, config, meta))
    markdown = two_tier_table(result)
    (out / "save_two_tier.md").write_text(f"Command: `{meta['command']}` ({meta['date_utc']})\n\n" + markdown)
    print(markdown)
    print(f"wrote {out}/save_two_tier.json, .md", file=sys.stderr)
    return _common.EXIT_OK
