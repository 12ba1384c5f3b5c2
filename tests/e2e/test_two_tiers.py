"""`rlckpt train --replicate-to` end to end: saves commit to a local tier and are replicated to S3 (moto)
by the run's replication actor; a fresh machine whose local tier is empty resumes from S3 exactly where
the run left off. Two runs (≈40-60 s each); the interleavings are in tests/controller/test_two_tiers.py and
the interruptions of a copy (SIGKILL, the S3 server gone and back) in tests/store/test_replica.py."""

from __future__ import annotations

import json
import shutil

import pytest

from rlckpt.store import BundleStore
from rlckpt.testing.train_cli import run_train

pytestmark = pytest.mark.slow


def test_with_the_local_tier_wiped_a_run_resumes_from_s3_with_the_weights_it_saved(
    tmp_path, s3_run_url, s3_storage_options
):
    local = str(tmp_path / "nvme" / "run")
    remote = ["--replicate-to", s3_run_url, "--replicate-storage-options", json.dumps(s3_storage_options)]
    first = run_train(local, 4, *remote)
    assert first["replicated"] == [2, 4] and first["replication_failed"] == {}
    s3 = BundleStore(s3_run_url, s3_storage_options)
    assert s3.records(4) == BundleStore(local).records(4)  # the same bundle: manifest and COMMIT bytes
    s3.open(4).verify()
    shutil.rmtree(local)  # a fresh machine: nothing on its NVMe
    second = run_train(local, 6, *remote)
    assert second["resumed_from"] == 4 and second["restored_from"] == s3_run_url
    assert second["start_policy_sha256"] == first["policy_sha256"]  # bit for bit the weights saved at 4
    assert BundleStore(local).steps() == [6]
    assert s3.steps() == [2, 4, 6]
