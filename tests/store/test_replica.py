"""A replica is the same bundle in another store: the source's COMMIT and manifest bytes, its stored file
bytes, its txid; every byte checked as it is read; committed only when complete, through the destination's
own transaction. A copy that fails or is killed leaves nothing committed, and a copy run again keeps what
the dead one finished (each file read back first).

Each test runs local -> local, local -> S3 (promote) and S3 -> local (pull down)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rlckpt.errors import BundleExistsError, CorruptBundleError, ReplicaError, RunIdentityError, StoreUnavailableError
from rlckpt.store import BundleStore, SigningKey, copy_bundle
from support.faults import FaultPlan, FaultyFileSystem, InjectedFault
from support.outage import ONE_QUICK_ATTEMPT, Outage
from support.pause import Background, PauseAt
from support.store_checks import (
    all_paths,
    corrupt_file,
    debris,
    declare_writers_dead,
    rewrite_as_format_1,
    save_sample,
    stored_path,
)

DIRECTIONS = ["local-to-local", "local-to-s3", "s3-to-local"]


@pytest.fixture(params=DIRECTIONS)
def ends(request, tmp_path) -> tuple[BundleStore, BundleStore]:
    """(source, destination), each with its own run location: two tiers of one run (the same _run.json id,
    as a two-tier run's replication and `rlckpt copy` give the destination)."""

    def store(kind: str, name: str) -> BundleStore:
        if kind == "local":
            return BundleStore(str(tmp_path / name))
        url = request.getfixturevalue("s3_run_url")
        return BundleStore(f"{url}-{name}", dict(request.getfixturevalue("s3_storage_options")))

    src_kind, _, dst_kind = request.param.split("-")
    src, dst = store(src_kind, "src"), store(dst_kind, "dst")
    run = src.ensure_run_record()
    dst.ensure_run_record(run)
    return src, dst


def stored_bytes(store: BundleStore, step: int) -> dict[str, bytes]:
    """Every file of a committed bundle as stored, COMMIT and manifest.json included."""
    manifest = store.open(step).manifest
    names = [*manifest.files, "manifest.json", "COMMIT"]
    return {rel: bytes(store.fs.cat_file(stored_path(store, step, rel))) for rel in names}


# --- the copy is the same bundle ---------------------------------------------------------------------


def test_a_replica_holds_the_same_bytes_under_the_same_txid(ends):
    src, dst = ends
    save_sample(src, 3)
    report = copy_bundle(src, 3, dst)
    assert (report.copied_files, report.adopted_files, report.already) == (3, 0, False)
    assert dst.steps() == [3]
    assert dst.open(3).verify().txid == src.open(3).manifest.txid
    assert stored_bytes(dst, 3) == stored_bytes(src, 3)  # COMMIT, manifest and every stored byte


def test_a_file_stored_compressed_is_copied_compressed(ends):
    src, dst = ends
    payload = save_sample(src, 3)  # policy/optim.bin is written with zstd
    copy_bundle(src, 3, dst)
    entry = dst.open(3).manifest.files["policy/optim.bin"]
    assert entry.compression == "zstd" and entry.size < entry.logical_size
    assert dst.open(3).read_bytes("policy/optim.bin") == payload["policy/optim.bin"]


def test_a_sha256_bundle_is_copied_with_its_digests_carried(ends):
    src, dst = ends
    save_sample(src, 3)
    manifest_bytes = rewrite_as_format_1(src, 3)
    copy_bundle(src, 3, dst)
    assert dst.records(3).manifest_bytes == manifest_bytes
    assert dst.open(3).verify().digest_algorithms == ("sha256",)


def test_copying_a_bundle_the_destination_holds_writes_nothing(ends):
    src, dst = ends
    save_sample(src, 3)
    copy_bundle(src, 3, dst)
    before = all_paths(dst)
    assert copy_bundle(src, 3, dst).already
    assert all_paths(dst) == before


def test_a_destination_holding_another_bundle_of_the_step_is_refused(ends):
    src, dst = ends
    save_sample(src, 3)
    save_sample(dst, 3)
    theirs = dst.records(3)
    with pytest.raises(BundleExistsError, match="holds another bundle"):
        copy_bundle(src, 3, dst)
    assert dst.records(3) == theirs
    dst.open(3).verify()


def test_a_destination_that_is_another_run_is_refused_and_keeps_what_it_holds(ends):
    """A replica carries its COMMIT, which names the source's run: a store whose _run.json names another
    run would hold a bundle that a reader with the run's verify key refuses."""
    src, dst = ends
    other = BundleStore(f"{dst.url}-other", dst.storage_options)
    save_sample(src, 3)
    save_sample(other, 5)
    before = all_paths(other)
    with pytest.raises(RunIdentityError, match="not run"):
        copy_bundle(src, 3, other)
    assert all_paths(other) == before
    assert other.steps() == [5]


def test_a_signed_bundle_replicated_verifies_at_the_destination_under_the_runs_verify_key(ends):
    """The signature is carried, never made anew: the destination needs no signing key, and a reader there
    with the run's verify key reads the copy as this run's bundle."""
    src, dst = ends
    key = SigningKey.generate()
    save_sample(BundleStore(src.url, src.storage_options, signing_key=key), 3)
    copy_bundle(BundleStore(src.url, src.storage_options, verify_key=key.public), 3, dst)
    reader = BundleStore(dst.url, dst.storage_options, verify_key=key.public)
    assert reader.steps() == [3]
    reader.open(3).verify()


def test_a_replica_into_a_new_store_takes_its_sources_run_record(ends):
    src, dst = ends
    fresh = BundleStore(f"{dst.url}-fresh", dst.storage_options)
    save_sample(src, 3)
    copy_bundle(src, 3, fresh)
    assert fresh.run_record() == src.run_record()
    assert fresh.records(3) == src.records(3)


def test_a_corrupt_bundle_in_the_destination_is_quarantined_and_replaced(ends):
    src, dst = ends
    save_sample(src, 3)
    save_sample(dst, 3)
    corrupt_file(dst, 3, "policy/weights.bin", "flip")
    copy_bundle(src, 3, dst)
    assert dst.records(3) == src.records(3)
    dst.open(3).verify()
    assert any(path.startswith("_quarantine/step_3-") for path in all_paths(dst))


# --- what is not copied ------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_a_source_file_that_does_not_verify_commits_nothing_and_is_named(ends, how):
    src, dst = ends
    save_sample(src, 3)
    corrupt_file(src, 3, "policy/weights.bin", how)
    with pytest.raises(CorruptBundleError, match="policy/weights.bin"):
        copy_bundle(src, 3, dst)
    assert dst.steps() == []
    assert debris(dst) == []  # aborted: nothing left for gc either


def test_commit_replica_refuses_a_copy_missing_a_file(ends):
    src, dst = ends
    save_sample(src, 3)
    records = src.records(3)
    with dst.begin(3, txid=records.manifest.txid) as txn:
        txn.write_bytes("train_dataloader.pt", src.open(3).read_bytes("train_dataloader.pt"))
        with pytest.raises(ReplicaError, match="policy/optim.bin is in the manifest but was not copied"):
            txn.commit_replica(records)
    assert dst.steps() == [] and debris(dst) == []


def test_commit_replica_refuses_a_file_of_other_bytes(ends):
    src, dst = ends
    save_sample(src, 3)
    records = src.records(3)
    bundle = src.open(3)
    with dst.begin(3, txid=records.manifest.txid) as txn:
        for rel, entry in records.manifest.files.items():
            with txn.open(rel) as out:
                if rel == "policy/weights.bin":
                    out.write(b"X" * entry.size)
                else:
                    bundle.read_stored(rel, out.write)
        with pytest.raises(ReplicaError, match="policy/weights.bin was copied with blake3:"):
            txn.commit_replica(records)
    assert dst.steps() == [] and debris(dst) == []


def test_commit_replica_refuses_records_of_another_transaction(ends):
    src, dst = ends
    save_sample(src, 3)
    records = src.records(3)
    with dst.begin(3) as txn, pytest.raises(ReplicaError, match="runs under the txid its manifest names"):
        txn.commit_replica(records)
    assert dst.steps() == []


# --- interrupted copies ------------------------------------------------------------------------------


def test_a_failure_at_every_storage_call_of_the_destination_commits_nothing_and_a_rerun_completes(ends):
    src, dst = ends
    save_sample(src, 3)
    real = dst.fs
    counting = BundleStore(dst.url, dst.storage_options, fs=FaultyFileSystem(real), max_workers=1)
    copy_bundle(src, 3, counting, max_workers=1)
    total = counting.fs.plan.count
    dst.backend.delete_bundle("step_3")
    outcomes = []
    for k in range(1, total + 1):
        faulty = BundleStore(dst.url, dst.storage_options, fs=FaultyFileSystem(real, FaultPlan(k, sticky=True)))
        try:
            copy_bundle(src, 3, faulty, max_workers=1)
            outcomes.append(True)
        except Exception as exc:
            assert isinstance(exc, InjectedFault) or isinstance(exc.__cause__, InjectedFault), exc
            assert dst.steps() == [], f"a copy that failed at call {k} committed"
            outcomes.append(False)
        if outcomes[-1]:
            dst.open(3).verify()
            dst.backend.delete_bundle("step_3")
        declare_writers_dead(dst)  # the copying process died at call k
        dst.gc(stale_after=0)
        assert debris(dst) == []
    assert not all(outcomes)
    copy_bundle(src, 3, dst)
    assert stored_bytes(dst, 3) == stored_bytes(src, 3)


COPIER = textwrap.dedent(
    """
    import json, sys, time
    from rlckpt.store import BundleStore, bundle, copy_bundle
    from rlckpt.store.io import files
    src_url, dst_url = sys.argv[1], sys.argv[3]
    src_options, dst_options = json.loads(sys.argv[2]), json.loads(sys.argv[4])
    read_stored = bundle.Bundle.read_stored
    started = []
    # a closed file finishes (its upload completes) in the background: here at once, so that the first file
    # is in place before the second is read
    files.FileWriter._in_background = lambda self, rel, pending: pending.complete()

    def held(self, rel, sink, progress=None):
        if started:  # the first (largest) file is in place: die while the second is open
            print("one file copied", flush=True)
            time.sleep(120)
        started.append(rel)
        return read_stored(self, rel, sink, progress)

    bundle.Bundle.read_stored = held
    copy_bundle(BundleStore(src_url, src_options or None), 3, BundleStore(dst_url, dst_options or None), max_workers=1)
    """
)


def test_a_sigkilled_copy_commits_nothing_and_a_rerun_keeps_the_file_it_finished(ends):
    src, dst = ends
    save_sample(src, 3)
    argv = [src.url, json.dumps(src.storage_options), dst.url, json.dumps(dst.storage_options)]
    proc = subprocess.Popen([sys.executable, "-c", COPIER, *argv], stdout=subprocess.PIPE, env=dict(os.environ))
    try:
        assert proc.stdout.readline().strip() == b"one file copied"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert dst.steps() == []
    assert {e.step: e.state for e in dst.entries()} == {3: "stale"}  # its writer's pid is dead
    report = copy_bundle(src, 3, dst)
    assert (report.adopted_files, report.copied_files) == (1, 2)
    assert report.adopted_bytes == max(entry.size for entry in src.open(3).manifest.files.values())
    assert stored_bytes(dst, 3) == stored_bytes(src, 3)
    dst.gc()
    assert debris(dst) == []


def test_an_adopted_file_that_does_not_read_back_intact_is_copied_again(ends):
    src, dst = ends
    save_sample(src, 3)
    records = src.records(3)
    txn = dst.begin(3, txid=records.manifest.txid)
    txn.write_bytes("policy/weights.bin", b"Y" * records.manifest.files["policy/weights.bin"].size)
    declare_writers_dead(dst)  # the attempt that wrote it died
    report = copy_bundle(src, 3, dst)
    assert (report.adopted_files, report.copied_files) == (0, 3)
    assert stored_bytes(dst, 3) == stored_bytes(src, 3)


def test_a_file_a_dead_copy_left_that_does_not_read_back_is_taken_from_the_destinations_bundle_before(ends):
    src, dst = ends
    for step in (2, 3):
        with src.begin(step) as txn:
            txn.write_bytes("frozen.bin", b"f" * 5000)
            txn.write_bytes("live.bin", bytes([step]) * 100)
            txn.commit()
    copy_bundle(src, 2, dst)
    txn = dst.begin(3, txid=src.records(3).manifest.txid)
    txn.write_bytes("frozen.bin", b"Y" * 5000)  # what an attempt that died wrong left in place
    declare_writers_dead(dst)
    report = copy_bundle(src, 3, dst, reuse=True)
    assert (report.adopted_files, report.reused_files, report.copied_files) == (0, 1, 1)
    dst.open(3).verify()
    assert dst.open(3).read_bytes("frozen.bin") == b"f" * 5000


def test_an_s3_server_gone_mid_copy_commits_nothing_and_the_next_copy_goes_through_once_it_is_back(
    tmp_path, s3_run_url, s3_storage_options
):
    src = BundleStore(str(tmp_path / "src"))
    save_sample(src, 1)
    save_sample(src, 2)
    with Outage(s3_storage_options["endpoint_url"]) as outage:
        options = {**s3_storage_options, "endpoint_url": outage.endpoint, "config_kwargs": ONE_QUICK_ATTEMPT}
        through = BundleStore(s3_run_url, options)
        with PauseAt(through.backend, "finish_write", when="after") as pause:
            copy = Background(copy_bundle, src, 1, through, max_workers=1)
            pause.wait_reached()  # the first file is in place
            outage.cut()  # the server goes away
        with pytest.raises(StoreUnavailableError):
            copy.result()
    back = BundleStore(s3_run_url, s3_storage_options)  # the server is back
    assert back.steps() == []
    copy_bundle(src, 2, back)  # the next replication
    assert back.steps() == [2]
    declare_writers_dead(back)  # once the process whose copy failed is gone, its debris is gc's
    back.gc()
    assert debris(back) == []
