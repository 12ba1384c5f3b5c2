"""Reuse of unchanged files (`begin(step, reuse=True)`): a file whose bytes are the previous bundle's file of
the same path is taken from it (a hard link on local disk, a copy inside the server on S3), never sent again,
and every bundle stays whole on its own whatever happens to the one it took files from. Same bodies on local
disk and S3."""

from __future__ import annotations

import os

import pytest

from rlckpt.store import BundleStore, TransactionHandle, copy_bundle
from rlckpt.store.io import reuse as reuse_module
from support.store_checks import debris, declare_writers_dead, stored_path

FROZEN = b"frozen weights " * 4000  # 60,000 bytes, the same at every save
LIVE_SIZE = 3000


@pytest.fixture
def store(store_location):
    url, options = store_location
    return BundleStore(url, options)


def save(store, step, files, reuse=True):
    """A bundle of `files` (relpath -> bytes); the transaction's reused files (relpath -> entry)."""
    with store.begin(step, reuse=reuse) as txn:
        for rel, data in files.items():
            with txn.open(rel, compression="zstd" if rel.endswith(".zst") else None) as stream:
                stream.write(data)
        txn.commit({"step": step})
    return txn.reused


def frozen_and_live(step):
    return {"policy/frozen.bin": FROZEN, "policy/live.bin": bytes([step]) * LIVE_SIZE, "extra.zst": FROZEN[:5000]}


def read_back(store, step):
    bundle = store.open(step)
    bundle.verify()
    return {rel: bundle.read_bytes(rel) for rel in bundle.manifest.files}


def test_a_file_unchanged_since_the_previous_bundle_is_taken_from_it(store):
    assert save(store, 1, frozen_and_live(1)) == {}  # the run's first save has no base: everything written
    reused = save(store, 2, frozen_and_live(2))
    assert sorted(reused) == ["extra.zst", "policy/frozen.bin"]  # compressed ones too: the stored bytes match
    assert read_back(store, 2) == frozen_and_live(2)
    assert store.open(2).manifest.files["policy/frozen.bin"] == store.open(1).manifest.files["policy/frozen.bin"]


def test_a_file_whose_bytes_changed_is_written(store):
    save(store, 1, {"a.bin": b"x" * 5000})
    assert save(store, 2, {"a.bin": b"y" * 5000}) == {}
    assert read_back(store, 2) == {"a.bin": b"y" * 5000}


def test_a_file_under_another_path_is_written(store):
    save(store, 1, {"a.bin": FROZEN})
    assert save(store, 2, {"b.bin": FROZEN}) == {}
    assert read_back(store, 2) == {"b.bin": FROZEN}


def test_without_reuse_every_file_is_written(store):
    save(store, 1, frozen_and_live(1))
    assert save(store, 2, frozen_and_live(2), reuse=False) == {}
    with store.begin(3) as txn:
        assert txn.base is None
        txn.abort()


def test_the_base_is_the_newest_committed_bundle_below_the_step(store):
    save(store, 1, {"a.bin": b"1" * 100})
    save(store, 5, {"a.bin": b"5" * 100})
    save(store, 9, {"a.bin": b"9" * 100})
    with store.begin(7, reuse=True) as txn:
        assert (txn.base.step, txn.base.txid) == (5, store.open(5).manifest.txid)
        txn.abort()


def test_a_bundle_stays_whole_once_the_bundle_it_took_files_from_is_deleted(store):
    save(store, 1, frozen_and_live(1))
    save(store, 2, frozen_and_live(2))
    report = store.gc(keep_last=1)
    assert report.deleted_steps == [1]
    assert store.steps() == [2]
    assert read_back(store, 2) == frozen_and_live(2)
    assert save(store, 3, frozen_and_live(3))  # and the next save takes them from the survivor
    assert read_back(store, 3) == frozen_and_live(3)


