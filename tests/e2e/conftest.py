"""Fixtures of the end-to-end runs."""

from __future__ import annotations

import fcntl
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from support.train_cli import run_train


@pytest.fixture
def ray_dir() -> Iterator[str]:
    """A run's private Ray temp dir, for runs a test may have to kill: short (Ray's socket paths must
    stay short), removed after."""
    path = tempfile.mkdtemp(prefix="rlckpt-e2e-ray-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Any]:
    """0 → 8 uninterrupted, in_order, on local disk: the reference for exact resume, run once per test
    session and shared by every worker (pytest-xdist: the first to ask runs it under a file lock, the others
    wait and read its summary). Its bundles are read only: a test that changes one copies the run first.
    ``seconds`` in it is how long the whole run took (Ray's start included) on this machine now."""
    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        root = root.parent  # the temp root every worker of this session shares
    home = root / "straight-run"
    with open(root / "straight-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = home / "summary.json"
        if done.exists():
            summary: dict[str, Any] = json.loads(done.read_text())
            return summary
        shutil.rmtree(home, ignore_errors=True)  # what a worker that failed half way left
        home.mkdir()
        started = time.monotonic()
        summary = run_train(str(home / "run"), 8)
        summary["seconds"] = time.monotonic() - started
        done.write_text(json.dumps(summary))
        return summary
