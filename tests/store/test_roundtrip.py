"""Round trip, visibility and the read APIs; every test runs on local disk and on S3 (moto)."""

from __future__ import annotations

import os

import pytest

from rlckpt.errors import TransactionStateError, UncommittedBundleError
from rlckpt.store import Bundle, BundleStore, Manifest
from support.store_checks import all_paths, debris, sample_payload, save_sample


@pytest.fixture
def store(store_location):
    url, options = store_location
    return BundleStore(url, options)


@pytest.fixture
def local_tree(tmp_path):
    src = tmp_path / "tree"
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(5000))
    (src / "sub" / "b.txt").write_bytes(b"b" * 10)
    (src / "sub" / "deeper" / "c").write_bytes(b"")
    return src


def test_committed_bundle_reads_back_every_file(store, local_tree, tmp_path):
    payload = save_sample(store, 3, local_dir=local_tree, metadata={"note": "x"})
    bundle = store.open(3)
    assert isinstance(bundle, Bundle) and isinstance(bundle.manifest, Manifest)
    for relpath, data in payload.items():
        assert bundle.read_bytes(relpath) == data
    assert bundle.read_bytes("data_plane/a.bin") == (local_tree / "a.bin").read_bytes()
    assert bundle.manifest.metadata == {"note": "x"}
    assert bundle.manifest.step == 3
    bundle.verify()


def test_get_dir_recreates_the_tree(store, local_tree, tmp_path):
    save_sample(store, 1, local_dir=local_tree)
    out = tmp_path / "out"
    store.open(1).get_dir("data_plane", out)
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert got == ["a.bin", "sub/b.txt", "sub/deeper/c"]
    assert (out / "a.bin").read_bytes() == (local_tree / "a.bin").read_bytes()


def test_get_file_and_open_return_logical_bytes(store, tmp_path):
    payload = save_sample(store, 2)
    bundle = store.open(2)
    bundle.get_file("policy/optim.bin", tmp_path / "optim.bin")
    assert (tmp_path / "optim.bin").read_bytes() == payload["policy/optim.bin"]
    with bundle.open("policy/weights.bin") as stream:
        assert stream.read() == payload["policy/weights.bin"]


def test_put_file_copies_a_local_file(store, tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(b"0123456789" * 1000)
    with store.begin(0) as txn:
        entry = txn.put_file("f.bin", src)
        txn.commit()
    assert entry.size == entry.logical_size == 10000
    assert store.open(0).read_bytes("f.bin") == src.read_bytes()


def test_zstd_file_is_stored_compressed_and_read_back_plain(store):
    data = b"\x00\x01" * 50_000
    with store.begin(5) as txn:
        txn.write_bytes("rows.bin", data, compression="zstd")
        manifest = txn.commit()
    entry = manifest.files["rows.bin"]
    assert entry.compression == "zstd"
    assert entry.logical_size == len(data)
    assert entry.size < len(data) // 10
    assert store.open(5).read_bytes("rows.bin") == data
    with store.open(5).open("rows.bin") as stream:
        assert stream.read() == data


def test_steps_are_ascending_and_latest_is_newest(store):
    assert store.steps() == [] and store.latest() is None
    for step in (10, 2, 30):
        save_sample(store, step)
    assert store.steps() == [2, 10, 30]
    assert store.latest() == 30


def test_marked_steps_name_every_step_with_a_commit_object_without_reading_it(store):
    for step in (3, 1):
        with store.begin(step) as txn:
            txn.write_bytes("x.bin", b"x")
            txn.commit({})
    with store.begin(2) as txn:  # being written: no COMMIT yet
        txn.write_bytes("x.bin", b"x")
        assert store.marked_steps() == [1, 3]


def test_open_of_missing_step_is_refused(store):
    save_sample(store, 1)
    with pytest.raises(UncommittedBundleError, match="step 4"):
        store.open(4)


def test_open_of_uncommitted_step_is_refused_while_it_is_written(store):
    save_sample(store, 1)
    with store.begin(2) as txn:
        txn.write_bytes("x", b"data")
        with pytest.raises(UncommittedBundleError, match="step 2"):
            store.open(2)
        assert store.steps() == [1]
        assert store.latest() == 1
        txn.abort()


def test_exception_inside_the_block_aborts_and_removes_everything(store):
    save_sample(store, 1)
    before = all_paths(store)
    with pytest.raises(RuntimeError, match="boom"), store.begin(2) as txn:
        txn.write_bytes("a", b"1" * 100)
        with txn.open("b") as stream:
            stream.write(b"partial")
            raise RuntimeError("boom")
    assert store.steps() == [1]
    assert all_paths(store) == before
    assert debris(store) == []


def test_leaving_the_block_without_commit_aborts(store):
    with store.begin(7) as txn:
        txn.write_bytes("a", b"1")
    assert store.steps() == []
    assert debris(store) == []
    save_sample(store, 7)  # the step can be written again
    assert store.steps() == [7]


def test_failed_file_inside_a_transaction_is_not_part_of_the_bundle(store):
    with store.begin(1) as txn:
        txn.write_bytes("kept", b"k")
        with pytest.raises(ValueError), txn.open("dropped") as stream:
            stream.write(b"half")
            raise ValueError("writer failed")
        manifest = txn.commit()
    assert sorted(manifest.files) == ["kept"]
    store.open(1).verify()


def test_transaction_cannot_be_used_after_commit(store):
    txn = store.begin(1)
    txn.write_bytes("a", b"1")
    txn.commit()
    with pytest.raises(TransactionStateError):
        txn.write_bytes("b", b"2")
    with pytest.raises(TransactionStateError):
        txn.commit()
    with pytest.raises(TransactionStateError):
        txn.abort()


def test_commit_with_an_open_file_is_refused(store):
    with store.begin(1) as txn:
        stream = txn.open("a")
        stream.write(b"x")
        with pytest.raises(TransactionStateError, match="still open"):
            txn.commit()
        stream.close()
        txn.commit()
    assert store.open(1).read_bytes("a") == b"x"


def test_entries_report_committed_and_in_progress_steps(store):
    save_sample(store, 1)
    with store.begin(2) as txn:
        txn.write_bytes("a", b"1")
        entries = {e.step: e for e in store.entries()}
        assert entries[1].state == "committed"
        assert entries[1].files == len(sample_payload(1))
        assert entries[1].created is not None
        assert entries[2].state == "writing"
        assert entries[2].txid == txn.txid
        assert (entries[2].files, entries[2].size) == (1, 1)
        txn.abort()
    assert [e.step for e in store.entries()] == [1]


def test_memory_url_works_too():
    store = BundleStore("memory://rlckpt-roundtrip-test")
    payload = save_sample(store, 1)
    assert store.open(1).read_bytes("train_dataloader.pt") == payload["train_dataloader.pt"]


def test_run_that_does_not_exist_yet_lists_as_empty(store_location):
    url, options = store_location
    store = BundleStore(url, options)
    assert store.steps() == []
    assert store.latest() is None
    assert store.entries() == []


def test_gc_of_a_run_that_does_not_exist_yet_removes_nothing(store_location):
    url, options = store_location
    report = BundleStore(url, options).gc(keep_last=1)
    assert (report.removed, report.deleted_steps, report.kept_steps) == ([], [], [])


def test_is_local_tells_local_disk_from_object_stores(store_location, tmp_path):
    url, options = store_location
    assert BundleStore(url, options).is_local == (options is None)
    assert BundleStore(f"file://{tmp_path}/other").is_local
    assert not BundleStore("memory://rlckpt-is-local").is_local
