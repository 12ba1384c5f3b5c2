"""gc racing a save: nothing gc does removes what a transaction that began during gc owns, and a commit
never publishes files it has not seen in place. Each race is forced by holding one side at an exact call."""

from __future__ import annotations

import pytest

from rlckpt.errors import BundleExistsError, LostWriteError, ParticipantError
from rlckpt.store import BundleStore
from rlckpt.store.backends.s3_io import PART_SIZE
from rlckpt.store.upkeep.gc import GarbageCollector
from support.pause import Background, PauseAt
from support.store_checks import debris, plant, save_sample


@pytest.fixture
def store(store_location):
    url, options = store_location
    s = BundleStore(url, options)
    save_sample(s, 1)
    return s


class ListingThatMissesTheIntent:
    """A run listing that is not a snapshot: it lists `_txn/` before a writer begins and that writer's
    data after (a paginated or directory-walking listing does exactly this)."""

    def __init__(self, backend, late_heads):
        self.real = backend.list_run
        self.late_heads = late_heads

    def between(self):
        """Called after the early part of the listing: tests hold gc here."""

    def __call__(self):
        early = [item for item in self.real() if item.rel.split("/", 1)[0] not in self.late_heads]
        self.between()
        late = [item for item in self.real() if item.rel.split("/", 1)[0] in self.late_heads]
        return iter(early + late)


def test_gc_never_removes_the_data_of_a_writer_that_began_while_it_listed(store):
    late = {"_tmp", "step_2"}  # where the writer's data lands on local disk / on S3
    listing = ListingThatMissesTheIntent(store.backend, late)
    store.backend.list_run = listing
    with PauseAt(listing, "between") as pause:
        gc = Background(store.gc)
        pause.wait_reached()
        writer = store.begin(2)
        writer.write_bytes("a.bin", b"a" * 1000)
    gc.result()
    writer.write_bytes("b.bin", b"b" * 1000)
    writer.commit()
    bundle = store.open(2)
    bundle.verify()
    assert bundle.read_bytes("a.bin") == b"a" * 1000


def test_gc_does_not_abort_the_upload_of_a_save_that_began_during_gc(s3_run_url, s3_storage_options):
    store = BundleStore(s3_run_url, s3_storage_options)
    save_sample(store, 1)
    with PauseAt(store.backend, "incomplete_uploads") as pause:
        gc = Background(store.gc)
        pause.wait_reached()
        writer = store.begin(2)
        stream = writer.open("big.bin")
        stream.write(b"x" * (17 << 20))  # past one 16 MiB block: a multipart upload is under way
    report = gc.result()
    assert report.aborted_uploads == []
    assert writer.txid in report.live
    stream.write(b"y" * 1000)
    stream.close()
    writer.commit()
    store.open(2).verify()


def test_gc_does_not_delete_a_new_writers_files_when_it_removes_an_orphan_step(store):
    plant(store, "step_7/orphan.bin", b"left by nobody")  # no intent, no COMMIT
    with PauseAt(store.claims, "try_claim") as pause:  # gc has planned the removal and is about to act
        gc = Background(store.gc)
        pause.wait_reached()
        writer = store.begin(7)  # the step is free: a writer claims it first
        writer.write_bytes("fresh.bin", b"f" * 500)
    report = gc.result()
    assert any("step_7" in skipped for skipped in report.skipped)
    writer.commit()
    bundle = store.open(7)
    bundle.verify()
    assert sorted(bundle.manifest.files) == ["fresh.bin"]


def test_a_writer_cannot_begin_a_step_gc_holds_while_removing_its_orphan_data(store):
    plant(store, "step_7/orphan.bin", b"left by nobody")
    with PauseAt(store.backend, "remove_tree") as pause:  # gc holds the step's claim and is deleting
        gc = Background(store.gc)
        pause.wait_reached()
        with pytest.raises(Exception, match="being written by txid gc-"):
            store.begin(7)
    gc.result()
    save_sample(store, 7)
    assert store.steps() == [1, 7]
    assert debris(store) == []


# --- retention ------------------------------------------------------------------------------------------


