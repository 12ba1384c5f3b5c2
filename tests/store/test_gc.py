"""gc: retention keeps the newest bundles, removes what dead transactions left, never touches live ones."""

from __future__ import annotations

import pytest

from rlckpt.store import BundleStore
from support.store_checks import abandoned_transaction, all_paths, debris, plant, save_sample


@pytest.fixture
def store(store_location):
    url, options = store_location
    return BundleStore(url, options)


def test_keep_last_deletes_older_bundles_only(store):
    for step in (1, 2, 3, 4):
        save_sample(store, step)
    report = store.gc(keep_last=2)
    assert report.deleted_steps == [1, 2]
    assert report.kept_steps == [3, 4]
    assert store.steps() == [3, 4]
    assert debris(store) == []
    store.open(3).verify()
    store.open(4).verify()


def test_keep_last_below_one_is_refused_so_the_newest_survives(store):
    save_sample(store, 1)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="keep_last"):
            store.gc(keep_last=bad)
    assert store.steps() == [1]


def test_dry_run_reports_but_removes_nothing(store):
    for step in (1, 2):
        save_sample(store, step)
    abandoned_transaction(store, 3)
    before = all_paths(store)
    report = store.gc(keep_last=1, dry_run=True)
    assert report.dry_run and report.deleted_steps == [1]
    assert report.removed  # the crashed transaction's intent and data
    assert all_paths(store) == before
    assert store.steps() == [1, 2]


def test_live_transaction_is_left_alone(store):
    save_sample(store, 1)
    with store.begin(2) as live:
        live.write_bytes("a", b"1")
        report = store.gc(keep_last=1)
        assert report.live == [live.txid]
        assert report.removed == []
        live.write_bytes("b", b"2")
        live.commit()
    assert store.steps() == [1, 2]
    store.open(2).verify()


def test_stale_transaction_is_removed_and_its_step_is_writable_again(store):
    save_sample(store, 1)
    abandoned_transaction(store, 2)  # never ended: a writer that hung or died on another host
    assert {e.step: e.state for e in store.entries()}[2] == "stale"
    report = store.gc()
    assert any("_txn" in p for p in report.removed)
    assert debris(store) == []
    assert store.steps() == [1]
    save_sample(store, 2)
    assert store.steps() == [1, 2]


def test_begin_takes_over_a_stale_claim(store_location):
    url, options = store_location
    store = BundleStore(url, options)
    abandoned_transaction(store, 5, {"a": b"old"})
    save_sample(store, 5)
    bundle = store.open(5)
    bundle.verify()
    assert "a" not in bundle.manifest.files


def test_uncommitted_step_data_without_intent_is_debris(store):
    save_sample(store, 1)
    store.fs.makedirs(f"{store.root}/step_7", exist_ok=True)
    store.fs.pipe_file(f"{store.root}/step_7/orphan.bin", b"x")
    assert {e.step: e.state for e in store.entries()}[7] == "uncommitted"
    report = store.gc()
    assert f"{store.root}/step_7" in report.removed
    assert debris(store) == []


def test_corrupt_committed_bundle_is_reported_not_deleted(store):
    save_sample(store, 1)
    save_sample(store, 2)
    store.fs.pipe_file(f"{store.root}/step_1/COMMIT", b"garbage")
    report = store.gc(keep_last=1)
    assert report.corrupt_steps == [1]
    assert report.deleted_steps == []
    assert store.fs.exists(f"{store.root}/step_1/manifest.json")


def test_gc_removes_a_probe_key_a_crashed_probe_left_but_not_one_in_flight(store):
    save_sample(store, 1)
    plant(store, "_probe/0123abcd", b"probe-1")
    report = store.gc()  # written a moment ago: a probe may be between its two PUTs
    assert report.removed == []
    assert "_probe/0123abcd" in all_paths(store)
    report = store.gc(stale_after=0)
    assert report.removed == [f"{store.root}/_probe/0123abcd"]
    assert debris(store) == []
