"""Silent remote: the train step rate of a two-tier run whose remote tier accepts connections and never answers,
against the same run with one tier (issue 24: within 1.2x).

Each run is the controller's real loop, save procedure and retention (`support.controller`, in
process: one trainer rank, the in-memory data plane, the replication worker in a thread instead of a Ray
actor — the same off-the-loop worker). Two tiers: the remote is a moto S3 server behind a forwarder that
goes silent at the first save (`Outage.stall`: it takes every request and answers none), with the
library's own S3 deadlines (a call gives up after 6 tries of 15 s); every replication then waits on it,
and local retention (`--keep-last 2`) runs after every save. The rate is steps per second from the first
save to the last step (the warm-up before it is not measured), saves included. Both ways store the data
plane zstd-compressed (a two-tier run's default with an S3 remote), so they differ only by the remote tier.

    PYTHONPATH=src .venv/bin/python benchmarks/silent_remote.py --steps 60 --repeats 5   # the published run
    PYTHONPATH=src .venv/bin/python benchmarks/silent_remote.py --steps 20 --repeats 1

Results: benchmarks/results/silent_remote.{json,md}; see docs/tiers.md and docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlckpt.bench.harness import run_metadata
from rlckpt.controller.config import TrainConfig
from rlckpt.grpo import GRPOConfig
from rlckpt.s3local import make_s3fs, moto_server, s3_env, s3_options_for
from support.controller import InProcessRun, run_in_process
from support.outage import Outage

TARGET = 1.2  # step time with a silent remote / without a remote tier
RESULTS = Path(__file__).parent / "results"
GRPO = GRPOConfig(group_size=8, prompts_per_step=8)


def one_run(run_dir: str, steps: int, save_every: int, remote: tuple[str, dict[str, Any], Outage] | None) -> dict:
    """One run to `steps`; its step rate, and what the replication did."""
    stamps: dict[int, float] = {}
    events: list[dict[str, Any]] = []
    run = InProcessRun()

    def on_event(event: dict[str, Any]) -> None:
        events.append(event)
        if event.get("event") == "step":
            stamps[event["step"]] = time.perf_counter()

    async def before_commit(step: int) -> None:
        if remote is not None and step == save_every:
            remote[2].stall()  # the remote answered the start (the run's identity, the resume); now it stops
        if remote is not None and step == steps:
            assert run.loop is not None and run.loop.replication is not None
            pending = sorted(run.loop.replication.pending())
            on_event({"event": "still_pending_at_the_last_save", "steps": pending, "held": remote[2].held()})
            remote[2].cut()  # let the waiting calls fail, so the end of the run does not wait out their deadlines
            remote[2].answer()

    extra: dict[str, Any] = {}
    if remote is not None:
        extra = {"replicate_to": remote[0], "replicate_storage_options": remote[1]}
    config = TrainConfig(
        run_dir=run_dir, steps=steps, save_every=save_every, grpo=GRPO, keep_last=2, compress_data_plane=True, **extra
    )
    started = time.perf_counter()
    asyncio.run(run_in_process(config, run=run, on_event=on_event, before_commit=before_commit))
    measured = steps - save_every
    seconds = stamps[steps] - stamps[save_every]
    assert run.summary is not None
    return {
        "steps_per_s": measured / seconds,
        "step_s": seconds / measured,
        "run_s": time.perf_counter() - started,
        "saves": len(run.summary.saves),
        "replicated": run.summary.replicated,
        "replication_failed": sorted(run.summary.replication_failed),
        "pending_at_last_save": next((e for e in events if e["event"] == "still_pending_at_the_last_save"), None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    meta = run_metadata(sys.argv)  # the load average as the runs begin
    rows: dict[str, list[dict[str, Any]]] = {"one tier": [], "two tiers, silent remote": []}
    with moto_server() as endpoint, s3_env(endpoint), tempfile.TemporaryDirectory(prefix="silent-remote-") as tmp:
        options = s3_options_for(endpoint)
        admin = make_s3fs(options)
        for repeat in range(args.repeats):
            local = one_run(f"{tmp}/one-{repeat}", args.steps, args.save_every, None)
            rows["one tier"].append(local)
            print(f"one tier                  run {repeat}: {local['step_s'] * 1e3:.0f} ms/step")
            bucket = f"silent-{repeat}"
            admin.mkdir(bucket)
            with Outage(endpoint) as outage:
                remote = (f"s3://{bucket}/run", {**options, "endpoint_url": outage.endpoint}, outage)
                silent = one_run(f"{tmp}/two-{repeat}", args.steps, args.save_every, remote)
            rows["two tiers, silent remote"].append(silent)
            print(
                f"two tiers, silent remote  run {repeat}: {silent['step_s'] * 1e3:.0f} ms/step "
                f"(replicated {silent['replicated']}, failed {silent['replication_failed']}, "
                f"pending at the last save {silent['pending_at_last_save']})"
            )
    medians = {way: statistics.median(r["step_s"] for r in runs) for way, runs in rows.items()}
    ratio = medians["two tiers, silent remote"] / medians["one tier"]
    # each repeat runs the two ways back to back: their ratio cancels most of a shared machine's drift
    pairs = [two["step_s"] / one["step_s"] for one, two in zip(*rows.values(), strict=True)]
    document = {
        "benchmark": "silent_remote",
        "config": {"steps": args.steps, "save_every": args.save_every, "repeats": args.repeats, "keep_last": 2}
        | {"grpo": {"group_size": GRPO.group_size, "prompts_per_step": GRPO.prompts_per_step}},
        "meta": meta,
        "target": TARGET,
        "runs": rows,
        "median_step_s": medians,
        "ratio": ratio,
        "pair_ratios": pairs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "silent_remote.json").write_text(json.dumps(document, indent=2) + "\n")
    verdict = "met" if ratio <= TARGET else "MISSED"
    table = "\n".join(
        [
            "| way | median step time (saves included) | runs |",
            "|---|---:|---:|",
            *(f"| {way} | {medians[way] * 1e3:.0f} ms | {len(rows[way])} |" for way in rows),
            "",
            f"- step time, silent remote / one tier: {ratio:.2f}x (target <= {TARGET}x) — {verdict}",
            f"- the same, run by run (back to back): {', '.join(f'{p:.2f}x' for p in pairs)}; "
            f"median {statistics.median(pairs):.2f}x",
            f"- load average (1 min) at the start: {meta['load_average_1m']:.1f} on {meta['cpus']} cores",
        ]
    )
    (args.out / "silent_remote.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
