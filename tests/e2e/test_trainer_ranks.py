"""`rlckpt train` with its trainer ranks end to end: a rank killed mid-save, a resume at another rank
count, and ranks on two nodes of one Ray cluster writing to S3. Real TransferQueue, Ray, gloo and moto.

The exact-resume tests at the default two ranks are in test_train_resume.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from rlckpt.checkpoint.restore import PolicyLocation
from rlckpt.store import BundleStore
from support.train_cli import RUN_TIMEOUT_S, run_train, train_command

pytestmark = pytest.mark.slow


def _cmd(run_dir: str, steps: int, *extra: str, module: str = "rlckpt.cli.main", prefix: tuple[str, ...] = ()):
    return train_command(run_dir, steps, "--json", *extra, module=module, prefix=prefix)


def _saved_policy_sha256(run_dir: str, step: int, options: dict | None = None) -> str:
    """The full weights of a bundle's policy, loaded here at world size 1."""
    from rlckpt.controller.ranks.trainer_group import LocalTrainerGroup
    from rlckpt.grpo import GRPOConfig

    trainer = LocalTrainerGroup(GRPOConfig())
    asyncio.run(trainer.load_policy(PolicyLocation(BundleStore(run_dir, options).url, dict(options or {}), step)))
    return asyncio.run(trainer.policy_sha256())


def test_a_rank_killed_mid_save_commits_nothing_and_the_run_resumes_at_one_rank(tmp_path, shared_ray):
    run_dir = str(tmp_path / "run")
    killed = subprocess.run(  # rank 1 exits (os._exit) while writing its shards of step 4
        _cmd(run_dir, 6, module="support.rank_faults", prefix=("4", "1", "exit")),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert killed.returncode != 0, killed.stdout[-2000:]
    # The run stops at whichever call on the ranks notices first: the policy write of step 4, or the
    # train step that goes on beside it (saves are async). Either names the dead rank.
    assert "rank 1: died" in killed.stderr, killed.stderr[-3000:]
    assert "writing the policy of step 4" in killed.stderr or "train step failed" in killed.stderr
    store = BundleStore(run_dir)
    assert store.steps() == [2], "the save the rank died in must not be visible"
    saved = _saved_policy_sha256(run_dir, 2)

    # a clean resume, at another world size
    resumed = run_train(run_dir, 6, "--trainer-ranks", "1", ray_address=shared_ray)
    assert resumed["resumed_from"] == 2 and resumed["step"] == 6
    assert resumed["start_policy_sha256"] == saved  # the loaded full state is the saved one, bit for bit
    assert resumed["bundles"] == [2, 4, 6]
    for step in resumed["bundles"]:
        store.open(step).verify()
    assert store.open(6).manifest.metadata["trainer_ranks"] == 1


def test_two_ranks_on_two_nodes_write_one_bundle_to_s3(tmp_path, s3_run_url, s3_storage_options, monkeypatch):
    from ray.cluster_utils import Cluster

    import rlckpt.dataplane.ray_cluster  # noqa: F401  # sets Ray's environment before the nodes start

    temp_dir = tempfile.mkdtemp(prefix="rlckpt-2n-", dir="/tmp")
    # Cluster writes the head's address to <RAY_TMPDIR or /tmp>/ray/ray_current_cluster whatever the
    # nodes' temp_dir, and fails where that dir does not exist (a fresh machine). Keep it in our own dir.
    monkeypatch.setenv("RAY_TMPDIR", temp_dir)
    os.mkdir(os.path.join(temp_dir, "ray"))
    slot = {"trainer_slot": 1}  # one per node: rank r can only land on a node without a rank yet
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 4,
            "resources": slot,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            "temp_dir": temp_dir,
        },
    )
    try:
        # TransferQueue pins its storage units round-robin over the nodes (sorted by node id, so either one
        # may come first) and each asks for a CPU: both nodes need CPUs (Ray's CPUs are only labels here).
        cluster.add_node(num_cpus=2, resources=slot, node_ip_address="127.0.0.1")
        options = json.dumps(s3_storage_options)
        summary = run_train(
            s3_run_url,
            2,
            "--storage-options",
            options,
            "--ray-address",
            cluster.address,
            "--trainer-resources",
            json.dumps(slot),
            "--staging-dir",
            str(Path(tmp_path / "controller-staging")),
        )
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert summary["step"] == 2 and summary["bundles"] == [2]
    bundle = BundleStore(s3_run_url, s3_storage_options).open(2)
    bundle.verify()
    policy = sorted(p for p in bundle.manifest.files if p.startswith("policy/"))
    assert policy == ["policy/.metadata", "policy/__0_0.distcp", "policy/__1_0.distcp"]
    assert _saved_policy_sha256(s3_run_url, 2, s3_storage_options) == summary["policy_sha256"]
