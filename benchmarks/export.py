"""`rlckpt export`'s cost: a sharded fp32 model saved by N ranks, exported to safetensors in one fresh process, beside
a raw read of the same files in another. `python -m benchmarks.export --help`; results
benchmarks/results/export.{json,md} (docs/benchmarks.md#rlckpt-export)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks.policy import add_rgw_arguments, destination_names, open_destinations
from rlckpt.bench.args import DEFAULT_OUT_DIR, command_line, csv_list, ends_on_sigterm, float_list, int_list
from rlckpt.cli._common import add_verbose_argument, configure_logging

TIME_GOAL = 1.2  # issue 41: an export takes at most 1.2x the raw read of the same bytes
RSS_SLACK = 256 << 20  # and its peak RSS is at most the largest tensor + one shard + 256 MiB

EPILOG = """\
what it does:
  For each rank count and size, the ranks (gloo, FSDP2 on a CPU mesh) save an MLP of 8 fp32 layers (weights only:
  what an export takes) as bundle 1 through BundleStorageWriter. Then, each in a fresh process: a raw read of every
  file under policy/ into one reused buffer (no digest, no torch: the floor), a raw copy (that read written to
  one local file and fsynced: the floor of anything that writes the bytes), and `rlckpt.export_safetensors` of
  the bundle to a local directory (every file digest-checked, each tensor consolidated whole, written as one
  safetensors file under the default 5 GB shard size). Each child's peak RSS is its VmHWM (/proc/self/status),
  and held against a third child that only makes the export's imports (torch alone is ~300 MiB).
  Goals (issue 41): export <= 1.2x the raw read's time; peak RSS <= largest tensor + shard size + 256 MiB.

examples:
  python -m benchmarks.export                          # 1024,4096 MiB x 2,4 ranks x local,moto
  python -m benchmarks.export --quick --destinations local --out /tmp/export_smoke.json
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks.export",
        description="Export a sharded policy to safetensors and read the same bytes raw: time and peak memory.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", type=float_list, default=[1024.0, 4096.0], metavar="MIB,...", help="model sizes")
    p.add_argument("--ranks", type=int_list, default=[2, 4], metavar="N,...", help="rank counts that save")
    p.add_argument("--destinations", type=csv_list, default=["local", "moto"], metavar="LIST", help="local, moto, rgw")
    add_rgw_arguments(p, reclaim=False)
    p.add_argument("--scratch-dir", default=None, metavar="DIR", help="where local disk, exports and scratch live")
    p.add_argument("--quick", action="store_true", help="tiny run for a smoke test: 16 MiB, 2 ranks")
    p.add_argument(
        "--out",
        default=f"{DEFAULT_OUT_DIR}/export.json",
        metavar="JSON",
        help="results JSON; the .md goes beside it (default benchmarks/results/export.json)",
    )
    p.add_argument("--replot", metavar="JSON", default=None, help="measure nothing: rewrite the .md from a JSON")
    add_verbose_argument(p)
    return p


