"""Many writers, one commit: participants write straight into the transaction and seal receipts; the
coordinator commits once, refuses any disagreement, and no participant of an aborted or taken-over
transaction can change or break a committed bundle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rlckpt.errors import LostWriteError, ParticipantError, SharedStorageError, TransactionStateError
from rlckpt.store import BundleStore, Receipt
from support.store_checks import (
    debris,
    declare_writers_dead,
    make_intent_foreign,
    multipart_uploads,
    save_sample,
)


@pytest.fixture
def store(store_location):
    url, options = store_location
    s = BundleStore(url, options)
    save_sample(s, 1)
    return s


def shard(rank: int, n: int = 0) -> bytes:
    return bytes((rank * 31 + n + i) % 251 for i in range(2000))


def participate(store, txn, name, files):
    """A participant (here: in this process) writes `files` and seals them."""
    with BundleStore.join(txn.handle(), name) as writer:
        for rel, data in files.items():
            writer.write_bytes(rel, data)
        return writer.seal()


# --- the happy path -----------------------------------------------------------------------------------

PARTICIPANT = textwrap.dedent(
    """
    import json, sys
    from rlckpt.store import BundleStore, TransactionHandle
    handle = TransactionHandle.from_json(json.loads(sys.argv[1]))
    rank = int(sys.argv[2])
    with BundleStore.join(handle, f"rank{rank}") as writer:
        writer.write_bytes(f"policy/__{rank}_0.distcp", bytes((rank * 31 + i) % 251 for i in range(2000)))
        with writer.open(f"policy/__{rank}_1.distcp", compression="zstd") as stream:
            stream.write(b"optimizer-%d-" % rank * 500)
        print(json.dumps(writer.seal().to_json()), flush=True)
    """
)


def test_participants_in_other_processes_write_into_one_commit(store):
    txn = store.begin(2)
    txn.write_bytes("train_dataloader.pt", b"position")
    handle = json.dumps(txn.handle().to_json())
    procs = [
        subprocess.run(
            [sys.executable, "-c", PARTICIPANT, handle, str(rank)],
            capture_output=True,
            timeout=120,
            env=dict(os.environ),
        )
        for rank in (0, 1)
    ]
    for proc in procs:
        assert proc.returncode == 0, proc.stderr.decode()
    receipts = [Receipt.from_json(json.loads(proc.stdout)) for proc in procs]
    manifest = txn.commit({"world_size": 2}, receipts=receipts, participants={"rank0", "rank1"})
    assert sorted(manifest.files) == [
        "policy/__0_0.distcp",
        "policy/__0_1.distcp",
        "policy/__1_0.distcp",
        "policy/__1_1.distcp",
        "train_dataloader.pt",
    ]
    bundle = store.open(2)
    bundle.verify()
    assert bundle.read_bytes("policy/__1_0.distcp") == shard(1)
    assert bundle.read_bytes("policy/__0_1.distcp") == b"optimizer-0-" * 500
    assert debris(store) == []


def test_participant_files_are_part_of_the_bundle_only_through_their_receipt(store):
    txn = store.begin(2)
    receipt = participate(store, txn, "rank0", {"a.bin": shard(0)})
    manifest = txn.commit(receipts=[receipt])
    assert sorted(manifest.files) == ["a.bin"]
    store.open(2).verify()


# --- refusals: nothing is published --------------------------------------------------------------------


def refused(store, txn, error, match, **commit_kwargs):
    with pytest.raises(error, match=match):
        txn.commit(**commit_kwargs)
    assert store.steps() == [1]
    assert debris(store) == []  # the refusal aborted the whole transaction, participants' files included


def test_a_missing_participant_is_refused(store):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {"a0": shard(0)})
    participate(store, txn, "rank1", {"a1": shard(1)})
    refused(
        store,
        txn,
        ParticipantError,
        r"no receipt from participant\(s\) \['rank1'\]",
        receipts=[r0],
        participants={"rank0", "rank1"},
    )


def test_a_duplicated_participant_is_refused(store):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {"a0": shard(0)})
    refused(store, txn, ParticipantError, "rank0 sent more than one receipt", receipts=[r0, r0])


def test_an_unexpected_participant_is_refused(store):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {"a0": shard(0)})
    refused(store, txn, ParticipantError, r"unexpected participant\(s\) \['rank0'\]", receipts=[r0], participants=set())


def test_a_receipt_of_another_transaction_is_refused(store):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {"a0": shard(0)})
    forged = Receipt("0" * 32, r0.participant, r0.files)
    refused(store, txn, ParticipantError, "receipt of transaction 0{32}", receipts=[forged])


def test_two_participants_claiming_one_path_are_refused(store):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {"shared.bin": shard(0)})
    r1 = Receipt(txn.txid, "rank1", dict(r0.files))
    refused(
        store,
        txn,
        ParticipantError,
        "shared.bin was written by participant rank0 and by participant rank1",
        receipts=[r0, r1],
    )


def test_a_participant_path_clashing_with_the_coordinators_is_refused(store):
    txn = store.begin(2)
    txn.write_bytes("meta.bin", b"coordinator")
    r0 = participate(store, txn, "rank0", {"meta.bin": b"participant"})
    refused(
        store, txn, ParticipantError, "meta.bin was written by the coordinator and by participant rank0", receipts=[r0]
    )


def test_a_listed_file_that_is_absent_is_refused(store):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {"a0": shard(0)})
    store.fs.rm_file(f"{store.backend.data_root('step_2', txn.txid)}/a0")
    refused(store, txn, LostWriteError, "a0 is in the manifest but missing", receipts=[r0])


def test_a_listed_file_of_another_size_is_refused(store):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {"a0": shard(0)})
    store.fs.pipe_file(f"{store.backend.data_root('step_2', txn.txid)}/a0", b"short")
    refused(store, txn, LostWriteError, "a0 has 5 bytes", receipts=[r0])


def test_files_of_a_participant_without_a_receipt_are_refused(store):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {"a0": shard(0)})
    participate(store, txn, "rank1", {"a1": shard(1)})  # sealed, but its receipt never arrives
    refused(
        store,
        txn,
        ParticipantError,
        r"participant\(s\) \['rank1'\] sealed but their receipts are not among those committed",
        receipts=[r0],
    )


# --- zombies ---------------------------------------------------------------------------------------------


def test_a_participant_of_an_aborted_transaction_cannot_touch_the_bundle_committed_after_it(store):
    txn = store.begin(2)
    handle = txn.handle()
    zombie = BundleStore.join(handle, "rank0")  # joined while the transaction ran
    zombie.write_bytes("policy/shard.bin", b"old" * 100)
    txn.abort()
    with pytest.raises(TransactionStateError, match="not running"):
        BundleStore.join(handle, "rank0")  # it cannot join again
    save_sample(store, 2)  # a new transaction commits the step
    zombie.write_bytes("policy/weights.bin", b"zombie bytes")  # it writes on: the new bundle's relpath
    zombie.write_bytes("policy/extra.bin", b"zombie extra")
    bundle = store.open(2)
    bundle.verify()
    assert bundle.read_bytes("policy/weights.bin") != b"zombie bytes"
    store.gc()  # its files belong to no running transaction: debris
    assert debris(store) == []
    with pytest.raises(TransactionStateError, match="not running any more"):
        zombie.seal()
    store.open(2).verify()


def test_a_participant_of_a_taken_over_transaction_cannot_touch_the_new_bundle(store):
    first = store.begin(2)
    zombie = BundleStore.join(first.handle(), "rank0")
    make_intent_foreign(store, 2, age=7200)  # the coordinator looks dead; a new writer takes the step
    second = store.begin(2)
    zombie.write_bytes("policy/weights.bin", b"zombie")
    r = participate(store, second, "rank0", {"policy/weights.bin": shard(0)})
    zombie.write_bytes("policy/late.bin", b"zombie, after the new participant sealed")
    second.commit(receipts=[r])
    with pytest.raises(TransactionStateError, match="not running any more"):
        zombie.seal()
    with pytest.raises(Exception, match="lost its claim"):
        first.commit()
    bundle = store.open(2)
    bundle.verify()
    assert bundle.read_bytes("policy/weights.bin") == shard(0)


def test_joining_a_transaction_that_ended_is_refused(store):
    txn = store.begin(2)
    handle = txn.handle()
    txn.commit()
    with pytest.raises(TransactionStateError, match="not running"):
        BundleStore.join(handle, "rank0")


# --- crashes and gc ----------------------------------------------------------------------------------------

DYING_PARTICIPANT = textwrap.dedent(
    """
    import json, sys, time
    from rlckpt.store import BundleStore, TransactionHandle
    writer = BundleStore.join(TransactionHandle.from_json(json.loads(sys.argv[1])), "rank1")
    writer.write_bytes("policy/__1_0.distcp", b"half" * 1000)
    stream = writer.open("policy/__1_1.distcp")
    stream.write(b"x" * (17 << 20))  # on S3 a multipart upload is under way
    stream.flush()
    print("writing", flush=True)
    time.sleep(600)
    """
)


def test_a_participant_killed_mid_write_aborts_the_save_and_gc_removes_its_debris(store):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {"policy/__0_0.distcp": shard(0)})
    proc = subprocess.Popen(
        [sys.executable, "-c", DYING_PARTICIPANT, json.dumps(txn.handle().to_json())],
        stdout=subprocess.PIPE,
        env=dict(os.environ),
    )
    try:
        assert proc.stdout.readline().strip() == b"writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    with pytest.raises(ParticipantError, match="rank1"):
        txn.commit(receipts=[r0], participants={"rank0", "rank1"})
    assert store.steps() == [1]
    store.gc(stale_after=0)
    assert debris(store) == []
    assert multipart_uploads(store) == []
    save_sample(store, 2)
    store.open(2).verify()


def test_gc_removes_what_participants_of_a_dead_coordinator_left(store):
    txn = store.begin(2)
    participate(store, txn, "rank0", {"policy/__0_0.distcp": shard(0)})
    participate(store, txn, "rank1", {"policy/__1_0.distcp": shard(1)})
    declare_writers_dead(store)  # the coordinator died before committing
    store.gc()
    assert debris(store) == []
    assert store.steps() == [1]


# --- where participants cannot write ----------------------------------------------------------------------


def test_a_participant_that_cannot_see_the_local_staging_dir_is_told_it_needs_a_shared_filesystem(tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    txn = store.begin(2)
    os.rmdir(store.backend.data_root("step_2", txn.txid))  # what another node without the shared mount sees
    with pytest.raises(SharedStorageError, match="cannot see the staging dir .* share the coordinator's filesystem"):
        BundleStore.join(txn.handle(), "rank3")
    txn.abort()


def test_participant_names_are_plain_names(store):
    txn = store.begin(2)
    for bad in ("", "../x", "a/b", "rank 1", "x" * 65):
        with pytest.raises(ValueError, match="participant name"):
            BundleStore.join(txn.handle(), bad)
    txn.abort()


def test_an_aborted_participant_leaves_none_of_its_files(store):
    txn = store.begin(2)
    writer = BundleStore.join(txn.handle(), "rank0")
    writer.write_bytes("policy/__0_0.distcp", shard(0))
    writer.write_bytes("policy/__0_1.distcp", shard(1))
    writer.abort()
    assert store.backend.list_files(store.backend.data_root("step_2", txn.txid)).sizes == {}
    txn.commit()  # the coordinator's commit sees nothing of it
    assert sorted(store.open(2).manifest.files) == []