def test_retention_holds_the_step_it_deletes_so_a_new_save_of_it_waits_and_then_survives(store):
    """On S3 deleting a bundle is COMMIT, then the rest: a save of the step between the two would be wiped
    by the second (local disk renames the bundle away at once, but the rule is the same on both)."""
    save_sample(store, 2)
    with PauseAt(store.backend, "remove_tree") as pause:  # step 1 is invisible, its files not yet deleted
        gc = Background(store.gc, keep_last=1)
        pause.wait_reached()
        with pytest.raises(BundleExistsError, match="being written by txid gc-"):
            save_sample(store, 1)
    assert gc.result().deleted_steps == [1]
    save_sample(store, 1)
    store.open(1).verify()
    assert debris(store) == []


def test_retention_spares_a_bundle_committed_again_after_its_plan(store):
    save_sample(store, 2)
    with PauseAt(GarbageCollector, "apply") as pause:  # gc has planned to delete step 1
        gc = Background(store.gc, keep_last=1)
        pause.wait_reached()
        store.backend.delete_bundle("step_1")  # step 1 deleted behind gc's back and saved anew
        save_sample(store, 1)
    report = gc.result()
    assert report.deleted_steps == []
    assert any("committed again" in skipped for skipped in report.skipped)
    store.open(1).verify()


# --- participants' rosters -------------------------------------------------------------------------------


def test_gc_removes_a_roster_no_transaction_owns_and_keeps_a_running_ones(store):
    left = plant(store, "_txn/0123456789abcdef0123456789abcdef/joined/rank0", b"rank0")  # a crashed commit's
    txn = store.begin(2)
    writer = store.participant(txn.handle(), "rank0")
    report = store.gc()
    assert store.backend.path("_txn", "0123456789abcdef0123456789abcdef") in report.removed
    assert not store.fs.exists(left)
    with pytest.raises(ParticipantError, match="have not sealed"):  # gc left the running roster alone
        txn.commit()
    writer.abort()
    assert debris(store) == []


# --- the commit's own check ----------------------------------------------------------------------


def data_path(store, txn, rel):
    return f"{store.backend.data_root(f'step_{txn.step}', txn.txid)}/{rel}"


def test_commit_refuses_when_a_written_file_was_removed_behind_its_back(store):
    txn = store.begin(2)
    txn.write_bytes("a.bin", b"a" * 100)
    txn.write_bytes("b.bin", b"b" * 100)
    store.fs.rm_file(data_path(store, txn, "b.bin"))
    with pytest.raises(LostWriteError, match="b.bin is in the manifest but missing"):
        txn.commit()
    assert store.steps() == [1]
    store.open(1).verify()


def test_commit_refuses_when_a_written_file_was_replaced_with_another_size(store):
    txn = store.begin(2)
    txn.write_bytes("a.bin", b"a" * 100)
    store.fs.pipe_file(data_path(store, txn, "a.bin"), b"short")
    with pytest.raises(LostWriteError, match="a.bin has 5 bytes"):
        txn.commit()
    assert store.steps() == [1]


def test_commit_refuses_a_file_it_did_not_write(store):
    txn = store.begin(2)
    txn.write_bytes("a.bin", b"a" * 100)
    store.fs.pipe_file(data_path(store, txn, "stranger.bin"), b"zombie writer")
    with pytest.raises(LostWriteError, match="stranger.bin is not in the manifest"):
        txn.commit()
    assert store.steps() == [1]


def test_commit_refuses_when_the_local_staging_dir_is_gone_and_does_not_recreate_it(tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    txn = store.begin(2)
    store.backend.remove_tree(store.backend.data_root("step_2", txn.txid))
    with pytest.raises(LostWriteError, match="staging dir"):
        txn.commit()
    assert store.steps() == []
    assert not (tmp_path / "run" / "step_2").exists()


def test_upload_aborted_behind_the_writers_back_is_a_lost_write(s3_run_url, s3_storage_options):
    store = BundleStore(s3_run_url, s3_storage_options)
    txn = store.begin(2)
    stream = txn.open("big.bin")
    stream.write(b"x" * (PART_SIZE + 1))  # one byte more than fits one PUT: its multipart upload has begun
    for key, upload_id in store.backend.incomplete_uploads():
        store.backend.abort_upload(key, upload_id)
    with pytest.raises(LostWriteError, match="big.bin.*NoSuchUpload"):
        # the upload's next request (the last part, or completing it in the background, which the commit
        # waits for) finds it gone: a clear error, not a raw FileNotFoundError
        stream.close()
        txn.commit()
    txn.abort()
    assert store.steps() == []
    assert debris(store) == []
