"""Sharded policy (FSDP2 + AdamW) save and load: rlckpt.dcp against DCP's own writer/reader and the AWS
connector, on the same state in the same run. `python -m benchmarks.policy --help`; results
benchmarks/results/policy_bench.{json,md,png} (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlckpt.bench.args import (
    DEFAULT_OUT_DIR,
    command_line,
    csv_list,
    ends_on_sigterm,
    float_list,
    int_list,
)
from rlckpt.cli._common import add_verbose_argument, configure_logging

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
  python -m benchmarks.policy                                     # 256,1024,2048 MiB x 1,2,4 ranks x local,moto
  python -m benchmarks.policy --sizes 64 --ranks 2 --destinations moto --repeats 2
  bash scripts/rgw.sh start                               # then the full matrix (a quiet machine, ~hours):
  python -m benchmarks.policy --sizes 256,1024,2048 --ranks 1,2,4 --destinations local,moto,rgw,rgw-proxy \\
      --rgw-endpoint http://127.0.0.1:7480 --rgw-reclaim 'bash scripts/rgw.sh gc' --repeats 3
  python -m benchmarks.policy --quick --out /tmp/policy_smoke.json   # tiny, for a smoke run
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks.policy",
        description=(
            "Save and load a sharded model + AdamW state through rlckpt.dcp and through DCP's own "
            "writer/reader, on the same state in the same run."
        ),
        epilog=POLICY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--sizes",
        type=float_list,
        default=[256.0, 1024.0, 2048.0],
        metavar="MIB,...",
        help="state sizes (model + AdamW) in MiB (default 256,1024,2048)",
    )
    p.add_argument("--ranks", type=int_list, default=[1, 2, 4], metavar="N,...", help="rank counts (default 1,2,4)")
    p.add_argument(
        "--destinations",
        type=csv_list,
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
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        default=None,
        help=(
            "measure nothing: write --out from earlier results JSONs (lane by lane runs), keeping for each "
            "destination, ranks and size the point of the latest run; each row names its run"
        ),
    )
    add_verbose_argument(p)
    return p


def add_rgw_arguments(p: argparse.ArgumentParser, reclaim: bool = True) -> None:
    """--rgw-endpoint, --rgw-key, --rgw-secret (and --rgw-reclaim): how a benchmark reaches a Ceph RGW."""
    p.add_argument("--rgw-endpoint", metavar="URL", default=None, help="S3 endpoint of a Ceph RGW (scripts/rgw.sh)")
    p.add_argument("--rgw-key", default="testing", metavar="KEY", help="access key for --rgw-endpoint")
    p.add_argument("--rgw-secret", default="testing", metavar="SECRET", help="secret key for --rgw-endpoint")
    if reclaim:
        p.add_argument(
            "--rgw-reclaim", default=None, metavar="COMMAND", help="run after each removal from RGW (untimed)"
        )


def destination_names(args: argparse.Namespace, prog: str) -> set[str]:
    """The destinations asked for (--destinations, and rgw implied by --rgw-endpoint); SystemExit on a bad mix."""
    names = set(args.destinations)
    if args.rgw_endpoint and not names & {"rgw", "rgw-proxy"}:
        names.add("rgw")
    unknown = names - {"local", "moto", "rgw", "rgw-proxy"}
    if unknown:
        raise SystemExit(f"{prog}: unknown destinations {sorted(unknown)} (use local, moto, rgw, rgw-proxy)")
    if names & {"rgw", "rgw-proxy"} and not args.rgw_endpoint:
        raise SystemExit(f"{prog}: destination rgw needs --rgw-endpoint URL (scripts/rgw.sh start)")
    if getattr(args, "rgw_reclaim", None) and not args.rgw_endpoint:
        raise SystemExit(f"{prog}: --rgw-reclaim runs after removals from RGW: it needs --rgw-endpoint")
    return names


@contextlib.contextmanager
def open_destinations(args: argparse.Namespace, names: set[str]) -> Iterator[tuple[list[Any], str]]:
    """The destinations `names` up for the block (a moto server, the ETag proxy before RGW: stopped after it),
    and the scratch dir beside them. With rgw-proxy, the connector saves to s3-rgw through the proxy."""
    from benchmarks.lib.etag_proxy import etag_proxy
    from rlckpt.bench.destinations import s3_destination
    from rlckpt.bench.harness import destinations

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
        yield chosen, str(dests.scratch)


def run_policy(args: argparse.Namespace) -> int:
    import json
    import tempfile

    from benchmarks.lib.digest_speed import DigestSpeed, digest_table, measure_digests
    from benchmarks.lib.policy import (
        PolicyBenchConfig,
        evaluate_targets,
        points_from_document,
        result_document,
        run_sweep,
    )
    from benchmarks.lib.policy_report import policy_plot, policy_table, proxied_note, skipped_note, targets_summary
    from rlckpt.bench.harness import run_metadata
    from rlckpt.bench.report import write_json

    out = Path(args.out)
    runs: list[dict[str, Any]] = []
    if args.merge:
        from benchmarks.lib.policy_merge import merge_documents  # MergeRefused is a ValueError

        try:
            merged = merge_documents([json.loads(Path(f).read_text()) for f in args.merge])
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"benchmarks.policy: --merge: {exc}") from None
        points, digests, config_doc, runs = merged.points, merged.digests, merged.config, merged.runs
        meta = {**run_metadata(command_line()), "merged_runs": runs, "not_measured": {}}
        meta["load_average_1m_end"] = meta["load_average_1m"]
        write_json(out, result_document(points, PolicyBenchConfig(**config_doc), meta, digests))
    elif args.replot:
        document = json.loads(Path(args.replot).read_text())
        points, meta = points_from_document(document), document["meta"]
        digests = [DigestSpeed(**d) for d in document.get("digests", [])]
        config_doc = document["config"]
        runs = meta.get("merged_runs", [])
    else:
        names = destination_names(args, "benchmarks.policy")
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
        meta = run_metadata(command_line())
        digests = measure_digests(mib=4 if args.quick else 256)
        print(digest_table(digests), file=sys.stderr)
        with open_destinations(args, names) as (chosen, scratch):
            print(
                f"benchmarks.policy: {', '.join(d.name for d in chosen)} x {config.ranks} ranks "
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
                print(f"benchmarks.policy: {ranks} ranks not measured: {failed[f'{ranks} ranks']}", file=sys.stderr)

            points = run_sweep(
                config,
                chosen,
                tempfile.mkdtemp(prefix="rlckpt-policy-bench-", dir=scratch),
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
    from benchmarks.lib.policy_merge import runs_list

    merged_from = (
        f"Merged from {len(runs)} runs, each point from the latest run that measured it (its `run` column):\n\n"
        + runs_list(runs)
        + "\n"
        if runs
        else ""
    )
    markdown = (
        merged_from
        + settings
        + policy_table(points)
        + (f"\nNot measured, or not compared:\n\n{note}" if note else "")
        + "\nTargets (rlckpt's median against each, every point):\n\n"
        + targets_summary(evaluate_targets(points))
        + "\nDigest throughput on this machine (one process, a buffer in memory; the store's own hashers):\n\n"
        + digest_table(digests)
    )
    out.parent.mkdir(parents=True, exist_ok=True)  # --replot into a new directory writes nothing else first
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
    return 0


def _last_line(exc: BaseException) -> str:
    """The cause of a failed spawn in one line: the last line of its message (the failing rank's own error)."""
    lines = [line.strip() for line in str(exc).replace("\\n", "\n").splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    return ends_on_sigterm(run_policy)(args)


if __name__ == "__main__":
    sys.exit(main())
