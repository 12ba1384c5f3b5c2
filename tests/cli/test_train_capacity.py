"""`rlckpt train --ray-address` refuses a run the cluster cannot hold as soon as it has joined, before any
rank or TransferQueue actor starts: a `--trainer-resources` resource no node offers (or not enough of it for
one rank), and more `--trainer-ranks` than the nodes hold. One small Ray cluster (a head with 4 CPUs and one
`trainer_slot`) serves the whole module; each run only joins it and leaves."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

import rlckpt.dataplane.ray_cluster  # noqa: F401  # sets Ray's environment before the cluster starts


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="rlckpt-cap-", dir="/tmp")
    with pytest.MonkeyPatch.context() as patch:
        # Cluster writes the head's address under <RAY_TMPDIR or /tmp>/ray: keep it in our own dir
        patch.setenv("RAY_TMPDIR", temp_dir)
        os.mkdir(os.path.join(temp_dir, "ray"))
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 4,
                "resources": {"trainer_slot": 1},
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
                "temp_dir": temp_dir,
            },
        )
        try:
            yield cluster.address
        finally:
            cluster.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)


def _join(tmp_path, ray_address: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run `rlckpt train` against the module's cluster; its refusal is the one line after the progress line.
    In a process of its own: this one may be connected to another Ray cluster (the session's TransferQueue),
    and a process joins one cluster at a time."""
    command = [sys.executable, "-m", "rlckpt.cli.main", "train", "--run-dir", str(tmp_path / "run"), "--steps", "2"]
    done = subprocess.run([*command, "--ray-address", ray_address, *argv], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.startswith("rlckpt train: ")]  # Ray may log too
    assert "Traceback" not in done.stderr, done.stderr
    assert lines == ["rlckpt train: starting TransferQueue and the controller ...", lines[-1]], done.stderr
    assert lines[-1].startswith("rlckpt train: error: "), done.stderr
    return done


def test_a_resource_no_node_offers_is_named(tmp_path, ray_address):
    result = _join(tmp_path, ray_address, "--trainer-resources", '{"gpu_slot": 1}')
    assert result.returncode == 64
    assert "--trainer-resources asks for 'gpu_slot', which no node of the Ray cluster offers" in result.stderr
    assert "trainer_slot" in result.stderr  # what they do offer


def test_more_of_a_resource_than_any_node_has_is_refused(tmp_path, ray_address):
    result = _join(tmp_path, ray_address, "--trainer-resources", '{"trainer_slot": 2}')
    assert result.returncode == 64
    assert "2 'trainer_slot'" in result.stderr and "no node of the Ray cluster has more than 1" in result.stderr


def test_more_ranks_than_the_nodes_hold_are_refused(tmp_path, ray_address):
    result = _join(tmp_path, ray_address, "--trainer-ranks", "100000")
    assert result.returncode == 64
    assert "--trainer-ranks 100000: the Ray cluster (1 node) holds at most" in result.stderr


def test_ranks_beyond_the_nodes_custom_resources_are_refused(tmp_path, ray_address):
    result = _join(tmp_path, ray_address, "--trainer-ranks", "2", "--trainer-resources", '{"trainer_slot": 1}')
    assert result.returncode == 64
    assert "--trainer-ranks 2: the Ray cluster (1 node) holds at most 1 trainer ranks" in result.stderr