def test_on_local_disk_an_unchanged_file_is_stored_once(tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    save(store, 1, frozen_and_live(1))
    save(store, 2, frozen_and_live(2))
    first, second = (os.stat(stored_path(store, s, "policy/frozen.bin")) for s in (1, 2))
    assert os.path.samestat(first, second)
    assert not os.path.samestat(*(os.stat(stored_path(store, s, "policy/live.bin")) for s in (1, 2)))


def test_a_base_deleted_while_the_save_runs_is_written_instead(store):
    save(store, 1, frozen_and_live(1))
    with store.begin(2, reuse=True) as txn:
        assert txn.base.step == 1
        store.backend.delete_bundle("step_1")  # retention of another process, between begin and the write
        txn.write_bytes("policy/frozen.bin", FROZEN)
        txn.commit()
    assert txn.reused == {}
    assert read_back(store, 2) == {"policy/frozen.bin": FROZEN}


def test_a_base_replaced_by_another_bundle_of_its_step_gives_none_of_that_bundles_bytes(store):
    """The base (step 2) is deleted and step 2 saved anew, with other bytes of the same size at the same path,
    between this save's begin and its write: what is committed is this save's bytes, not the new bundle's."""
    save(store, 2, {"a.bin": b"T" * 5000})
    with store.begin(3, reuse=True) as txn:
        store.backend.delete_bundle("step_2")
        save(store, 2, {"a.bin": b"U" * 5000}, reuse=False)
        txn.write_bytes("a.bin", b"T" * 5000)
        txn.commit()
    assert txn.reused == {}
    assert read_back(store, 3) == {"a.bin": b"T" * 5000}
    assert read_back(store, 2) == {"a.bin": b"U" * 5000}


def test_participants_take_unchanged_files_from_the_base_too(store):
    save(store, 1, {"rank0/shard.bin": FROZEN, "rank1/shard.bin": b"old" * 1000})
    with store.begin(2, reuse=True) as txn:
        handle = TransactionHandle.from_json(txn.handle().to_json())  # as it travels to another process
        assert (handle.base_step, handle.base_txid) == (1, txn.base.txid)
        receipts = []
        for rank, data in (("rank0", FROZEN), ("rank1", b"new" * 1000)):
            with BundleStore.join(handle, rank) as part:
                part.write_bytes(f"{rank}/shard.bin", data)
                receipts.append(part.seal())
            assert sorted(part.reused) == (["rank0/shard.bin"] if rank == "rank0" else [])
        txn.commit(receipts=receipts, participants={"rank0", "rank1"})
    assert read_back(store, 2) == {"rank0/shard.bin": FROZEN, "rank1/shard.bin": b"new" * 1000}


def test_a_handle_without_a_base_reads_as_before():
    plain = {"url": "/r", "storage_options": {}, "step": 3, "txid": "abc"}
    assert TransactionHandle.from_json(plain).base_step is None
    with pytest.raises(ValueError, match="its base"):
        TransactionHandle.from_json({**plain, "base_step": 2, "base_txid": None})


def test_an_aborted_save_leaves_the_base_whole_and_nothing_behind(store):
    save(store, 1, frozen_and_live(1))
    with store.begin(2, reuse=True) as txn:
        txn.write_bytes("policy/frozen.bin", FROZEN)
        assert list(txn.reused) == ["policy/frozen.bin"]
        txn.abort()
    assert store.steps() == [1]
    assert read_back(store, 1) == frozen_and_live(1)
    declare_writers_dead(store)
    store.gc(stale_after=0)
    assert debris(store) == []


def test_a_file_too_large_to_hold_is_written_as_it_comes(store, monkeypatch):
    monkeypatch.setattr(reuse_module, "SPOOL_LIMIT", 10_000)
    save(store, 1, {"big.bin": FROZEN, "small.bin": FROZEN[:9000]})
    assert sorted(save(store, 2, {"big.bin": FROZEN, "small.bin": FROZEN[:9000]})) == ["small.bin"]
    assert read_back(store, 2) == {"big.bin": FROZEN, "small.bin": FROZEN[:9000]}


def test_a_copy_with_reuse_takes_unchanged_files_from_the_destinations_previous_bundle(store, tmp_path):
    save(store, 1, frozen_and_live(1))
    save(store, 2, frozen_and_live(2))
    dest = BundleStore(str(tmp_path / "copy"))
    assert copy_bundle(store, 1, dest, reuse=True).reused_files == 0
    report = copy_bundle(store, 2, dest, reuse=True)
    assert (report.reused_files, report.copied_files) == (2, 1)
    assert report.reused_bytes == sum(store.open(2).manifest.files[r].size for r in ("policy/frozen.bin", "extra.zst"))
    assert dest.records(2) == store.records(2)  # the same bundle, record for record
    assert read_back(dest, 2) == frozen_and_live(2)
    dest.gc(keep_last=1)
    assert read_back(dest, 2) == frozen_and_live(2)


def test_on_local_disk_a_symlink_planted_as_the_bases_file_is_not_followed(tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    save(store, 1, {"a.bin": FROZEN})
    secret = tmp_path / "secret"
    secret.write_bytes(FROZEN)  # the same bytes: only the refusal to follow stops the link
    planted = stored_path(store, 1, "a.bin")
    os.remove(planted)
    os.symlink(secret, planted)
    assert save(store, 2, {"a.bin": FROZEN}) == {}
    assert read_back(store, 2) == {"a.bin": FROZEN}
    assert not os.path.islink(stored_path(store, 2, "a.bin"))
    assert os.stat(stored_path(store, 2, "a.bin")).st_ino != os.stat(secret).st_ino


def test_a_bases_file_of_another_size_is_not_taken(store):
    save(store, 1, {"a.bin": FROZEN})
    store.fs.pipe_file(stored_path(store, 1, "a.bin"), FROZEN[:-1])  # truncated behind the store's back
    assert save(store, 2, {"a.bin": FROZEN}) == {}
    assert read_back(store, 2) == {"a.bin": FROZEN}
