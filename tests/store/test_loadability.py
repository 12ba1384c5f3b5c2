"""A commit that returns is a bundle that opens (invariant 7): whatever a reader would refuse, the commit
refuses first — nothing published, the step free to be saved again — and nothing a writer of the
transaction does once the commit is under way can change the bundle. One body on local disk and S3."""

from __future__ import annotations

import dataclasses

import pytest

from rlckpt.errors import (
    CorruptBundleError,
    InvalidPathError,
    ParticipantError,
    TransactionStateError,
    UnreadableBundleError,
)
from rlckpt.store import BundleStore, Digest, FileEntry, Receipt
from rlckpt.store.records.manifest import MANIFEST_MAX_BYTES
from support.pause import Background, PauseAt
from support.store_checks import debris, save_sample


@pytest.fixture
def store(store_location):
    url, options = store_location
    s = BundleStore(url, options)
    save_sample(s, 1)
    return s


def shard(rank: int) -> bytes:
    return bytes((rank * 31 + i) % 251 for i in range(2000))


def participate(store, txn, name, files):
    """A participant writes `files` and seals them."""
    with store.participant(txn.handle(), name) as writer:
        for rel, data in files.items():
            writer.write_bytes(rel, data)
        return writer.seal()


def assert_nothing_published(store):
    """Step 2 was not committed, nothing of its transaction is left, and it can be saved again."""
    assert store.steps() == [1]
    assert debris(store) == []
    save_sample(store, 2)
    store.open(2).verify()


# --- paths ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second"), [("policy", "policy/x"), ("policy/x", "policy")])
def test_a_file_where_another_participant_needs_a_directory_is_refused(store, first, second):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {first: shard(0)})
    # local disk: the writers share one staging dir, so the second write is refused; S3 takes both objects
    # and the commit refuses them
    with pytest.raises((InvalidPathError, ParticipantError), match="'policy/x' lies under 'policy'|cannot be written"):
        r1 = participate(store, txn, "rank1", {second: shard(1)})
        txn.commit(receipts=[r0, r1])
    txn.abort()
    assert_nothing_published(store)


@pytest.mark.parametrize("relpath", ["COMMIT/x", "manifest.json/x", "COMMIT/a/b.bin"])
def test_a_path_under_a_reserved_name_is_refused_at_the_first_write_by_every_writer(store, relpath, tmp_path):
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "x").write_bytes(b"x")
    txn = store.begin(2)
    with pytest.raises(InvalidPathError, match="reserved for the bundle's own metadata"):
        txn.write_bytes(relpath, b"data")
    with pytest.raises(InvalidPathError, match="reserved for the bundle's own metadata"):
        txn.put_dir(relpath.split("/")[0], tmp_path / "tree")
    with store.participant(txn.handle(), "rank0") as writer:
        with pytest.raises(InvalidPathError, match="reserved for the bundle's own metadata"):
            writer.write_bytes(relpath, b"data")
        receipt = writer.seal()
    txn.write_bytes("a.bin", b"a")
    txn.commit(receipts=[receipt])
    assert sorted(store.open(2).verify().files) == ["a.bin"]


# --- receipts -------------------------------------------------------------------------------------------------


def unchecked_digest(algorithm, hex_digest):
    """A Digest as an unpickled receipt can carry it: built without its constructor's checks."""
    digest = object.__new__(Digest)
    object.__setattr__(digest, "algorithm", algorithm)
    object.__setattr__(digest, "hex", hex_digest)
    return digest


MALFORMED = {
    "compression": lambda e: dataclasses.replace(e, compression="gzip"),
    "digest": lambda e: dataclasses.replace(e, digest=unchecked_digest(e.digest.algorithm, "xyz")),
    "algorithm": lambda e: dataclasses.replace(e, digest=unchecked_digest("md5", e.digest.hex)),
    "size": lambda e: dataclasses.replace(e, size=float(e.size)),
    "logical_size": lambda e: dataclasses.replace(e, logical_size=e.size + 1),
}


@pytest.mark.parametrize("field", sorted(MALFORMED))
def test_a_malformed_receipt_entry_is_refused_at_commit_as_a_reader_would_refuse_it(store, field):
    txn = store.begin(2)
    real = participate(store, txn, "rank0", {"a.bin": shard(0)})
    forged = Receipt(real.txid, real.participant, {"a.bin": MALFORMED[field](real.files["a.bin"])})
    with pytest.raises(
        ParticipantError, match=rf"receipt of participant 'rank0' is malformed: .*files\['a.bin'\]\.{field}: "
    ):
        txn.commit(receipts=[forged])
    assert_nothing_published(store)


def test_a_receipt_with_a_wrong_digest_commits_but_never_counts_as_the_newest_good_bundle(store):
    """The commit does not read participants' bytes again (docs/store-protocol.md, "What a commit checks"):
    such a bundle is committed and corrupt; everything that decides which bundle is good reads it whole."""
    txn = store.begin(2)
    real = participate(store, txn, "rank0", {"a.bin": shard(0)})
    lying = Receipt(real.txid, "rank0", {"a.bin": dataclasses.replace(real.files["a.bin"], digest=Digest.of(b"?"))})
    txn.commit(receipts=[lying])
    with pytest.raises(CorruptBundleError, match="a.bin has blake3:"):
        store.open(2).verify()
    report = store.gc(keep_last=1)
    assert (report.kept_steps, report.corrupt_steps, report.deleted_steps) == ([1], [2], [])
    store.open(1).verify()


