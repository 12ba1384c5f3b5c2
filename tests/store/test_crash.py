"""Crash consistency: a storage call fails at every point k of a full save (a process that dies there, or a
single transient failure), and a writer process killed with SIGKILL mid-save."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rlckpt.errors import StoreUnavailableError
from rlckpt.store import BundleStore
from rlckpt.store.backends.s3_io import PartBuffers
from support.faults import FaultPlan, FaultyFileSystem, InjectedFault
from support.store_checks import (
    all_paths,
    debris,
    declare_writers_dead,
    multipart_uploads,
    sample_payload,
    save_sample,
)

_FS_CACHE: dict[str, object] = {}


def real_fs(url, options):
    """One real filesystem per run URL (a new S3FileSystem costs ~0.3 s)."""
    if url not in _FS_CACHE:
        _FS_CACHE[url] = BundleStore(url, options).fs
    return _FS_CACHE[url]


def clean_store(url, options):
    return BundleStore(url, options, fs=real_fs(url, options))


def make_store(url, options, plan=None):
    """A store whose filesystem is a real one behind the fault injector (one worker: deterministic order)."""
    return BundleStore(url, options, fs=FaultyFileSystem(real_fs(url, options), plan or FaultPlan()), max_workers=1)


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "dp"
    src.mkdir()
    (src / "rows-0.bin").write_bytes(b"r0" * 500)
    (src / "rows-1.bin").write_bytes(b"r1" * 700)
    return src


def calls_of_a_full_save(url, options, tree, step):
    probe = make_store(url, options)
    save_sample(probe, step, local_dir=tree)
    n = probe.fs.plan.count
    probe.gc(keep_last=None)
    clean_store(url, options).backend.delete_bundle(f"step_{step}")
    return n


def check_after_crash(url, options, earlier, step, saved):
    clean = clean_store(url, options)
    expected = earlier + ([step] if saved else [])
    assert clean.steps() == expected
    assert clean.latest() == expected[-1]
    for s in expected:  # earlier bundles intact; a save that reported success is complete and verifies
        bundle = clean.open(s)
        bundle.verify()
        assert bundle.read_bytes("train_dataloader.pt") == sample_payload(s)["train_dataloader.pt"]
    declare_writers_dead(clean)  # the writer process died with its failed save
    clean.gc(stale_after=0)  # and its probe key, if the fault hit the probe, is not given a minute
    assert debris(clean) == []
    assert clean.steps() == expected
    return clean


@pytest.mark.parametrize("sticky", [True, False], ids=["dies-at-k", "fails-once-at-k"])
def test_failure_at_every_storage_call_of_a_save_keeps_earlier_bundles(store_location, tree, sticky):
    url, options = store_location
    base = clean_store(url, options)
    save_sample(base, 1, local_dir=tree)
    total = calls_of_a_full_save(url, options, tree, 3)
    assert total > 10
    outcomes = []
    for k in range(1, total + 1):
        store = make_store(url, options, FaultPlan(fail_at=k, sticky=sticky))
        try:
            save_sample(store, 3, local_dir=tree)
            saved = True
        except Exception as exc:  # the injected fault, possibly wrapped (e.g. in StoreUnavailableError)
            assert isinstance(exc, InjectedFault) or isinstance(exc.__cause__, InjectedFault), exc
            saved = False
        outcomes.append(saved)
        clean = check_after_crash(url, options, [1], 3, saved)
        if saved:
            clean.backend.delete_bundle("step_3")
    assert not all(outcomes), "no injected fault stopped the save"
    save_sample(clean, 3, local_dir=tree)  # after gc the step is writable again
    clean.open(3).verify()


def test_failure_at_every_storage_call_of_a_reusing_save_keeps_every_bundle_whole(store_location, tree):
    """A save that takes its unchanged files from the previous bundle (links on local disk, copies inside the
    server on S3) dies at each of its storage calls: the bundle it took them from stays whole, and so does
    the save when it reported success; gc leaves nothing behind."""
    url, options = store_location
    save_sample(clean_store(url, options), 1, local_dir=tree)
    probe = make_store(url, options)
    save_sample(probe, 3, local_dir=tree, reuse=True)
    total = probe.fs.plan.count
    if options:  # on S3 the two files of the tree are copies made by the server, one request each
        assert sum(call == "copy" for call in probe.fs.plan.calls) == 2
    clean_store(url, options).backend.delete_bundle("step_3")
    outcomes = []
    for k in range(1, total + 1):
        store = make_store(url, options, FaultPlan(fail_at=k, sticky=True))
        try:
            save_sample(store, 3, local_dir=tree, reuse=True)
            saved = True
        except Exception as exc:
            assert isinstance(exc, InjectedFault) or isinstance(exc.__cause__, InjectedFault), exc
            saved = False
        outcomes.append(saved)
        clean = check_after_crash(url, options, [1], 3, saved)
        assert clean.open(1).read_bytes("data_plane/rows-0.bin") == b"r0" * 500
        if saved:
            assert clean.open(3).read_bytes("data_plane/rows-1.bin") == b"r1" * 700
            clean.backend.delete_bundle("step_3")
    assert not all(outcomes), "no injected fault stopped the save"


PART = 5 << 20  # S3's smallest part: a file of 2 parts and a bit uploads its parts beside each other


def save_with_parts(store, step):
    """A save whose one big file is a multipart upload on S3 (parts in flight together), and a small one."""
    with store.begin(step) as txn:
        txn.write_bytes("train_dataloader.pt", sample_payload(step)["train_dataloader.pt"])
        with txn.open("policy/shard.bin") as stream:
            stream.write(b"p" * (2 * PART + 1000))
        txn.commit()


def test_failure_at_every_storage_call_of_a_save_with_parallel_parts_keeps_earlier_bundles(
    s3_run_url, s3_storage_options
):
    """Every request of the parallel multipart upload (create, each part, complete, abort) is a storage call
    a fault can hit, in whatever order the parts go out; a writer that dies there leaves no bundle, and gc
    finds its incomplete upload."""
    url, options = s3_run_url, s3_storage_options
    save_sample(clean_store(url, options), 1)

    def parts_store(plan):
        store = make_store(url, options, plan)
        store.backend.part_buffers = PartBuffers(PART, max_idle=2)
        return store

    probe = parts_store(FaultPlan())
    save_with_parts(probe, 3)
    total = probe.fs.plan.count
    assert sum(call.endswith("upload_part") for call in probe.fs.plan.calls) == 3
    clean_store(url, options).backend.delete_bundle("step_3")
    outcomes = []
    for k in range(1, total + 1):
        try:
            save_with_parts(parts_store(FaultPlan(fail_at=k, sticky=True)), 3)
            saved = True
        except Exception as exc:
            assert isinstance(exc, InjectedFault) or isinstance(exc.__cause__, InjectedFault), exc
            saved = False
        outcomes.append(saved)
        clean = check_after_crash(url, options, [1], 3, saved)
        if saved:
            clean.backend.delete_bundle("step_3")
    assert not any(outcomes[: total - 2]), "a save whose writer died before its commit was published"


def test_transient_failure_is_cleaned_up_by_abort_without_gc(store_location, tree):
    url, options = store_location
    base = clean_store(url, options)
    save_sample(base, 1)
    before = all_paths(base)
    total = calls_of_a_full_save(url, options, tree, 2)
    store = make_store(url, options, FaultPlan(fail_at=total // 2, sticky=False))
    with pytest.raises(Exception, match="injected fault"):
        save_sample(store, 2, local_dir=tree)
    assert all_paths(base) == before


WRITER = textwrap.dedent(
    """
    import json, sys, time
    from rlckpt.store import BundleStore
    url, options = sys.argv[1], json.loads(sys.argv[2])
    store = BundleStore(url, options)
    txn = store.begin(2)
    txn.write_bytes("small.bin", b"s" * 1000)
    stream = txn.open("big.bin")
    stream.write(b"b" * (20 << 20))   # more than one multipart part on S3
    stream.flush()
    print("writing", flush=True)
    time.sleep(60)
    """
)


def kill_once_writing(script: str, url: str, options: dict | None) -> None:
    """Run a writer `script` in a process of its own and SIGKILL it once it prints "writing"."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, url, json.dumps(options or {})], stdout=subprocess.PIPE, env=dict(os.environ)
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def test_sigkilled_writer_leaves_earlier_bundle_intact_and_gc_cleans_up(store_location):
    url, options = store_location
    store = BundleStore(url, options)
    save_sample(store, 1)
    kill_once_writing(WRITER, url, options)
    assert store.steps() == [1]
    store.open(1).verify()
    states = {e.step: e.state for e in store.entries()}
    assert states == {1: "committed", 2: "stale"}  # the writer's pid is dead: stale at once
    if options:
        assert multipart_uploads(store), "the killed writer should have left an incomplete upload"
    report = store.gc()  # default threshold: a dead pid on this host is enough
    assert report.live == []
    assert debris(store) == []
    assert store.steps() == [1]
    save_sample(store, 2)
    assert store.steps() == [1, 2]


