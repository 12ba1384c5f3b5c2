"""Reuse of unchanged files: a policy of which half the bytes are frozen, saved again and again by rlckpt with reuse
off (every save full) and on, in the same processes. `python -m benchmarks.reuse --help`; results
benchmarks/results/reuse.{json,md} (docs/benchmarks.md#reuse-of-unchanged-files)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.policy import add_rgw_arguments, destination_names, open_destinations
from rlckpt.bench.args import DEFAULT_OUT_DIR, command_line, csv_list, ends_on_sigterm, int_list
from rlckpt.cli._common import add_verbose_argument, configure_logging

WRITTEN_GOAL, TIME_GOAL = 0.55, 0.60  # issue 40: the second and later saves against a full save

EPILOG = """\
what it does:
  Each rank count is one spawn of ranks (gloo, FSDP2 on a CPU mesh). The policy is an MLP of 8 bf16 layers
  drawn like trained weights (normal, std 0.02); the first 6 are frozen and AdamW trains the other 2, so the
  frozen weights are half of the state's bytes (the moments of the trained layers are the rest). After an
  untimed first save per system, --saves times: one AdamW step, then a save through BundleStorageWriter with
  reuse off (rlckpt: every file written) and with reuse on (rlckpt-reuse: each unchanged file taken from the
  previous bundle, a hard link locally, a server-side copy on S3), alternating which goes first. Written: the
  bytes of files not taken. The last save of each is loaded back into a zeroed state and checked bitwise.
  Goals (issue 40): a reusing save writes <= 0.55x the bytes and takes <= 0.60x the time of a full one.

examples:
  python -m benchmarks.reuse                                     # 1024 MiB x 1,2 ranks x local,moto
  bash scripts/rgw.sh start
  python -m benchmarks.reuse --destinations local,moto,rgw --rgw-endpoint http://127.0.0.1:7480 \
      --rgw-reclaim 'bash scripts/rgw.sh gc' --ranks 1,2,4
  python -m benchmarks.reuse --quick --destinations local --out /tmp/reuse_smoke.json
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks.reuse",
        description="Save a half-frozen sharded policy through rlckpt with and without reuse of unchanged files.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--size", type=float, default=1024.0, metavar="MIB", help="state size in MiB (default 1024)")
    p.add_argument("--ranks", type=int_list, default=[1, 2], metavar="N,...", help="rank counts (default 1,2)")
    p.add_argument("--saves", type=int, default=3, metavar="N", help="timed saves per system (default 3)")
    p.add_argument(
        "--destinations",
        type=csv_list,
        default=["local", "moto"],
        metavar="LIST",
        help="comma list of local, moto, rgw (default local,moto)",
    )
    add_rgw_arguments(p)
    p.add_argument("--scratch-dir", default=None, metavar="DIR", help="where local disk and scratch live")
    p.add_argument("--quick", action="store_true", help="tiny run for a smoke test: 16 MiB, 1 rank, 1 save")
    p.add_argument(
        "--out",
        default=f"{DEFAULT_OUT_DIR}/reuse.json",
        metavar="JSON",
        help="results JSON; the .md goes beside it (default benchmarks/results/reuse.json)",
    )
    p.add_argument("--replot", metavar="JSON", default=None, help="measure nothing: rewrite the .md from a JSON")
    add_verbose_argument(p)
    return p


def _median(records: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in records)


def summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per destination and rank count: each system's medians and the reusing save's ratios."""
    from benchmarks.lib.reuse_bench import FULL, REUSE, SaveRecord

    rows = []
    for where in sorted({(r["destination"], r["ranks"]) for r in records}, key=lambda k: (k[0], k[1])):
        here = [r for r in records if (r["destination"], r["ranks"]) == where]
        full = [r for r in here if r["system"] == FULL]
        reuse = [r for r in here if r["system"] == REUSE]
        if not full or not reuse:
            continue
        written = {
            name: statistics.median(SaveRecord(**r).written_bytes for r in group)
            for name, group in ((FULL, full), (REUSE, reuse))
        }
        rows.append(
            {
                "destination": where[0],
                "ranks": where[1],
                "state_mib": full[0]["state_bytes"] / (1 << 20),
                "full_s": _median(full, "seconds"),
                "reuse_s": _median(reuse, "seconds"),
                "full_written": written[FULL],
                "reuse_written": written[REUSE],
                "written_ratio": written[REUSE] / written[FULL],
                "time_ratio": _median(reuse, "seconds") / _median(full, "seconds"),
                "full_cpu_s": _median(full, "cpu_s"),
                "reuse_cpu_s": _median(reuse, "cpu_s"),
                "verified": all(r.get("verified") is not False for r in here) and any(r.get("verified") for r in here),
            }
        )
    return rows


def markdown(document: dict[str, Any]) -> str:
    meta, rows = document["meta"], summary(document["records"])
    lines = [
        f"Command: `{meta['command']}` ({meta['date_utc']}, commit {meta.get('git_commit')}, load average at start "
        f"{meta.get('load_average_1m', 0):.1f})\n",
        f"Medians of {document['config']['saves']} saves after the first. rlckpt: every file written; rlckpt-reuse: "
        "`BundleStorageWriter(..., reuse=True)`, each file unchanged since the previous bundle taken from it. "
        "Written: bytes of the files not taken. Times are the slowest rank's `dcp.save`; CPU is every rank's "
        "process. The last save of each system is loaded back and checked bitwise.\n",
        "| destination | ranks | state MiB | full save s | reusing save s | time ratio | full written MiB | "
        "reusing written MiB | written ratio | CPU s full / reusing | verified |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['destination']} | {r['ranks']} | {r['state_mib']:.0f} | {r['full_s']:.2f} | {r['reuse_s']:.2f} | "
            f"{r['time_ratio']:.2f} | {r['full_written'] / 2**20:.0f} | {r['reuse_written'] / 2**20:.0f} | "
            f"{r['written_ratio']:.3f} | {r['full_cpu_s']:.1f} / {r['reuse_cpu_s']:.1f} | "
            f"{'yes' if r['verified'] else 'NO'} |"
        )
    lines += ["", "Goals:", "", "| goal | where | measured | met |", "|---|---|---|---|"]
    for r in rows:
        where = f"{r['destination']}, {r['ranks']} rank(s)"
        lines.append(
            f"| written <= {WRITTEN_GOAL:.2f}x a full save | {where} | {r['written_ratio']:.3f} | "
            f"{'yes' if r['written_ratio'] <= WRITTEN_GOAL else 'no'} |"
        )
        lines.append(
            f"| time <= {TIME_GOAL:.2f}x a full save | {where} | {r['time_ratio']:.2f} | "
            f"{'yes' if r['time_ratio'] <= TIME_GOAL else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.lib.reuse_bench import SYSTEMS, ReuseDestination, ReuseJob, reuse_rank
    from rlckpt.bench.harness import run_metadata
    from support.dcp_ranks import run_ranks

    names = destination_names(args, "benchmarks.reuse")
    size, ranks, saves = (16.0, [1], 1) if args.quick else (args.size, args.ranks, args.saves)
    meta = run_metadata(command_line())
    records: list[dict[str, Any]] = []
    with open_destinations(args, names) as (chosen, scratch):
        workdir = tempfile.mkdtemp(prefix="rlckpt-reuse-bench-", dir=scratch)
        for n in ranks:
            dests = [
                ReuseDestination(
                    d.name,
                    "local" if d.storage_options is None else "s3",
                    {s: d.run_url(f"{s}-{n}r") for s in SYSTEMS},
                    d.storage_options,
                    args.rgw_reclaim if "rgw" in d.name else None,
                )
                for d in chosen
            ]
            out = os.path.join(workdir, f"reuse-{n}r.json")
            print(f"benchmarks.reuse: {n} rank(s), {', '.join(d.name for d in dests)}", file=sys.stderr)
            run_ranks(reuse_rank, n, ReuseJob(dests, size, saves, out), timeout=3600)
            records.extend(json.loads(Path(out).read_text()))
    meta["load_average_1m_end"] = os.getloadavg()[0]
    return {
        "benchmark": "reuse",
        "meta": meta,
        "config": {"size_mib": size, "ranks": ranks, "saves": saves},
        "records": records,
    }


def run(args: argparse.Namespace) -> int:
    from benchmarks.lib.results import measure_and_report

    return measure_and_report(args, measure, markdown)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    return ends_on_sigterm(run)(args)


if __name__ == "__main__":
    raise SystemExit(main())
