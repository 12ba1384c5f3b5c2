"""The reaper of a private Ray cluster, without Ray: a stand-in driver starts it and a stand-in cluster
process that carries the cluster's mark only in its environment (as Ray's agents and workers do once
they have renamed themselves). End to end, with Ray: tests/e2e/test_preemption.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlckpt.dataplane import cluster_reaper
from rlckpt.dataplane.cluster_reaper import cluster_processes

GONE_WITHIN_S = 60.0  # a generous bound for a hang, never what a passing test waits for

# The stand-in driver: loads cluster_reaper by path (as the real driver runs it), starts the reaper and one
# process of "the cluster", prints that process's pid and waits to be killed.
DRIVER = """
import importlib.util, os, subprocess, sys, time
spec = importlib.util.spec_from_file_location("cluster_reaper", sys.argv[1])
reaper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reaper)
temp_dir = sys.argv[2]
reaper.ClusterReaper(temp_dir, remove_dir=True)
member = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, reaper.CLUSTER_ENV: temp_dir}
)
print(member.pid, flush=True)
time.sleep(600)
"""


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, str]]:
    """(the stand-in driver, the pid of its cluster's process, the cluster's temp dir); all killed after."""
    temp_dir = str(tmp_path / "ray")
    os.mkdir(temp_dir)
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, cluster_reaper.__file__, temp_dir], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    member = int(proc.stdout.readline())
    _wait_until(lambda: member in cluster_processes(temp_dir) and _reaper_of(temp_dir) != [])
    yield proc, member, temp_dir
    proc.kill()
    proc.wait()
    for pid in cluster_processes(temp_dir):
        os.kill(pid, signal.SIGKILL)


def _reaper_of(temp_dir: str) -> list[int]:
    return [
        pid for pid in cluster_processes(temp_dir) if b"cluster_reaper" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def _wait_until(done) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while not done():
        assert time.monotonic() < deadline, "not within the bound for a hang"
        time.sleep(0.05)


def test_a_driver_that_is_sigkilled_takes_every_process_of_its_cluster_with_it(driver):
    proc, member, temp_dir = driver
    proc.kill()
    proc.wait()
    _wait_until(lambda: cluster_processes(temp_dir) == [])
    assert not os.path.exists(temp_dir)  # asked to remove it


def test_a_job_wide_sigterm_does_not_stop_the_reaper_before_its_driver(driver):
    proc, member, temp_dir = driver
    for pid in _reaper_of(temp_dir):
        os.kill(pid, signal.SIGTERM)
    proc.kill()
    proc.wait()
    _wait_until(lambda: cluster_processes(temp_dir) == [])


def _running(proc: subprocess.Popen, arg: str) -> bool:
    """Whether `proc` has exec'd its command (until then /proc shows the forking parent's command line)."""
    return arg.encode() in Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")


def test_a_process_naming_a_longer_dir_is_not_of_the_cluster(tmp_path):
    theirs, ours = f"{tmp_path}/rayx/session", f"{tmp_path}/ray/session"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", theirs])
    try:
        mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", ours])
        try:
            _wait_until(lambda: _running(other, theirs) and _running(mine, ours))
            assert cluster_processes(f"{tmp_path}/ray") == [mine.pid]
        finally:
            mine.kill()
            mine.wait()
    finally:
        other.kill()
        other.wait()
