"""`rlckpt train` with signed bundles on two tiers, end to end: a run signed with `--signing-key` saves to
a local tier and replicates to S3 (moto) with its replication actor; someone without the key puts a newer
bundle into the S3 tier (a consistent, unsigned bundle); the machine is lost with its local tier; a fresh
one resumes with two trainer ranks and `--verify-key` from S3, passes over the intruder's bundle, and ends
bit-identical to an uninterrupted run. Real TransferQueue, Ray, gloo and moto, two runs (one scenario for
signing and tiers: each run costs a Ray and TransferQueue start). The interleavings are in
tests/controller/test_two_tiers.py, the interruptions of a copy in tests/store/test_replica.py, the
signature checks in tests/store/test_signing.py."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from rlckpt.store import BundleStore, SigningKey, write_key_pair
from support.forge import recommit_bundle
from support.train_cli import run_train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lost_machine(straight_run, tmp_path_factory, s3_storage_options, _s3_admin_fs, shared_ray) -> dict[str, Any]:
    """The scenario, run once: first 0 → 4 signed on two tiers, the intruder's step 6 on S3, the local tier
    wiped, then 4 → 8 on a fresh machine with the verify key."""
    home = tmp_path_factory.mktemp("signed-two-tiers")
    bucket = "rlckpt-signed-two-tiers"
    _s3_admin_fs.mkdir(bucket)
    s3_url = f"s3://{bucket}/run"
    keys = write_key_pair(home / "keys")
    local = str(home / "nvme" / "run")
    tiers = ["--replicate-to", s3_url, "--replicate-storage-options", json.dumps(s3_storage_options)]
    signed = ["--signing-key", keys.signing_key]
    first = run_train(local, 4, *tiers, *signed, ray_address=shared_ray)
    first_local = BundleStore(local)
    local_records_4 = first_local.records(4)
    s3 = BundleStore(s3_url, s3_storage_options)
    recommit_bundle(BundleStore(straight_run["run_dir"]), 6, s3)  # intact, consistent, and not signed by the run
    shutil.rmtree(local)  # a fresh machine: nothing on its NVMe
    second = run_train(  # two trainer ranks, a fresh TransferQueue
        local, 8, *tiers, *signed, "--verify-key", keys.verify_key, ray_address=shared_ray
    )
    return {
        "first": first,
        "second": second,
        "local": local,
        "s3_url": s3_url,
        "keys": keys,
        "local_records_4": local_records_4,
    }


def test_every_save_of_a_signed_run_commits_locally_and_the_same_bundle_is_replicated(lost_machine, s3_storage_options):
    first, keys = lost_machine["first"], lost_machine["keys"]
    assert first["bundles"] == [2, 4] and first["signing_key_id"] == SigningKey.load(keys.signing_key).key_id
    assert first["replicated"] == [2, 4] and first["replication_failed"] == {}
    s3 = BundleStore(lost_machine["s3_url"], s3_storage_options, verify_key=keys.verify_key)
    assert s3.records(4) == lost_machine["local_records_4"]  # the same bundle: manifest and COMMIT bytes
    s3.open(4).verify()


def test_with_the_local_tier_lost_the_run_resumes_from_s3_past_a_bundle_it_did_not_sign_and_is_exact(
    lost_machine, straight_run
):
    first, second = lost_machine["first"], lost_machine["second"]
    assert second["resumed_from"] == 4 and second["restored_from"] == lost_machine["s3_url"]
    (skipped,) = second["skipped_bundles"]
    assert skipped["step"] == 6 and "unsigned" in skipped["reason"]
    assert second["start_policy_sha256"] == first["policy_sha256"]  # bit for bit the weights saved at 4
    assert second["policy_sha256"] == straight_run["policy_sha256"]
    assert second["trained_draws"] == straight_run["trained_draws"][len(straight_run["trained_draws"]) // 2 :]


def test_the_resumed_run_signs_and_replicates_what_it_saves_and_sets_the_intruders_bundle_aside(
    lost_machine, s3_storage_options
):
    second, keys = lost_machine["second"], lost_machine["keys"]
    key_id = SigningKey.load(keys.signing_key).key_id
    assert BundleStore(lost_machine["local"]).steps() == [6, 8]
    assert second["replicated"] == [6, 8] and second["replication_failed"] == {}
    signed = BundleStore(lost_machine["s3_url"], s3_storage_options, verify_key=keys.verify_key)
    assert signed.steps() == [2, 4, 6, 8]  # step 6 saved anew and signed; the intruder's in _quarantine/
    assert {e.signed_by for e in signed.entries()} == {key_id}


def test_the_signing_key_appears_nowhere_in_the_runs_output(lost_machine):
    private = open(lost_machine["keys"].signing_key).read()  # noqa: SIM115
    body = "".join(private.splitlines()[1:-1])
    assert body not in json.dumps(lost_machine["first"]) and body not in json.dumps(lost_machine["second"])
