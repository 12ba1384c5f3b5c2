"""`rlckpt train` as a subprocess, for the end-to-end tests and the benchmarks: one command builder,
one runner that returns the `--json` summary, the processes of a run's job (what a scheduler signals),
and the kill of a run that must not outlive its test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlckpt.dataplane.cluster_reaper import cluster_processes, reap

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


def run_train(
    run_dir: str, steps: int, *extra: str, env: dict[str, str] | None = None, ray_address: str | None = None
) -> dict[str, Any]:
    """Run `rlckpt train ... --json` to completion (on the Ray cluster at ``ray_address``, else on a private
    one); its summary. AssertionError with the stderr tail if it fails."""
    joined = ("--ray-address", ray_address) if ray_address else ()
    cmd = train_command(run_dir, steps, *extra, *joined, "--json")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary


def kill_run(proc: subprocess.Popen[bytes], ray_dir: str) -> None:
    """SIGKILL the driver started with ``start_new_session=True`` and every Ray process of its private
    cluster (they name its temp dir ``ray_dir`` or carry it in their environment); nothing else is touched."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the run's whole process group has exited already
        pass
    proc.wait(timeout=30)
    reap(ray_dir)


def job_processes(driver: int, ray_dir: str) -> list[int]:
    """Every process of the job of `rlckpt train` started in a session of its own (``driver``, the
    session's leader) with its private Ray cluster in ``ray_dir``: what Slurm's scancel signals (every
    process of the job step, whatever session it put itself in). The session's processes, and every
    process of the cluster (the reaper included: it names the dir)."""
    members = set(cluster_processes(ray_dir))
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == driver:  # after the command name: state, ppid, pgrp, session
            members.add(int(entry))
    return sorted(members)


def copy_run_dir(summary: dict[str, Any], dest: Path) -> str:
    """A copy of a finished run's dir (its ``--json`` summary names it) as ``dest/run``, for a test that
    changes bundles of a run other tests share."""
    target = dest / "run"
    shutil.copytree(summary["run_dir"], target)
    return str(target)
