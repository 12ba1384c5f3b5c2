"""Retention counts only bundles that fully verify: the newest good bundle is never deleted, and a corrupt
bundle is kept and reported, never counted as "the newest"."""

from __future__ import annotations

import threading

import pytest

from rlckpt.store import BundleStore
from support.store_checks import corrupt_file, save_sample

DAMAGE = ["flip", "truncate", "delete"]


@pytest.fixture
def store(store_location):
    url, options = store_location
    s = BundleStore(url, options)
    for step in (1, 2, 3):
        save_sample(s, step)
    return s


@pytest.mark.parametrize("how", DAMAGE)
def test_keep_last_keeps_the_newest_bundle_that_verifies_when_the_newest_is_corrupt(store, how):
    corrupt_file(store, 3, "policy/weights.bin", how)
    report = store.gc(keep_last=1)
    assert report.kept_steps == [2]
    assert report.deleted_steps == [1]
    assert report.corrupt_steps == [3]
    store.open(2).verify()  # something still loads


@pytest.mark.parametrize("how", DAMAGE)
def test_corrupt_bundles_are_not_counted_towards_keep_last(store, how):
    corrupt_file(store, 2, "policy/weights.bin", how)
    report = store.gc(keep_last=2)
    assert report.kept_steps == [1, 3]
    assert report.deleted_steps == []


def test_corrupt_bundle_is_kept_and_its_reason_reported(store):
    corrupt_file(store, 3, "policy/weights.bin", "flip")
    report = store.gc(keep_last=1)
    assert "policy/weights.bin" in report.corrupt_reasons[3]
    assert store.fs.exists(f"{store.root}/step_3/COMMIT")


def test_nothing_is_deleted_when_no_bundle_verifies(store):
    for step in (1, 2, 3):
        corrupt_file(store, step, "policy/weights.bin", "flip")
    report = store.gc(keep_last=1)
    assert report.deleted_steps == []
    assert report.corrupt_steps == [1, 2, 3]
    assert store.steps() == [1, 2, 3]  # the markers are intact: only verification tells


def test_dry_run_plans_the_same_retention_over_a_corrupt_newest_bundle(store):
    corrupt_file(store, 3, "policy/weights.bin", "flip")
    dry = store.gc(keep_last=1, dry_run=True)
    assert (dry.kept_steps, dry.deleted_steps, dry.corrupt_steps) == ([2], [1], [3])
    assert store.steps() == [1, 2, 3]


class _ReadersInFlight:
    """Wraps a backend's read_into: counts the reads of bundle files (not COMMIT or the manifest) running
    at once. The first waits (up to 2 s) for a second one to start, so readers that may overlap do,
    whatever the scheduling."""

    def __init__(self, read_into):
        self._read_into = read_into
        self._lock = threading.Lock()
        self._second = threading.Event()
        self.now = self.most = self.calls = 0

    def __call__(self, path, *args, **kwargs):
        if path.rsplit("/", 1)[-1] in ("COMMIT", "manifest.json"):
            return self._read_into(path, *args, **kwargs)
        with self._lock:
            self.now += 1
            self.calls += 1
            self.most = max(self.most, self.now)
            first = self.calls == 1
            if self.calls == 2:
                self._second.set()
        try:
            if first:
                self._second.wait(timeout=2.0)
            return self._read_into(path, *args, **kwargs)
        finally:
            with self._lock:
                self.now -= 1


def _gc_with_counted_reads(store, **gc_kwargs):
    reads = _ReadersInFlight(store.backend.read_into)
    store.backend.read_into = reads  # type: ignore[method-assign]
    report = store.gc(keep_last=1, **gc_kwargs)
    assert (report.kept_steps, report.deleted_steps) == ([3], [1, 2])
    assert reads.calls >= 3  # every file of step 3 was read: it counts only once it verifies
    return reads


def test_gc_with_max_workers_1_reads_one_file_at_a_time(store):
    assert _gc_with_counted_reads(store, max_workers=1).most == 1


def test_gc_reads_the_files_it_verifies_in_parallel_by_default(store):
    assert _gc_with_counted_reads(store).most > 1