def _child(*args: str) -> tuple[dict[str, Any], int]:
    """Run `python -m benchmarks.lib.export_bench ARGS` and return what it printed and its peak RSS in bytes (its
    own VmHWM, read by the child as it ends)."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.lib.export_bench", *args], stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks.lib.export_bench {args[0]} exited {done.returncode}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result, int(result["peak_rss"])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.lib.export_bench import SaveJob, largest_tensor_bytes, save_rank
    from rlckpt.bench.harness import run_metadata
    from rlckpt.export import DEFAULT_MAX_SHARD_SIZE
    from support.dcp_ranks import run_ranks

    names = destination_names(args, "benchmarks.export")
    sizes, ranks = ([16.0], [2]) if args.quick else (args.sizes, args.ranks)
    meta = run_metadata(command_line())
    points: list[dict[str, Any]] = []
    _, baseline_rss = _child("baseline")
    with open_destinations(args, names) as (chosen, scratch):
        for dest in chosen:
            for n in ranks:
                for size in sizes:
                    url = dest.run_url(f"export-{n}r-{size:g}")
                    run_ranks(save_rank, n, SaveJob(url, dest.storage_options, size), timeout=3600)
                    options = json.dumps(dest.storage_options or {})
                    raw, raw_rss = _child("raw", url, options)
                    out = tempfile.mkdtemp(prefix="rlckpt-export-bench-", dir=scratch)
                    copied, _ = _child("copy", url, options, os.path.join(out, "copy.bin"))
                    shutil.rmtree(out)
                    exported, export_rss = _child("export", url, options, out)
                    largest = largest_tensor_bytes(url, dest.storage_options)
                    shard = min(DEFAULT_MAX_SHARD_SIZE, exported["bytes"])
                    point = {
                        "destination": dest.name,
                        "ranks": n,
                        "size_mib": size,
                        "model_bytes": exported["bytes"],
                        "raw_s": raw["seconds"],
                        "export_s": exported["seconds"],
                        "time_ratio": exported["seconds"] / raw["seconds"],
                        "copy_s": copied["seconds"],
                        "copy_ratio": exported["seconds"] / copied["seconds"],
                        "raw_peak_rss": raw_rss,
                        "export_peak_rss": export_rss,
                        "baseline_rss": baseline_rss,  # the same imports, nothing read
                        "export_extra_rss": export_rss - baseline_rss,
                        "rss_bound": largest + shard + RSS_SLACK,
                        "largest_tensor": largest,
                    }
                    points.append(point)
                    print(
                        f"  {dest.name:<10} {n} ranks {size:>6g} MiB: raw {raw['seconds']:6.2f} s, copy "
                        f"{copied['seconds']:6.2f} s, export {exported['seconds']:6.2f} s ({point['time_ratio']:.2f}x "
                        f"the read, {point['copy_ratio']:.2f}x the copy), peak RSS "
                        f"{export_rss / 2**20:.0f} MiB, {point['export_extra_rss'] / 2**20:.0f} over its imports "
                        f"(bound {point['rss_bound'] / 2**20:.0f})",
                        flush=True,
                    )
                    shutil.rmtree(out, ignore_errors=True)
                    _remove_run(url, dest.storage_options)
    meta["load_average_1m_end"] = os.getloadavg()[0]
    return {"benchmark": "export", "meta": meta, "config": {"sizes_mib": sizes, "ranks": ranks}, "points": points}


def _remove_run(url: str, options: dict[str, Any] | None) -> None:
    """Drop a measured run (moto keeps objects in RAM)."""
    from rlckpt.store import BundleStore

    store = BundleStore(url, options)
    if options is None:
        shutil.rmtree(url, ignore_errors=True)
    else:
        store.fs.rm(store.root, recursive=True)


def markdown(document: dict[str, Any]) -> str:
    meta = document["meta"]
    lines = [
        f"Command: `{meta['command']}` ({meta['date_utc']}, commit {meta.get('git_commit')}, load average at start "
        f"{meta.get('load_average_1m', 0):.1f})\n",
        "One export per point, in a fresh process, beside a raw read of the same files in another (no digest, no "
        "torch) and a raw copy (that read written to one local file, fsynced: what any export that writes its "
        "bytes costs at least). The model is fp32 weights only, saved by the ranks through BundleStorageWriter; "
        "the export writes one safetensors file (5 GB shards). Peak RSS is each child's VmHWM.\n",
        "| destination | saved by | model MiB | raw read s | raw copy s | export s | / read | / copy | export peak "
        "RSS MiB (over its imports) | bound MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in document["points"]:
        lines.append(
            f"| {p['destination']} | {p['ranks']} ranks | {p['model_bytes'] / 2**20:.0f} | {p['raw_s']:.2f} | "
            f"{p['copy_s']:.2f} | {p['export_s']:.2f} | {p['time_ratio']:.2f} | {p['copy_ratio']:.2f} | "
            f"{p['export_peak_rss'] / 2**20:.0f} "
            f"({p['export_extra_rss'] / 2**20:.0f}) | {p['rss_bound'] / 2**20:.0f} |"
        )
    lines += ["", "Goals:", "", "| goal | where | measured | met |", "|---|---|---|---|"]
    for p in document["points"]:
        where = f"{p['destination']}, {p['ranks']} ranks, {p['model_bytes'] / 2**20:.0f} MiB"
        lines.append(
            f"| export <= {TIME_GOAL:.1f}x the raw read | {where} | {p['time_ratio']:.2f} | "
            f"{'yes' if p['time_ratio'] <= TIME_GOAL else 'no'} |"
        )
        rss_met = "yes" if p["export_extra_rss"] <= p["rss_bound"] else "no"
        lines.append(
            f"| peak RSS over its imports <= largest tensor + shard + 256 MiB | {where} | "
            f"{p['export_extra_rss'] / 2**20:.0f} MiB | {rss_met} |"
        )
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from benchmarks.lib.results import measure_and_report

    return measure_and_report(args, measure, markdown)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    return ends_on_sigterm(run)(args)


if __name__ == "__main__":
    raise SystemExit(main(argv=None))
