"""`rlckpt train` under gates (support.gates) as a process the test drives: started with its output in files,
waited on until a gate is reached or its stderr says something, signalled, and read back."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.gates import Gate
from support.train_cli import RUN_TIMEOUT_S, train_command

ACKNOWLEDGED = "saving at the next safe point"  # the driver has handed a stop to the controller


@dataclass
class GatedProcess:
    """`rlckpt train` started with gates, its stdout and stderr in files (a full pipe would stall it)."""

    proc: subprocess.Popen[bytes]
    gates: Path
    out: Path
    err: Path

    def gate(self, name: str) -> Gate:
        return Gate(str(self.gates), name)

    def wait_until(self, what: str, ready: Callable[[], bool], *, while_running: bool = True) -> None:
        """Poll `ready` (another process's files: there is nothing to wait on); fail if the run exits first."""
        deadline = time.monotonic() + RUN_TIMEOUT_S  # the bound for a hang, never what a passing test waits for
        while not ready():
            if while_running and self.proc.poll() is not None:
                pytest.fail(f"the run exited {self.proc.returncode} before {what}:\n{self.stderr()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {RUN_TIMEOUT_S}s:\n{self.stderr()[-3000:]}")
            time.sleep(0.2)

    def wait_reached(self, name: str) -> None:
        self.wait_until(f"gate {name}", self.gate(name).reached_path.exists)

    def wait_said(self, text: str) -> None:
        """Until the run's stderr holds `text`."""
        self.wait_until(repr(text), lambda: text in self.stderr())

    def wait_acknowledged(self) -> None:
        self.wait_until("the stop reaching the controller", lambda: ACKNOWLEDGED in self.stderr())

    def sigterm(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def exit_code(self) -> int:
        return self.proc.wait(timeout=RUN_TIMEOUT_S)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def summary(self) -> dict[str, Any]:
        lines = self.out.read_text().strip().splitlines()
        assert lines, f"no --json line on stdout:\n{self.stderr()[-3000:]}"
        result: dict[str, Any] = json.loads(lines[-1])
        return result


def start_gated_run(home: Path, points: str, run_dir: str, steps: int, *extra: str) -> GatedProcess:
    """`rlckpt train --json ... EXTRA` (EXTRA names its Ray cluster: --ray-temp-dir or --ray-address) in a
    session of its own, with gates ``POINT:STEP,...`` in ``home/gates`` and its output in ``home``."""
    gates = home / "gates"
    gates.mkdir()
    cmd = train_command(run_dir, steps, "--json", *extra, module="support.gates", prefix=(str(gates), points))
    out, err = home / "run.out", home / "run.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, start_new_session=True)
    return GatedProcess(proc, gates, out, err)
