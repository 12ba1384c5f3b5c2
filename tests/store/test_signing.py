"""Signed bundles: a store with a signing key signs every COMMIT; a store with the verify key reads only
bundles that key signed for the run, and refuses the rest as not verifying (docs/security.md). Each attack
is what a writer of the run's storage can do without the key, through rlckpt's own store API and plain
writes (`support.forge`). Every test runs on local disk and on S3."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from rlckpt.errors import BadSignatureError, NewerFormatError, RunIdentityError, StoreConfigError, UnsignedBundleError
from rlckpt.store import COMMIT_FORMAT, MANIFEST_FORMAT, BundleStore, Digest, SigningKey
from rlckpt.store.records.manifest import canonical_json
from rlckpt.store.signing import bundle_message
from support.forge import (
    carry_signature,
    commit_json,
    copy_bundle,
    forge_step,
    put_commit_json,
    rewrite_run_record,
)
from support.store_checks import raw_path, save_sample


@pytest.fixture
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture
def signed(store_location, key) -> BundleStore:
    """A run whose step 2 was committed by a store with the signing key."""
    url, options = store_location
    store = BundleStore(url, options, signing_key=key)
    save_sample(store, 2)
    return store


def plain(store: BundleStore) -> BundleStore:
    """The same run through a store without keys: what a writer without the key (an attacker) uses."""
    return BundleStore(store.url, store.storage_options)


def verifying(store: BundleStore, key: SigningKey) -> BundleStore:
    return BundleStore(store.url, store.storage_options, verify_key=key.public)


def test_a_bundle_signed_with_the_key_opens_verifies_and_lists_as_signed_by_it(signed, key):
    store = verifying(signed, key)
    bundle = store.open(2)
    bundle.verify()
    assert bundle.commit is not None and bundle.commit.signature is not None
    assert bundle.commit.signature.key_id == key.key_id
    assert store.steps() == [2]
    (entry,) = store.entries()
    assert (entry.state, entry.signature, entry.signed_by) == ("committed", "signed", key.key_id)
    assert entry.run == signed.run_record().run_id


def test_the_signature_covers_the_run_the_step_and_the_manifest_digest(signed, key):
    marker = commit_json(signed, 2)
    manifest = signed.open(2).commit.manifest
    message = bundle_message(marker["run"], 2, manifest)
    assert key.public.verifies(message, bytes.fromhex(marker["signature"]["value"]))
    assert marker["signature"]["algorithm"] == "ed25519"


def test_an_unsigned_bundle_does_not_verify_under_a_verify_key(store_location, key):
    url, options = store_location
    save_sample(BundleStore(url, options), 2)
    store = BundleStore(url, options, verify_key=key.public)
    with pytest.raises(UnsignedBundleError, match=r"step 2 at .*: unsigned \(it was written without a signing key\)"):
        store.open(2)
    assert store.steps() == [] and store.latest() is None
    (entry,) = store.entries()
    assert (entry.state, entry.signature) == ("corrupt", "unsigned")


@pytest.mark.parametrize("bit", [0, 257, 511])
def test_one_flipped_bit_in_the_signature_is_a_bad_signature(signed, key, bit):
    marker = commit_json(signed, 2)
    value = bytearray.fromhex(marker["signature"]["value"])
    value[bit // 8] ^= 1 << (bit % 8)
    put_commit_json(signed, 2, {**marker, "signature": {**marker["signature"], "value": value.hex()}})
    store = verifying(signed, key)
    with pytest.raises(BadSignatureError, match="step 2 at .*: bad signature: COMMIT's signature by key .* does not"):
        store.open(2)
    assert store.steps() == []
    assert [e.signature for e in store.entries()] == ["bad"]
    plain(signed).open(2).verify()  # intact: only a store with the verify key refuses it


def test_a_signed_bundle_recommitted_as_another_step_with_its_signature_is_a_bad_signature(signed, key):
    forge_step(plain(signed), 2, 6, {})  # the same files, committed as step 6 without the key
    carry_signature(signed, 2, 6)
    store = verifying(signed, key)
    with pytest.raises(BadSignatureError, match="step 6 at .*: bad signature: .* does not match its run, step"):
        store.open(6)
    assert store.steps() == [2]


def test_a_signed_bundle_copied_byte_for_byte_into_another_run_is_signed_for_another_run(signed, key):
    other = BundleStore(signed.url + "-other", signed.storage_options, signing_key=key)  # same key, its own run
    save_sample(other, 1)
    copy_bundle(signed, 2, other)
    this_run, that_run = other.run_record().run_id, signed.run_record().run_id
    store = verifying(other, key)
    with pytest.raises(BadSignatureError, match=rf"signed for another run \({that_run}\); this run is {this_run}"):
        store.open(2)
    assert store.steps() == [1]
    plain(other).open(2).verify()  # without the verify key the copy reads as it would have before


def test_a_run_record_rewritten_to_another_run_makes_the_runs_own_bundles_signed_for_another_run(signed, key):
    rewrite_run_record(signed, "a" * 32)
    with pytest.raises(BadSignatureError, match=rf"signed for another run .*; this run is {'a' * 32}"):
        verifying(signed, key).open(2)


def test_a_removed_run_record_leaves_no_signed_bundle_this_runs(signed, key):
    rewrite_run_record(signed, None)
    with pytest.raises(BadSignatureError, match=r"this run's identity is unknown \(the run has no run record"):
        verifying(signed, key).open(2)


def test_a_wrong_public_key_refuses_the_bundle_naming_both_keys(signed, key):
    other = SigningKey.generate()
    with pytest.raises(
        BadSignatureError, match=rf"signed by another key \({key.key_id}\), not the verify key's \({other.key_id}\)"
    ):
        verifying(signed, other).open(2)


def test_a_signature_by_another_key_claiming_the_verify_keys_id_is_a_bad_signature(signed, key):
    forge_step(plain(signed), 2, 6, {})
    marker = commit_json(signed, 6)
    attacker = SigningKey.generate()
    manifest = Digest(marker["manifest_algorithm"], marker["manifest_digest"])
    value = attacker.sign(bundle_message(marker["run"], 6, manifest))
    put_commit_json(
        signed, 6, {**marker, "signature": {"algorithm": "ed25519", "key_id": key.key_id, "value": value.hex()}}
    )
    with pytest.raises(BadSignatureError, match="step 6 at .*: bad signature"):
        verifying(signed, key).open(6)


def test_without_a_verify_key_signatures_are_not_checked_and_entries_still_say_signed(signed, key):
    forge_step(plain(signed), 2, 4, {})
    store = plain(signed)
    assert store.steps() == [2, 4]
    assert [(e.signature, e.signed_by) for e in store.entries()] == [("signed", key.key_id), ("unsigned", None)]


def test_retention_never_counts_an_unsigned_bundle_as_the_newest_good_one(signed, key):
    save_sample(signed, 3)
    forge_step(plain(signed), 3, 4, {})  # the newest bundle: intact, unsigned
    report = verifying(signed, key).gc(keep_last=1)
    assert report.deleted_steps == [2]
    assert report.kept_steps == [3]
    assert report.corrupt_steps == [4] and "unsigned" in report.corrupt_reasons[4]


def test_a_save_over_an_unsigned_bundle_with_replace_corrupt_quarantines_it(store_location, key):
    url, options = store_location
    save_sample(BundleStore(url, options), 2)
    store = BundleStore(url, options, signing_key=key, verify_key=key.public)
    with store.begin(2, replace_corrupt=True) as txn:
        txn.write_bytes("policy/weights.bin", b"signed")
        txn.commit({"step": 2})
    assert store.steps() == [2]
    assert store.open(2).commit.signature.key_id == key.key_id


# --- a format this rlckpt does not read: the signature decides first ---------------------------------------


def test_an_unsigned_commit_declaring_a_newer_format_is_a_bad_signature_and_skipped(signed, key):
    forge_step(plain(signed), 2, 6, {})
    newer = {**commit_json(signed, 6), "format": COMMIT_FORMAT + 1, "writer_version": "9.0.0"}
    newer["signature"] = {"key_id": key.key_id}  # claims the verify key: what anyone can write
    put_commit_json(signed, 6, newer)
    store = verifying(signed, key)
    with pytest.raises(
        BadSignatureError,
        match=rf"step 6 at .*: bad signature: not checked \(COMMIT format {COMMIT_FORMAT + 1} was written by a "
        rf"newer rlckpt 9.0; .*\); the verify key {key.key_id} accepts only bundles whose signature",
    ):
        store.open(6)
    assert store.steps() == [2] and store.latest() == 2
    assert [(e.step, e.state, e.signature) for e in store.entries()] == [
        (2, "committed", "signed"),
        (6, "corrupt", "bad"),
    ]
    with pytest.raises(NewerFormatError):  # without a verify key: a newer rlckpt's bundle, as before
        plain(signed).open(6)


def test_a_newer_manifest_under_the_keys_valid_signature_is_a_newer_bundle(signed, key):
    forge_step(plain(signed), 2, 6, {})
    manifest = canonical_json({**raw_manifest(signed, 6), "format": MANIFEST_FORMAT + 1, "writer_version": "9.0.0"})
    signed.fs.pipe_file(raw_path(signed, "step_6", "manifest.json"), manifest)
    marker = commit_json(signed, 6)
    digest = Digest.of(manifest)
    value = key.sign(bundle_message(marker["run"], 6, digest))  # what a newer rlckpt holding the key signs
    marker.update(manifest_algorithm=digest.algorithm, manifest_digest=digest.hex)
    marker["signature"] = {"algorithm": "ed25519", "key_id": key.key_id, "value": value.hex()}
    put_commit_json(signed, 6, marker)
    store = verifying(signed, key)
    with pytest.raises(NewerFormatError, match=f"manifest format {MANIFEST_FORMAT + 1} was written by a newer"):
        store.open(6)
    assert store.latest() == 6  # signed by the key: nothing older is taken for the newest


def raw_manifest(store: BundleStore, step: int) -> dict:
    return json.loads(store.fs.cat_file(raw_path(store, f"step_{step}", "manifest.json")))


# --- a key shared by several runs: the run a reader pins ----------------------------------------------------


@dataclass
class SharedKey:
    """Runs X and Y, both signed with the one key; Y's id, which Y's owner pins."""

    x: BundleStore
    y: BundleStore
    y_id: str


@pytest.fixture
def shared(signed, key) -> SharedKey:
    """Run X (`signed`: step 2) and run Y (steps 1 and 3) under one key, and the attack of issue 24: X's step
    2 and X's _run.json copied into Y, so that Y's record names X."""
    y = BundleStore(signed.url + "-y", signed.storage_options, signing_key=key)
    save_sample(y, 1)
    save_sample(y, 3)
    y_id = y.run_record().run_id
    copy_bundle(signed, 2, y)
    rewrite_run_record(y, signed.run_record().run_id)
    return SharedKey(signed, y, y_id)


def pinned(store: BundleStore, key: SigningKey, run_id: str, **keys) -> BundleStore:
    return BundleStore(store.url, store.storage_options, verify_key=key.public, run_id=run_id, **keys)


def test_without_a_pin_a_shared_key_lets_a_writer_pass_another_runs_bundles_and_record_for_this_runs(shared, key):
    store = verifying(shared.y, key)  # what docs/security.md says a shared key still allows
    assert store.steps() == [2]
    assert [(e.step, e.signature) for e in store.entries()] == [(1, "bad"), (2, "signed"), (3, "bad")]


def test_a_pinned_reader_refuses_another_runs_bundle_and_still_reads_its_own(shared, key, caplog):
    store = pinned(shared.y, key, shared.y_id)
    with caplog.at_level("WARNING", logger="rlckpt"):
        assert store.steps() == [1, 3] and store.latest() == 3
    with pytest.raises(
        BadSignatureError,
        match=rf"step 2 at .*: bad signature: signed for another run \({shared.x.run_record().run_id}\); this run "
        rf"is {shared.y_id} \(the run this reader pinned\)",
    ):
        store.open(2)
    store.open(3).verify()
    assert [(e.step, e.state, e.signature) for e in store.entries()] == [
        (1, "committed", "signed"),
        (2, "corrupt", "bad"),
        (3, "committed", "signed"),
    ]
    assert f"_run.json names run {shared.x.run_record().run_id}, not the pinned run {shared.y_id}" in caplog.text


def test_a_pinned_store_refuses_to_read_or_extend_a_run_record_of_another_run(shared, key):
    store = pinned(shared.y, key, shared.y_id, signing_key=key)
    with pytest.raises(RunIdentityError, match=f"names run .*, not the pinned run {shared.y_id}"):
        store.run_record()
    with pytest.raises(RunIdentityError, match=f"not the pinned run {shared.y_id}"):
        store.begin(4)  # no bundle of the run is signed under a record that names another
    assert store.read_intent(4) is None


def test_a_pinned_reader_needs_no_run_record_and_a_pinned_writer_makes_it_with_the_pin(signed, key):
    run_id = signed.run_record().run_id
    rewrite_run_record(signed, None)
    store = pinned(signed, key, run_id, signing_key=key)
    assert store.steps() == [2]
    save_sample(store, 3)
    assert plain(signed).run_record().run_id == run_id and store.steps() == [2, 3]


def test_a_new_run_pinned_by_its_writer_takes_the_pinned_id(store_location, key):
    url, options = store_location
    store = BundleStore(url, options, signing_key=key, verify_key=key.public, run_id="c" * 32)
    save_sample(store, 1)
    assert BundleStore(url, options).run_record().run_id == "c" * 32
    assert store.open(1).commit.run == "c" * 32


@pytest.mark.parametrize(
    ("run_id", "verify", "why"),
    [
        ("C" * 32, True, "is not a run id"),
        ("c" * 31, True, "is not a run id"),
        ("c" * 32, False, "goes with a verify key"),
    ],
)
def test_a_pin_that_is_not_a_run_id_or_comes_without_a_verify_key_is_refused(store_location, key, run_id, verify, why):
    url, options = store_location
    with pytest.raises(StoreConfigError, match=why):
        BundleStore(url, options, verify_key=key.public if verify else None, run_id=run_id)
