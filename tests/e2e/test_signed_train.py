"""`rlckpt train` with signed bundles end to end: a run signed with `--signing-key` on S3, resumed by two
trainer ranks on a fresh cluster with `--verify-key`, passes over a newer bundle someone without the key
put into the run (a consistent bundle of another run) and ends bit-identical to an uninterrupted run.
Real TransferQueue, Ray, gloo and moto."""

from __future__ import annotations

import json

import pytest

from rlckpt.store import BundleStore, SigningKey, write_key_pair
from rlckpt.testing.forge import recommit_bundle
from rlckpt.testing.train_cli import run_train

pytestmark = pytest.mark.slow


def test_a_signed_run_resumed_by_two_ranks_with_the_verify_key_skips_a_bundle_from_anyone_else_and_is_exact(
    straight_run, tmp_path, s3_run_url, s3_storage_options
):
    keys = write_key_pair(tmp_path / "keys")
    key_id = SigningKey.load(keys.signing_key).key_id
    options = ("--storage-options", json.dumps(s3_storage_options))
    straight = straight_run  # unsigned, local: the reference, and the intruder's source

    first = run_train(s3_run_url, 4, *options, "--signing-key", keys.signing_key)
    assert first["bundles"] == [2, 4] and first["signing_key_id"] == key_id
    run = BundleStore(s3_run_url, s3_storage_options)
    recommit_bundle(BundleStore(straight["run_dir"]), 6, run)  # intact, consistent, and not this run's

    second = run_train(
        s3_run_url, 8, *options, "--signing-key", keys.signing_key, "--verify-key", keys.verify_key
    )  # the default two trainer ranks: each opens the bundle with the verify key too
    assert second["resumed_from"] == 4
    (skipped,) = second["skipped_bundles"]
    assert skipped["step"] == 6 and "unsigned" in skipped["reason"]
    assert second["policy_sha256"] == straight["policy_sha256"]
    assert second["trained_draws"] == straight["trained_draws"][len(straight["trained_draws"]) // 2 :]
    signed = BundleStore(s3_run_url, s3_storage_options, verify_key=keys.verify_key)
    assert signed.steps() == [2, 4, 6, 8]  # step 6 saved anew and signed; the intruder's in _quarantine/
    assert {e.signed_by for e in signed.entries()} == {key_id}
    private = open(keys.signing_key).read()  # noqa: SIM115
    assert "".join(private.splitlines()[1:-1]) not in json.dumps(second)
