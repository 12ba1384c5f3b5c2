"""Fixtures of the end-to-end runs."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rlckpt.dataplane.cluster_reaper import CLUSTER_ENV, reap
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


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[str]:
    """The address of one Ray cluster (head node only, on loopback) that this worker's runs which test nothing
    of a cluster's own life join with --ray-address: each still starts its own TransferQueue and actors, and
    they end with it, as jobs on a long-lived cluster do; what they share is Ray's own processes, whose start
    and stop cost each private run ≈7 core-s and ≈6 s. Its processes carry the reaper's mark (killed after)."""
    from ray.cluster_utils import Cluster

    import rlckpt.dataplane.ray_cluster  # noqa: F401  # sets Ray's environment before the head starts

    temp_dir = tempfile.mkdtemp(prefix="rlckpt-e2e-shared-", dir="/tmp")
    os.mkdir(os.path.join(temp_dir, "ray"))  # where Cluster writes the head's address (RAY_TMPDIR below)
    with pytest.MonkeyPatch.context() as patch:  # the head's processes inherit these; the runs started later do not
        patch.setenv("RAY_TMPDIR", temp_dir)
        patch.setenv(CLUSTER_ENV, temp_dir)
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 4,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
                "temp_dir": temp_dir,
            },
        )
    try:
        yield cluster.address
    finally:
        cluster.shutdown()
        reap(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
