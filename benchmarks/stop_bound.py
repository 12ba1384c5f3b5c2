"""How long `rlckpt train` takes to stop after a SIGTERM, with S3 answering and with S3 silent.

    .venv/bin/python benchmarks/stop_bound.py                      # --grace-seconds 8, one run each
    .venv/bin/python benchmarks/stop_bound.py --grace 8 --grace 20 --repeat 2

Each run is the real main job on a private Ray cluster, saving to a moto S3 server through a TCP
forwarder (support.outage): it is held while batch 3 is generated (step 2 committed, step 3
reached; support.gates), then gets one SIGTERM. With `answering` the final save of step 3
commits; with `silent` the forwarder takes every request from the SIGTERM on and answers none, so the
final save never gets an answer from S3. Measured: SIGTERM to process exit, its exit code, and what
`--json` said. S3 answers again only after the process has exited. The bound the stop promises is
--grace-seconds + STOP_MARGIN_S (docs/cli.md).

Results: benchmarks/results/stop_bound.{json,md}; see docs/benchmarks.md (Stopping on a silent store).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rlckpt.controller.stopping import STOP_MARGIN_S
from rlckpt.s3local import make_s3fs, moto_server, s3_env, s3_options_for
from support.gates import Gate
from support.outage import Outage
from support.train_cli import RUN_TIMEOUT_S, kill_run, train_command

RESULTS = Path(__file__).parent / "results"


def one_stop(endpoint: str, grace_s: float, silent: bool) -> dict[str, Any]:
    """One run, one SIGTERM: seconds from the SIGTERM to the exit, the exit code and the --json line."""
    fs = make_s3fs(s3_options_for(endpoint))
    bucket = f"stop-bound-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    work = Path(tempfile.mkdtemp(prefix="stop-bound-", dir="/tmp"))
    gates, ray_dir = work / "gates", tempfile.mkdtemp(prefix="rlckpt-bench-ray-", dir="/tmp")
    gates.mkdir()
    with Outage(endpoint) as outage:
        options = json.dumps({**s3_options_for(endpoint), "endpoint_url": outage.endpoint})
        cmd = train_command(
            f"s3://{bucket}/run",
            8,
            "--json",
            "--ray-temp-dir",
            ray_dir,
            "--storage-options",
            options,
            "--grace-seconds",
            f"{grace_s:g}",
            module="support.gates",
            prefix=(str(gates), "generate:3"),
        )
        out, err = work / "run.out", work / "run.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            _wait(proc, err, lambda: Gate(str(gates), "generate-3").reached_path.exists())
            _wait(proc, err, lambda: "saved step 2" in err.read_text(errors="replace"))
            if silent:
                outage.stall()
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=RUN_TIMEOUT_S)
            seconds = time.monotonic() - sent
        finally:
            outage.answer()
            kill_run(proc, ray_dir)
            shutil.rmtree(ray_dir, ignore_errors=True)
    lines = out.read_text().strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {}
    shutil.rmtree(work, ignore_errors=True)
    return {
        "s3": "silent" if silent else "answering",
        "grace_s": grace_s,
        "stop_s": round(seconds, 2),
        "bound_s": grace_s + STOP_MARGIN_S,
        "exit_code": code,
        "final_save_aborted": summary.get("final_save_aborted"),
        "last_committed_step": summary.get("last_committed_step"),
    }


def _wait(proc: subprocess.Popen[bytes], err: Path, ready: Any) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the run exited or hung before the stop:\n{err.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grace", type=float, action="append", help="--grace-seconds of the runs (default: 8)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per point (default 1)")
    args = parser.parse_args(argv)
    graces = args.grace or [8.0]
    rows = []
    with moto_server() as endpoint, s3_env(endpoint):
        for grace_s in graces:
            for silent in (False, True):
                for _ in range(args.repeat):
                    rows.append(one_stop(endpoint, grace_s, silent))
                    print(json.dumps(rows[-1]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    record = {"command": sys.argv, "load_average": os.getloadavg(), "runs": rows}
    (RESULTS / "stop_bound.json").write_text(json.dumps(record, indent=2) + "\n")
    table = ["| S3 | --grace-seconds | SIGTERM to exit (s) | bound (s) | exit | final save aborted | resume point |"]
    table.append("|---|---:|---:|---:|---:|---|---:|")
    for row in rows:
        table.append(
            f"| {row['s3']} | {row['grace_s']:g} | {row['stop_s']:.1f} | {row['bound_s']:g} | {row['exit_code']} "
            f"| {row['final_save_aborted']} | {row['last_committed_step']} |"
        )
    (RESULTS / "stop_bound.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
