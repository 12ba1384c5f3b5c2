"""`rlckpt bench barrier`, `rlckpt bench save`, `rlckpt bench policy` and `rlckpt bench store`: the checkpoint
benchmarks (code in rlckpt.bench)."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlckpt.cli import _common

DEFAULT_OUT_DIR = "benchmarks/results"

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


POLICY_EPILOG = """\
what it does:
  For each rank count, spawns that many ranks (gloo on 127.0.0.1, FSDP2 on a CPU mesh) once; for
  each destination and size they build a sharded MLP + AdamW state, then per repeat save and load
  it through every system, rotating which goes first: rlckpt.dcp (BundleStorageWriter/Reader: a
  committed, digest-checked bundle); on local disk DCP's FileSystemWriter/Reader; on S3 DCP's
  FsspecWriter/Reader over s3fs and the AWS connector's s3torchconnector.dcp S3StorageWriter/Reader
  (extra `peers`; skipped with a note when not installed, or when it fails against the server).
  Each time is the slowest rank's (barrier to barrier), each extra memory the largest rank's peak
  RSS over its RSS before (rlckpt's buffer pools counted); every load is checked bitwise. On local
  disk each rank also hashes its DCP shard files with BLAKE3 after DCP's load: DCP's load plus that
  pass is the checked floor. Targets: S3 save <= 0.9x s3torchconnector and <= 0.8x fsspec, S3 load
  <= 0.9x s3torchconnector and <= 0.5x fsspec, S3 extra memory <= fsspec's; local save <= 1.25x DCP,
  local load <= 1.15x the checked floor, local load memory flat in size. Writes
  policy_bench.{json,md,png}.

destinations:
  local       a scratch dir on disk
  moto        S3 on a moto server on loopback
  rgw         the Ceph RGW at --rgw-endpoint, directly (Ceph 16 sends no ETag on
              CompleteMultipartUpload: s3torchconnector fails there and is reported skipped)
  rgw-proxy   the same RGW through a pass-through nginx that adds the ETag (needs nginx; started
              and stopped by the benchmark): every system, rlckpt included, measured through it

examples:
  rlckpt bench policy                                     # 256,1024,2048 MiB x 1,2,4 ranks x local,moto
  rlckpt bench policy --sizes 64 --ranks 2 --destinations moto --repeats 2
  bash scripts/rgw.sh start                               # then the full matrix (a quiet machine, ~hours):
  rlckpt bench policy --sizes 256,1024,2048 --ranks 1,2,4 --destinations local,moto,rgw,rgw-proxy \\
      --rgw-endpoint http://127.0.0.1:7480 --rgw-reclaim 'bash scripts/rgw.sh gc' --repeats 3
  rlckpt bench policy --quick --out /tmp/policy_smoke.json   # tiny, for a smoke run
"""

STORE_EPILOG = """\
what it does:
  For each destination and count N: N participants join one transaction, each writes one 1 KiB
  shard and seals (--threads at a time), then one commit of all; and, separately, one writer writes N
  small files, then commits. Reports time, storage calls (every call on the store's filesystem and its
  files, counted by the fault-injection wrapper of the tests) and, on S3, HTTP requests, each per
  participant or per file: flat columns mean linear growth. No Ray, no TransferQueue.
  Writes store_scale.{json,md} to --out-dir.

examples:
  rlckpt bench store                                      # 16,256,4096 participants; 2000,8000 files
  rlckpt bench store --participants 16,256,4096 --files 0 --destinations local
  rlckpt bench store --quick --out-dir /tmp/smoke         # tiny, for a smoke run
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help=(
            "benchmarks: barrier-window stall (barrier), end-to-end save/restore (save), sharded policy vs DCP "
            "(policy), commit cost by participants and files (store)"
        ),
        description="Checkpoint benchmarks on a private local Ray + TransferQueue; results go to --out-dir.",
    )
    sub = parser.add_subparsers(
        dest="bench_command", metavar="BENCHMARK", required=True, parser_class=_common.UsageExitParser
    )
    _add_barrier(sub)
    _add_save(sub)
    _add_policy(sub)
    _add_store(sub)