def test_a_receipt_entry_digested_under_sha256_commits_and_is_checked_under_sha256(store):
    """Each entry names its algorithm, so digests carried over from a format-1 bundle (sha256) commit as
    they are, and every read checks them under sha256."""
    txn = store.begin(2)
    real = participate(store, txn, "rank0", {"a.bin": shard(0)})
    carried = dataclasses.replace(real.files["a.bin"], digest=Digest.of(shard(0), "sha256"))
    txn.commit(receipts=[Receipt(real.txid, "rank0", {"a.bin": carried})])
    bundle = store.open(2)
    assert bundle.verify().files["a.bin"].digest == Digest.of(shard(0), "sha256")
    assert bundle.read_bytes("a.bin") == shard(0)


# --- the manifest's cap ---------------------------------------------------------------------------------------


def test_a_manifest_over_the_readers_cap_for_its_metadata_is_refused_at_commit(store):
    txn = store.begin(2)
    txn.write_bytes("a.bin", b"a")
    over_the_cap = f"manifest.json is [0-9]+ bytes, over its cap of {MANIFEST_MAX_BYTES}"
    with pytest.raises(UnreadableBundleError, match=over_the_cap):
        txn.commit({"notes": "x" * (33 << 20)})
    assert_nothing_published(store)


def _nested(levels: int) -> dict:
    deep: dict = {}
    for _ in range(levels - 1):
        deep = {"a": deep}
    return deep


@pytest.mark.parametrize("levels", [64, 800, 5000], ids=["one-past-the-bound", "800", "past-the-recursion-limit"])
def test_metadata_nested_deeper_than_readers_take_is_refused_at_commit(store, levels):
    """Refused with its reason at every depth, never by RecursionError from a walk of the value (5,000 deep)."""
    txn = store.begin(2)
    txn.write_bytes("a.bin", b"a")
    with pytest.raises(UnreadableBundleError, match="metadata is nested deeper than 63 levels .*nothing committed"):
        txn.commit(_nested(levels))
    assert_nothing_published(store)


def test_metadata_nested_as_deep_as_readers_take_commits_and_reads_back(store):
    txn = store.begin(2)
    txn.write_bytes("a.bin", b"a")
    txn.commit(_nested(63))
    assert store.open(2).manifest.metadata == _nested(63)


def test_a_manifest_over_the_readers_cap_for_its_many_files_is_refused_at_commit(store):
    """64 participants of 1,000 files each, with long paths (only the receipts: the cap is checked first)."""
    txn = store.begin(2)
    entry = FileEntry(size=1, digest=Digest.of(b"x"), logical_size=1)
    deep = "/".join(["d" * 60] * 7)
    receipts = [
        Receipt(txn.txid, f"rank{r}", {f"policy/{deep}/{r}/{n}.distcp": entry for n in range(1000)}) for r in range(64)
    ]
    with pytest.raises(UnreadableBundleError, match=r"over its cap .*\(64000 files"):
        txn.commit(receipts=receipts)
    assert_nothing_published(store)


# --- writers that could still write -------------------------------------------------------------------------


def test_a_commit_is_refused_while_a_joined_participant_has_not_sealed(store):
    txn = store.begin(2)
    txn.write_bytes("train_dataloader.pt", b"position")
    r0 = participate(store, txn, "rank0", {"a.bin": shard(0)})
    still_writing = store.participant(txn.handle(), "rank1")  # on S3 it could write into the bundle after COMMIT
    with pytest.raises(ParticipantError, match=r"\['rank1'\] joined and have not sealed"):
        txn.commit(receipts=[r0])
    still_writing.abort()
    assert_nothing_published(store)


def test_a_participant_that_joins_while_the_commit_publishes_is_turned_away(store):
    txn = store.begin(2)
    r0 = participate(store, txn, "rank0", {"a.bin": shard(0)})
    handle = txn.handle()
    with PauseAt(store.backend, "make_visible") as pause:  # every check made; manifest and COMMIT go out next
        committing = Background(txn.commit, receipts=[r0])
        pause.wait_reached()
        with pytest.raises(TransactionStateError, match="committing or has ended"):
            store.participant(handle, "rank1")
    committing.result()
    store.open(2).verify()
    assert debris(store) == []


def test_the_coordinator_cannot_write_while_its_commit_is_under_way(store):
    txn = store.begin(2)
    txn.write_bytes("a.bin", b"a" * 100)
    with PauseAt(store.backend, "make_visible") as pause:
        committing = Background(txn.commit)
        pause.wait_reached()
        with pytest.raises(TransactionStateError, match="already committing"):
            txn.write_bytes("late.bin", b"written after the listing check")
    committing.result()
    assert sorted(store.open(2).verify().files) == ["a.bin"]


def test_a_second_process_joining_under_a_name_already_in_the_transaction_is_refused(store):
    txn = store.begin(2)
    first = store.participant(txn.handle(), "rank0")
    with pytest.raises(ParticipantError, match="participant rank0 already joined"):
        BundleStore.join(txn.handle(), "rank0")
    first.write_bytes("a.bin", shard(0))
    txn.commit(receipts=[first.seal()])
    assert store.open(2).read_bytes("a.bin") == shard(0)
    assert debris(store) == []
