"""Helpers of the benchmark smoke tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def run_benchmark() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `python -m benchmarks.<name>` (`script` is `<name>.py`) with `args` from the repository's root in a
    process of its own, as a user would; the finished process, once it has exited 0 (else the test fails with
    its stderr)."""

    def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
        module = f"benchmarks.{Path(script).stem}"
        proc = subprocess.run(
            [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300, cwd=BENCHMARKS.parent
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    return run
