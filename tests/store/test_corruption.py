"""The corruption matrix: every tampering is refused, and the error names the file."""

from __future__ import annotations

import json

import pytest

from rlckpt.errors import CorruptBundleError, UncommittedBundleError
from rlckpt.store import BundleStore, CommitMarker, Digest, Manifest
from rlckpt.store.records.manifest import canonical_json
from support.store_checks import corrupt_file, save_sample, stored_path

TARGET = "policy/weights.bin"


@pytest.fixture
def store(store_location):
    url, options = store_location
    s = BundleStore(url, options)
    save_sample(s, 1)
    save_sample(s, 2)
    return s


def path(store, step, rel):
    return stored_path(store, step, rel)


def read(store, step, rel):
    return store.fs.cat_file(path(store, step, rel))


def write(store, step, rel, data):
    store.fs.pipe_file(path(store, step, rel), data)


def refused_on_open_or_verify(store, step):
    """Opening checks marker/manifest/listing; verify() checks every digest. One of them must refuse."""
    bundle = store.open(step)
    bundle.verify()


def test_flipped_byte_is_refused_naming_the_file(store):
    data = bytearray(read(store, 2, TARGET))
    data[100] ^= 0x01
    write(store, 2, TARGET, bytes(data))
    with pytest.raises(CorruptBundleError, match=TARGET):
        refused_on_open_or_verify(store, 2)
    with pytest.raises(CorruptBundleError, match=TARGET):
        store.open(2).read_bytes(TARGET)


def test_flipped_byte_in_compressed_file_is_refused_before_decompression(store):
    rel = "policy/optim.bin"
    data = bytearray(read(store, 2, rel))
    data[-3] ^= 0xFF
    write(store, 2, rel, bytes(data))
    with pytest.raises(CorruptBundleError, match=rel):
        store.open(2).read_bytes(rel)


def test_truncated_file_is_refused_at_open(store):
    write(store, 2, TARGET, read(store, 2, TARGET)[:-1])
    with pytest.raises(CorruptBundleError, match=TARGET):
        store.open(2)


def test_deleted_file_is_refused_at_open(store):
    store.fs.rm_file(path(store, 2, TARGET))
    with pytest.raises(CorruptBundleError, match=f"{TARGET}.*missing"):
        store.open(2)


def test_file_deleted_after_open_is_refused_by_get_dir_naming_it(store, tmp_path):
    bundle = store.open(2)
    store.fs.rm_file(path(store, 2, TARGET))
    with pytest.raises(CorruptBundleError, match=f"{TARGET}.*missing"):
        bundle.get_dir("", tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("restored")] == []


def test_extra_file_is_refused_at_open(store):
    write(store, 2, "policy/smuggled.bin", b"x")
    with pytest.raises(CorruptBundleError, match="policy/smuggled.bin"):
        store.open(2)


def test_edited_manifest_is_refused_at_open(store):
    manifest = Manifest.from_bytes(read(store, 2, "manifest.json"))
    edited = Manifest(
        step=manifest.step, txid=manifest.txid, created=manifest.created, files=manifest.files, metadata={"evil": 1}
    )
    write(store, 2, "manifest.json", edited.to_bytes())
    with pytest.raises(CorruptBundleError, match="manifest.json"):
        store.open(2)
    assert store.steps() == [1]


def test_deleted_commit_makes_the_bundle_invisible(store):
    store.fs.rm_file(path(store, 2, "COMMIT"))
    with pytest.raises(UncommittedBundleError, match="step_2.*without COMMIT"):
        store.open(2)
    assert store.steps() == [1]
    assert store.latest() == 1


def test_forged_commit_is_refused_naming_the_manifest(store):
    forged = CommitMarker(step=2, txid="f" * 32, manifest=Digest.of(b"something else"), run="0" * 32)
    write(store, 2, "COMMIT", forged.to_bytes())
    with pytest.raises(CorruptBundleError, match="manifest.json"):
        store.open(2)
    assert store.steps() == [1]


def test_garbage_commit_is_refused_naming_commit(store):
    write(store, 2, "COMMIT", b"not json")
    with pytest.raises(CorruptBundleError, match="COMMIT"):
        store.open(2)


def test_commit_copied_from_another_bundle_is_refused(store):
    write(store, 2, "COMMIT", read(store, 1, "COMMIT"))
    with pytest.raises(CorruptBundleError, match="COMMIT"):
        store.open(2)


def test_file_copied_in_from_another_bundle_is_refused_naming_it(store):
    # same relpath, same size, other save: only the digest tells them apart
    other = read(store, 1, TARGET)
    assert len(other) == len(read(store, 2, TARGET))
    write(store, 2, TARGET, other)
    bundle = store.open(2)
    with pytest.raises(CorruptBundleError, match=TARGET):
        bundle.verify()
    with pytest.raises(CorruptBundleError, match=TARGET):
        bundle.read_bytes(TARGET)


def test_corrupt_file_never_reaches_get_file_target(store, tmp_path):
    data = bytearray(read(store, 2, TARGET))
    data[0] ^= 0x80
    write(store, 2, TARGET, bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CorruptBundleError, match=TARGET):
        store.open(2).get_file(TARGET, out / "weights.bin")
    assert list(out.iterdir()) == []


def test_failed_get_dir_leaves_no_directory_that_looks_complete(store, tmp_path):
    data = bytearray(read(store, 2, TARGET))
    data[0] ^= 0x80
    write(store, 2, TARGET, bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CorruptBundleError, match=TARGET):
        store.open(2).get_dir("", out / "restored")
    assert list(out.iterdir()) == []


def test_manifest_with_unsafe_relpath_is_refused_at_read(store):
    manifest = Manifest.from_bytes(read(store, 2, "manifest.json"))
    obj = json.loads(manifest.to_bytes())
    obj["files"]["../../escape.bin"] = obj["files"].pop(TARGET)
    raw = canonical_json(obj)  # a well-formed manifest in every other way
    write(store, 2, "manifest.json", raw)
    marker = CommitMarker(step=2, txid=manifest.txid, manifest=Digest.of(raw), run=store.run_record().run_id)
    write(store, 2, "COMMIT", marker.to_bytes())
    with pytest.raises(
        CorruptBundleError, match=r"manifest.json: manifest: files\['\.\./\.\./escape\.bin'\]: .*'\.\.' segment"
    ):
        store.open(2)


def test_other_bundles_stay_readable_when_one_is_corrupt(store):
    store.fs.rm_file(path(store, 2, TARGET))
    store.open(1).verify()
    states = {e.step: e.state for e in store.entries()}
    assert states == {1: "committed", 2: "corrupt"}


def test_verify_under_a_directory_checks_only_its_files(store):
    corrupt_file(store, 2, "train_dataloader.pt", "flip")
    store.open(2).verify(under="policy")  # the damage is elsewhere
    with pytest.raises(CorruptBundleError, match="train_dataloader.pt"):
        store.open(2).verify()
    corrupt_file(store, 2, TARGET, "flip")
    with pytest.raises(CorruptBundleError, match=TARGET):
        store.open(2).verify(under="policy")