REUSING_WRITER = textwrap.dedent(
    """
    import json, sys, time
    from rlckpt.store import BundleStore
    url, options = sys.argv[1], json.loads(sys.argv[2])
    store = BundleStore(url, options)
    txn = store.begin(2, reuse=True)
    txn.write_bytes("frozen.bin", b"f" * 100_000)   # step 1's: taken from it (a link, a server-side copy)
    assert list(txn.reused) == ["frozen.bin"], txn.reused
    stream = txn.open("big.bin")
    stream.write(b"b" * (20 << 20))
    stream.flush()
    print("writing", flush=True)
    time.sleep(60)
    """
)


def test_a_sigkilled_reusing_writer_leaves_the_bundle_it_took_from_whole_and_gc_cleans_up(store_location):
    url, options = store_location
    store = BundleStore(url, options)
    with store.begin(1) as txn:
        txn.write_bytes("frozen.bin", b"f" * 100_000)
        txn.commit()
    kill_once_writing(REUSING_WRITER, url, options)
    assert store.steps() == [1]
    store.gc()
    assert debris(store) == []
    bundle = store.open(1)
    bundle.verify()
    assert bundle.read_bytes("frozen.bin") == b"f" * 100_000


def test_unfinished_s3_file_closed_by_its_finalizer_publishes_nothing(s3_run_url, s3_storage_options):
    """fsspec's __del__ closes an abandoned unfinished file (e.g. garbage in a reference cycle, finalizers in
    any order): only the store's success path may publish an object, so that close must not."""
    store = BundleStore(s3_run_url, s3_storage_options)
    path = store.backend.path("step_5", "partial.bin")
    raw = store.backend.open_write(path)
    raw.write(b"half a file")
    raw.__del__()  # what the garbage collector does to it
    assert not store.fs.exists(path)
    store.gc(stale_after=0)  # the upload it may have started is removed like a crashed writer's
    assert debris(store) == []


def test_a_file_whose_fsync_fails_in_the_background_fails_the_commit_naming_it(tmp_path, monkeypatch):
    """Local disk fsyncs each file on the writer's sync thread while the next one is written: a sync that
    fails there must still keep the bundle from being published. (Object stores have no fsync: an upload
    that returned is durable.)"""
    from rlckpt.store.backends.local import LocalBackend

    real_fsync = LocalBackend._fsync_file

    def failing_fsync(self, path):
        if path.endswith("/b.bin"):
            raise OSError(errno.EIO, "Input/output error", path)
        return real_fsync(self, path)

    monkeypatch.setattr(LocalBackend, "_fsync_file", failing_fsync)
    store = BundleStore(str(tmp_path / "run"))
    txn = store.begin(2)
    txn.write_bytes("a.bin", b"a" * 100)
    txn.write_bytes("b.bin", b"b" * 100)
    with pytest.raises(StoreUnavailableError, match="syncing b.bin"):
        txn.commit()
    assert store.steps() == []
    assert debris(store) == []