def _common_bench_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--destinations",
        type=_csv,
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
        type=_float_csv,
        default=[16.0, 64.0, 256.0],
        metavar="MIB,...",
        help="data-plane sizes in MiB (default 16,64,256)",
    )
    p.add_argument(
        "--upload-timings",
        "--modes",
        dest="upload_timings",
        type=_csv,
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
    p.set_defaults(func=_ends_on_sigterm(run_barrier))


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
    p.set_defaults(func=_ends_on_sigterm(run_save))


def _add_policy(sub: Any) -> None:
    p = sub.add_parser(
        "policy",
        help="sharded policy (FSDP2 + AdamW) save/load: rlckpt.dcp vs DCP's own writer and reader",
        description=(
            "Save and load a sharded model + AdamW state through rlckpt.dcp and through DCP's own "
            "writer/reader, on the same state in the same run."
        ),
        epilog=POLICY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--sizes",
        type=_float_csv,
        default=[256.0, 1024.0, 2048.0],
        metavar="MIB,...",
        help="state sizes (model + AdamW) in MiB (default 256,1024,2048)",
    )
    p.add_argument("--ranks", type=_int_csv, default=[1, 2, 4], metavar="N,...", help="rank counts (default 1,2,4)")
    p.add_argument(
        "--destinations",
        type=_csv,
        default=["local", "moto"],
        metavar="LIST",
        help=(
            "comma list of: local (scratch dir on disk), moto (S3 on a moto server on loopback), "
            "rgw (needs --rgw-endpoint), rgw-proxy (the same RGW through the ETag proxy; needs nginx); "
            "default local,moto"
        ),
    )
    p.add_argument(
        "--rgw-endpoint",
        metavar="URL",
        default=None,
        help="S3 endpoint of a Ceph RGW (scripts/rgw.sh start); with neither rgw nor rgw-proxy listed, implies rgw",
    )
    p.add_argument(
        "--rgw-key", default="testing", metavar="KEY", help="access key for --rgw-endpoint (default testing)"
    )
    p.add_argument(
        "--rgw-secret", default="testing", metavar="SECRET", help="secret key for --rgw-endpoint (default testing)"
    )
    p.add_argument(
        "--rgw-reclaim",
        default=None,
        metavar="COMMAND",
        help=(
            "run COMMAND (untimed) after each measured checkpoint is removed from RGW, so the server frees it "
            "before the next measurement rather than during it, e.g. 'bash scripts/rgw.sh gc'"
        ),
    )
    p.add_argument(
        "--repeats", type=int, default=3, metavar="N", help="save+load repetitions of each system per point (default 3)"
    )
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip the untimed save+load of each system at each size before its repeats",
    )
    p.add_argument(
        "--scratch-dir",
        default=None,
        metavar="DIR",
        help="where the local destination lives (default: system temp dir)",
    )
    p.add_argument(
        "--thread-count",
        type=int,
        default=1,
        metavar="N",
        help="writer threads per rank, the same for every system (DCP's FileSystemWriter default: 1)",
    )
    p.add_argument("--no-verify", action="store_true", help="skip the bitwise check of every load")
    p.add_argument("--quick", action="store_true", help="tiny run for a smoke test: 2 MiB, 1 and 2 ranks, 1 repeat")
    p.add_argument(
        "--out",
        default=f"{DEFAULT_OUT_DIR}/policy_bench.json",
        metavar="JSON",
        help=f"results JSON; the .md and .png go beside it (default {DEFAULT_OUT_DIR}/policy_bench.json)",
    )
    p.add_argument(
        "--replot",
        metavar="JSON",
        default=None,
        help="measure nothing: redraw the table and plot from an earlier results JSON",
    )
    _common.add_verbose_argument(p)
    p.set_defaults(func=_ends_on_sigterm(run_policy))


