"""Restore on a fresh cluster, timed from process start to the first train step.

Runs the real main job as a subprocess: ``rlckpt train`` once to write a bundle, then ``rlckpt
train`` again resuming it with an empty staging dir. The resume's stderr is read as it arrives;
the first progress-bar count above the resumed step marks the first train step. The driver polls
the controller for events every 0.5 s, so the figure can be late by up to that much.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from rlckpt.errors import CheckpointError

logger = logging.getLogger(__name__)

_RESUMED = re.compile(rb"resumed step (\d+) from .* \(([\d.]+)s\)")
_PROGRESS = re.compile(rb"train:.*?\|\s*(\d+)/(\d+)\s*\[")
TIMEOUT_S = 300


@dataclass
class FirstStepResult:
    """Seconds from spawning the resume process to its events, and what it resumed."""

    run_dir: str
    resumed_step: int
    restore_s: float  # the driver's own figure for restore_run (printed on resume)
    to_resumed_s: float  # process start -> "resumed step" line (Ray + TQ started, bundle restored)
    to_first_step_s: float  # process start -> first train step done
    total_s: float  # the whole resume process, including shutdown
    write_s: float  # the first (fresh) run that wrote the bundle


@dataclass
class StderrWatch:
    """Arrival times (seconds after spawn) of the interesting stderr events of ``rlckpt train``."""

    resumed_step: int | None = None
    restore_s: float | None = None
    resumed_at: float | None = None
    first_step_at: float | None = None

    def feed(self, chunk: bytes, at: float) -> None:
        """Look at one \\r- or \\n-terminated piece of stderr that arrived at ``at``."""
        if self.resumed_at is None and (m := _RESUMED.search(chunk)):
            self.resumed_step, self.restore_s, self.resumed_at = int(m.group(1)), float(m.group(2)), at
            return
        m = _PROGRESS.search(chunk) if self.first_step_at is None and self.resumed_step is not None else None
        if m and self.resumed_step is not None and int(m.group(1)) > self.resumed_step:
            self.first_step_at = at


def _watch_stream(stream: Any, watch: StderrWatch, started: float, tail: list[bytes]) -> None:
    buffer = b""
    while chunk := stream.read1(4096) if hasattr(stream, "read1") else stream.read(4096):
        now = time.perf_counter() - started
        buffer += chunk
        *pieces, buffer = re.split(rb"[\r\n]", buffer)
        for piece in pieces:
            watch.feed(piece, now)
            tail.append(piece)
            del tail[:-40]
    if buffer:
        watch.feed(buffer, time.perf_counter() - started)


def _train_command(
    run_dir: str, steps: int, save_every: int, options: dict[str, Any] | None, extra: list[str]
) -> list[str]:
    """`rlckpt train` of this interpreter, as a subprocess runs it."""
    cmd = [sys.executable, "-m", "rlckpt.cli.main", "train", "--run-dir", run_dir, "--steps", str(steps)]
    cmd += ["--save-every", str(save_every), *extra]
    return cmd + (["--storage-options", json.dumps(options)] if options else [])


def _run_train(cmd: list[str]) -> tuple[StderrWatch, float]:
    """Run one ``rlckpt train`` to completion, watching stderr; returns the watch and wall time."""
    watch = StderrWatch()
    tail: list[bytes] = []
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ))
    reader = threading.Thread(target=_watch_stream, args=(proc.stderr, watch, started, tail), daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise CheckpointError(f"bench: `{' '.join(cmd[2:5])}` did not finish within {TIMEOUT_S}s") from None
    reader.join(timeout=10)
    elapsed = time.perf_counter() - started
    if code != 0:
        text = b"\n".join(tail).decode(errors="replace")
        raise CheckpointError(f"bench: rlckpt train exited with {code}:\n{text}")
    return watch, elapsed


def measure_first_step(
    run_dir: str, storage_options: dict[str, Any] | None = None, *, written_steps: int = 2
) -> FirstStepResult:
    """Write a bundle at ``written_steps`` with a fresh run, then time a resume on a new cluster."""
    _, write_s = _run_train(_train_command(run_dir, written_steps, written_steps, storage_options, ["--fresh"]))
    with tempfile.TemporaryDirectory(prefix="rlckpt-bench-stage-") as staging:
        # two more steps, no periodic save: the first step's event is not delayed by a save
        cmd = _train_command(run_dir, written_steps + 2, 1000, storage_options, ["--staging-dir", staging])
        watch, total_s = _run_train(cmd)
    if watch.resumed_at is None or watch.first_step_at is None or watch.resumed_step is None:
        raise CheckpointError(f"bench: the resume of {run_dir} printed no 'resumed step' line or no progress")
    return FirstStepResult(
        run_dir=run_dir,
        resumed_step=watch.resumed_step,
        restore_s=watch.restore_s or 0.0,
        to_resumed_s=watch.resumed_at,
        to_first_step_s=watch.first_step_at,
        total_s=total_s,
        write_s=write_s,
    )
