"""End-to-end save and restore of a whole bundle against a raw fsspec copy of the same bytes, a fresh
cluster's resume to its first train step (--no-first-step skips it), the train pump's downtime per save
(--async) and two tiers (--two-tier). `python -m benchmarks.save_restore --help`; results
benchmarks/results/save_restore.md, save_downtime.md and save_two_tier_*.md (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlckpt.bench.args import (
    add_destination_arguments,
    check_destinations,
    command_line,
    ends_on_sigterm,
    open_destinations,
)
from rlckpt.cli._common import configure_logging

if TYPE_CHECKING:
    from benchmarks.lib.save_downtime import DowntimeConfig

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
  python -m benchmarks.save_restore              # 256 MiB data plane + 64 MiB policy, local + S3
  python -m benchmarks.save_restore --size 64 --repeats 3 --no-first-step
  python -m benchmarks.save_restore --async --policy-mib 256  # train-pump downtime, sync vs async
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks.save_restore",
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
    add_destination_arguments(p)
    return p


def run_save(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    if args.async_saves:
        return run_save_downtime(args)
    if args.two_tier:
        return run_save_two_tier(args)

    from benchmarks.lib.first_step import measure_first_step
    from benchmarks.lib.save_restore import SaveRestoreConfig, run_save_restore
    from rlckpt.bench.harness import private_transfer_queue, run_metadata
    from rlckpt.bench.report import save_restore_table, write_json
    from rlckpt.dataplane.tq_session import connect_client, reset_tq_state

    check_destinations(args)
    config = SaveRestoreConfig(
        size_mib=2.0 if args.quick else args.size,
        policy_mib=1.0 if args.quick else args.policy_mib,
        repeats=1 if args.quick else args.repeats,
        staging_root=args.staging_dir,
        compress=not args.no_compress,
    )
    meta = run_metadata(command_line())
    print("benchmarks.save_restore: starting Ray + TransferQueue ...", file=sys.stderr)
    first_step = None
    with open_destinations(args) as dests:
        with private_transfer_queue():
            results = run_save_restore(config, dests.destinations, connect=connect_client, reset=reset_tq_state)
        s3 = next((d for d in dests.destinations if d.is_s3), None)
        if s3 is not None and not (args.quick or args.no_first_step):
            print(
                "benchmarks.save_restore: fresh-cluster resume from S3 (two `rlckpt train` runs) ...", file=sys.stderr
            )
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
    return 0


def run_save_downtime(args: argparse.Namespace) -> int:
    import asyncio

    from benchmarks.lib.save_downtime import (
        DowntimeResult,
        downtime_table,
        result_document,
        run_downtime,
    )
    from rlckpt.bench.harness import private_transfer_queue, run_metadata
    from rlckpt.bench.report import write_json
    from rlckpt.checkpoint.row_copy import start_ray_row_copier
    from rlckpt.controller.connect import ConnectOnlyDataPlane
    from rlckpt.dataplane.tq_session import connect_client, reset_tq_state

    check_destinations(args)
    config = _downtime_config(args)
    meta = run_metadata(command_line())

    def show(r: DowntimeResult) -> None:
        print(
            f"  {r.destination:<8} {r.mode:<5} staging {r.median('staging_s') * 1e3:7.0f} ms  "
            f"downtime {r.median('downtime_s') * 1e3:7.0f} ms  ({r.ratio:.2f}x)  "
            f"whole save {r.median('total_s'):.2f} s",
            file=sys.stderr,
        )

    print("python -m benchmarks.save_restore --async: starting Ray + TransferQueue ...", file=sys.stderr)
    keepalive: list[Any] = []
    with (
        private_transfer_queue(),
        open_destinations(args) as dests,
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
    return 0


def _downtime_config(args: argparse.Namespace) -> DowntimeConfig:
    """The save-downtime settings the --async and --two-tier benchmarks share (--quick: one small save)."""
    from benchmarks.lib.save_downtime import DowntimeConfig

    return DowntimeConfig(
        size_mib=2.0 if args.quick else args.size,
        policy_mib=2.0 if args.quick else args.policy_mib,
        repeats=1 if args.quick else args.repeats,
        staging_root=args.staging_dir,
        compress=False if args.no_compress else None,
    )


def run_save_two_tier(args: argparse.Namespace) -> int:
    from benchmarks.lib.two_tiers import run_two_tiers, two_tier_document, two_tier_table
    from rlckpt.bench.harness import private_transfer_queue, run_metadata
    from rlckpt.bench.report import write_json
    from rlckpt.checkpoint.row_copy import start_ray_row_copier
    from rlckpt.controller.connect import ConnectOnlyDataPlane
    from rlckpt.dataplane.tq_session import connect_client, reset_tq_state

    check_destinations(args)
    if set(args.destinations) != {"local", "s3"} and args.rgw_endpoint is None:
        raise SystemExit("benchmarks.save_restore --two-tier: needs --destinations local,s3 (the two tiers)")
    config = _downtime_config(args)
    meta = run_metadata(command_line())
    print("benchmarks.save_restore --two-tier: starting Ray + TransferQueue ...", file=sys.stderr)
    with private_transfer_queue(), open_destinations(args) as dests:
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
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    return ends_on_sigterm(run_save)(args)


if __name__ == "__main__":
    sys.exit(main())