def _add_store(sub: Any) -> None:
    p = sub.add_parser(
        "store",
        help="commit cost by number of participants, and a writer's cost by number of files (local, S3)",
        description=(
            "Time, storage calls and S3 requests per participant of one commit, and per file of one writer, "
            "as the counts grow: linear growth shows as flat per-item columns."
        ),
        epilog=STORE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--participants",
        type=_counts_csv,
        default=[16, 256, 4096],
        metavar="N,...",
        help="participant counts (default 16,256,4096; 0 for none)",
    )
    p.add_argument(
        "--files", type=_counts_csv, default=[2000, 8000], metavar="N,...", help="file counts (default 2000,8000)"
    )
    p.add_argument(
        "--threads", type=int, default=8, metavar="N", help="participants (or files) written at a time (default 8)"
    )
    p.add_argument(
        "--destinations",
        type=_csv,
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
    _common.add_verbose_argument(p)
    p.set_defaults(func=_ends_on_sigterm(run_store))


def _counts_csv(text: str) -> list[int]:
    """Comma-separated counts; 0 alone means none."""
    try:
        values = [int(x) for x in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected counts >= 0, got {text!r}")
    return [v for v in values if v > 0]


def _int_csv(text: str) -> list[int]:
    try:
        values = [int(x) for x in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _float_csv(text: str) -> list[float]:
    try:
        return [float(x) for x in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _command_line() -> list[str]:
    """The command as typed, for the results: `rlckpt bench ...`, or `python script ...` for a wrapper."""
    argv = sys.argv
    if "bench" in argv:
        return ["rlckpt", *argv[argv.index("bench") :]]
    return ["python", *argv]


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


def _ends_on_sigterm(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A bench run that SIGTERM ends as Ctrl-C does: SystemExit(143) unwinds it, so the servers, clusters and
    ranks it started (moto, the ETag proxy, Ray, spawned ranks) are stopped on its way out, not left behind."""

    @functools.wraps(run)
    def ending(args: argparse.Namespace) -> int:
        def stop(signum: int, frame: Any) -> None:
            raise SystemExit(_common.EXIT_TERMINATED)

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            return run(args)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return ending


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
    from rlckpt.testing.tq import connect_client, reset_tq_state

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
    meta = run_metadata(_command_line())

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
    from rlckpt.testing.tq import connect_client, reset_tq_state

    _check_destinations(args)
    config = SaveRestoreConfig(
        size_mib=2.0 if args.quick else args.size,
        policy_mib=1.0 if args.quick else args.policy_mib,
        repeats=1 if args.quick else args.repeats,
        staging_root=args.staging_dir,
        compress=not args.no_compress,
    )
    meta = run_metadata(_command_line())
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
    from rlckpt.testing.tq import connect_client, reset_tq_state

    _check_destinations(args)
    config = DowntimeConfig(
        size_mib=2.0 if args.quick else args.size,
        policy_mib=2.0 if args.quick else args.policy_mib,
        repeats=1 if args.quick else args.repeats,
        staging_root=args.staging_dir,
        compress=False if args.no_compress else None,
    )
    meta = run_metadata(_command_line())

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
    from rlckpt.testing.tq import connect_client, reset_tq_state

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
    meta = run_metadata(_command_line())
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


def run_policy(args: argparse.Namespace) -> int:
    import contextlib
    import json
    import tempfile

    from rlckpt.bench.destinations import s3_destination
    from rlckpt.bench.digest_speed import DigestSpeed, digest_table, measure_digests
    from rlckpt.bench.etag_proxy import etag_proxy
    from rlckpt.bench.harness import destinations, run_metadata
    from rlckpt.bench.policy import (
        PolicyBenchConfig,
        evaluate_targets,
        points_from_document,
        result_document,
        run_sweep,
    )
    from rlckpt.bench.policy_report import policy_plot, policy_table, proxied_note, skipped_note, targets_summary
    from rlckpt.bench.report import write_json

    out = Path(args.out)
    if args.replot:
        document = json.loads(Path(args.replot).read_text())
        points, meta = points_from_document(document), document["meta"]
        digests = [DigestSpeed(**d) for d in document.get("digests", [])]
        config_doc = document["config"]
    else:
        names = set(args.destinations)
        if args.rgw_endpoint and not names & {"rgw", "rgw-proxy"}:
            names.add("rgw")
        unknown = names - {"local", "moto", "rgw", "rgw-proxy"}
        if unknown:
            raise SystemExit(
                f"rlckpt bench policy: unknown destinations {sorted(unknown)} (use local, moto, rgw, rgw-proxy)"
            )
        if names & {"rgw", "rgw-proxy"} and not args.rgw_endpoint:
            raise SystemExit("rlckpt bench policy: destination rgw needs --rgw-endpoint URL (scripts/rgw.sh start)")
        if args.rgw_reclaim and not args.rgw_endpoint:
            raise SystemExit("rlckpt bench policy: --rgw-reclaim runs after removals from RGW: it needs --rgw-endpoint")
        config = PolicyBenchConfig(
            sizes_mib=[2.0] if args.quick else args.sizes,
            ranks=[1, 2] if args.quick else args.ranks,
            repeats=1 if args.quick else args.repeats,
            verify=not args.no_verify,
            thread_count=args.thread_count,
            warm_up=not args.no_warm_up,
            rgw_reclaim=args.rgw_reclaim,
        )
        config_doc = {
            "thread_count": config.thread_count,
            "repeats": config.repeats,
            "warm_up": config.warm_up,
            "rgw_reclaim": config.rgw_reclaim,
        }
        meta = run_metadata(_command_line())
        digests = measure_digests(mib=4 if args.quick else 256)
        print(digest_table(digests), file=sys.stderr)
        harness_names = [{"local": "local", "moto": "s3"}[n] for n in ("local", "moto") if n in names]
        with contextlib.ExitStack() as stack:
            dests = stack.enter_context(
                destinations(
                    harness_names,
                    scratch_root=args.scratch_dir,
                    rgw_endpoint=args.rgw_endpoint if "rgw" in names else None,
                    rgw_key=args.rgw_key,
                    rgw_secret=args.rgw_secret,
                )
            )
            chosen = list(dests.destinations)
            if "rgw-proxy" in names:
                proxied = stack.enter_context(etag_proxy(args.rgw_endpoint.rstrip("/")))
                via_proxy = s3_destination("s3-rgw-etag-proxy", proxied, args.rgw_key, args.rgw_secret)
                for direct in (d for d in chosen if d.name == "s3-rgw"):  # the connector saves there, loads direct
                    direct.s3tc_save_options = via_proxy.storage_options
                chosen.append(via_proxy)
            print(
                f"rlckpt bench policy: {', '.join(d.name for d in chosen)} x {config.ranks} ranks "
                f"x {config.sizes_mib} MiB",
                file=sys.stderr,
            )
            measured: list[Any] = []
            failed: dict[str, str] = {}

            def keep(points: list[Any]) -> None:  # what a later failure or kill cannot take away
                measured.extend(points)
                write_json(out, result_document(measured, config, {**meta, "complete": False}, digests))

            def lost(ranks: int, exc: Exception) -> None:
                failed[f"{ranks} ranks"] = _last_line(exc)
                print(f"rlckpt bench policy: {ranks} ranks not measured: {failed[f'{ranks} ranks']}", file=sys.stderr)

            points = run_sweep(
                config,
                chosen,
                tempfile.mkdtemp(prefix="rlckpt-policy-bench-", dir=dests.scratch),
                on_points=keep,
                on_failure=lost,
                reclaim={d.name: config.rgw_reclaim for d in chosen if config.rgw_reclaim and "rgw" in d.name},
            )
        meta["load_average_1m_end"] = os.getloadavg()[0]
        meta["not_measured"] = failed
        write_json(out, result_document(points, config, meta, digests))
    settings = (
        f"Medians of {config_doc.get('repeats')} repeats"
        + (", after an untimed save and load of each system at each size" if config_doc.get("warm_up") else "")
        + (
            f"; after each removal from RGW, `{config_doc['rgw_reclaim']}` freed it (untimed)"
            if config_doc.get("rgw_reclaim")
            else ""
        )
        + "; writer threads per rank: "
        f"{config_doc.get('thread_count', 1)} for every system. rlckpt: standalone BundleStorageWriter/"
        "BundleStorageReader (BLAKE3 of every file as it passes, fsync on local disk, one commit). Local disk: DCP's "
        "FileSystemWriter (sync_files=True) / FileSystemReader, and the checked floor (DCP's load plus one BLAKE3 "
        "pass over the shard files, measured after each DCP load). S3: DCP's FsspecWriter (sync_files=False) / "
        "FsspecReader over s3fs (fsspec), and s3torchconnector.dcp's S3StorageWriter/Reader (s3tc; its CRT "
        "client, 8 MiB parts). Times are the slowest rank's; +MiB is the largest rank's peak RSS over its RSS "
        "before the operation (rlckpt's pooled buffers counted as its own). Ratios: rlckpt over the other (below 1: "
        "rlckpt faster or smaller); **bold** misses its target. s3-rgw is Ceph RGW reached directly, "
        "s3-rgw-etag-proxy the same RGW through the nginx that adds the ETag header Ceph 16 omits; on s3-rgw, "
        "when both are measured, the connector saves through the proxy and loads direct (its saves in parentheses, "
        "not compared).\n\n"
    )
    note = (
        skipped_note(points)
        + proxied_note(points)
        + "".join(f"- {what}: failed: {why}\n" for what, why in meta.get("not_measured", {}).items())
    )
    markdown = (
        settings
        + policy_table(points)
        + (f"\nNot measured, or not compared:\n\n{note}" if note else "")
        + "\nTargets (rlckpt's median against each, every point):\n\n"
        + targets_summary(evaluate_targets(points))
        + "\nDigest throughput on this machine (one process, a buffer in memory; the store's own hashers):\n\n"
        + digest_table(digests)
    )
    out.with_suffix(".md").write_text(
        f"Command: `{meta['command']}` ({meta['date_utc']}, commit {meta.get('git_commit')}, "
        f"load average at start {meta.get('load_average_1m', 0):.1f}, at end "
        f"{meta.get('load_average_1m_end', float('nan')):.1f})\n\n" + markdown
    )
    wrote = [out, out.with_suffix(".md")]
    if points:  # nothing measured (every spawn failed): the table says so, there is nothing to draw
        wrote.append(policy_plot(points, out.with_suffix(".png")))
    print(markdown)
    print(f"wrote {', '.join(map(str, wrote))}", file=sys.stderr)
    return _common.EXIT_OK


def _last_line(exc: BaseException) -> str:
    """The cause of a failed spawn in one line: the last line of its message (the failing rank's own error)."""
    lines = [line.strip() for line in str(exc).replace("\\n", "\n").splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def run_store(args: argparse.Namespace) -> int:
    from rlckpt.bench.harness import destinations, run_metadata
    from rlckpt.bench.report import write_json
    from rlckpt.bench.store_scale import ScalePoint, StoreScaleConfig, result_document, run_sweep, scale_tables

    unknown = set(args.destinations) - {"local", "s3"}
    if unknown:
        raise SystemExit(f"rlckpt bench store: unknown destinations {sorted(unknown)} (use local, s3)")
    if args.threads < 1:
        raise SystemExit(f"rlckpt bench store: --threads must be >= 1, got {args.threads}")
    config = StoreScaleConfig(
        participants=[2, 4] if args.quick else args.participants,
        files=[10, 20] if args.quick else args.files,
        threads=args.threads,
    )
    meta = run_metadata(_command_line())

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
    return _common.EXIT_OK
