"""`rlckpt train` as a subprocess, for the end-to-end tests and the benchmarks: one command builder,
one runner that returns the `--json` summary, and the kill of a run that must not outlive its test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RUN_TIMEOUT_S = 420  # one run: Ray and TransferQueue start-up dominate (≈30-45 s on 2 cores)


def train_command(
    run_dir: str,
    steps: int,
    *extra: str,
    save_every: int = 2,
    module: str = "rlckpt.cli.main",
    prefix: tuple[str, ...] = (),
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """`python -m MODULE PREFIX... train --run-dir RUN_DIR --steps STEPS --save-every N EXTRA...`."""
    cmd = [
        sys.executable,
        "-m",
        module,
        *prefix,
        "train",
        "--run-dir",
        run_dir,
        "--steps",
        str(steps),
        "--save-every",
        str(save_every),
        *extra,
    ]
    if storage_options:
        cmd += ["--storage-options", json.dumps(storage_options)]
    return cmd


def run_train(run_dir: str, steps: int, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `rlckpt train ... --json` to completion; its summary. AssertionError with the stderr tail if it fails."""
    cmd = train_command(run_dir, steps, *extra, "--json")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary


def kill_run(proc: subprocess.Popen[bytes], ray_dir: str) -> None:
    """SIGKILL the driver started with ``start_new_session=True`` and every Ray process of its private
    cluster (they name its temp dir ``ray_dir``); nothing else is touched."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the run's whole process group has exited already
        pass
    proc.wait(timeout=30)
    subprocess.run(["pkill", "-9", "-f", ray_dir], check=False)
    time.sleep(1.0)


def copy_run_dir(summary: dict[str, Any], dest: Path) -> str:
    """A copy of a finished run's dir (its ``--json`` summary names it) as ``dest/run``, for a test that
    changes bundles of a run other tests share."""
    target = dest / "run"
    shutil.copytree(summary["run_dir"], target)
    return str(target)
