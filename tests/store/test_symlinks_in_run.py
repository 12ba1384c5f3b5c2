"""Local disk never writes, renames or deletes through a symlink inside a run: whoever can write the run
directory can plant one in place of any directory rlckpt writes into (`_txn/`, `_tmp/`, `_quarantine/`,
a roster `_txn/<txid>/`, a staging dir or a directory in it, a file's own name), and rlckpt refuses
with one line naming it, leaving the place the symlink points to exactly as it was.

Local disk only: object stores have no symlinks."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path

import pytest

from rlckpt.errors import BundleExistsError, IrregularFileError, LostWriteError
from rlckpt.store import BundleStore, Intent
from support.store_checks import corrupt_file, make_intent_foreign, raw_path, save_sample

DAY = 24 * 3600


@pytest.fixture
def store(tmp_path):
    s = BundleStore(str(tmp_path / "run"))
    save_sample(s, 1)
    return s


@pytest.fixture
def outside(tmp_path):
    """A directory outside the run with something in it to lose."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "keep.txt").write_bytes(b"not rlckpt's")
    return path


def contents(directory: Path) -> dict[str, bytes | None]:
    """Everything under `directory`: files with their bytes, directories as None."""
    return {
        str(p.relative_to(directory)): (p.read_bytes() if p.is_file() else None) for p in sorted(directory.rglob("*"))
    }


def replace_with_symlink(path: str, target: Path) -> None:
    """Put a symlink to `target` where `path` is (whatever was there goes)."""
    if os.path.isdir(path) and not os.path.islink(path):
        os.rename(path, f"{path}.moved")
    elif os.path.lexists(path):
        os.remove(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


def stale_foreign_intent(step: int) -> bytes:
    """An intent of a writer on another host whose lease ran out long ago: one a claimant takes over."""
    intent = Intent.new(step, "f" * 32)
    return dataclasses.replace(intent, host=f"not-{socket.gethostname()}", started=time.time() - 10 * DAY).to_bytes()


def save_replacing_a_corrupt_bundle(store: BundleStore, step: int) -> None:
    with store.begin(step, replace_corrupt=True) as txn:
        txn.write_bytes("a.bin", b"a" * 100)
        txn.commit()


# --- begin ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["_txn", "_tmp"])
def test_begin_refuses_a_symlinked_run_directory_in_one_line_and_writes_nothing_through_it(store, outside, name):
    replace_with_symlink(raw_path(store, name), outside)
    before = contents(outside)
    with pytest.raises(IrregularFileError) as info:
        store.begin(2)
    message = str(info.value)
    assert "\n" not in message and f"{store.root}/{name}" in message and "symlink" in message
    assert contents(outside) == before


def test_a_stale_looking_intent_beyond_a_symlinked_txn_dir_is_never_taken_over_nor_deleted(store, outside):
    (outside / "step_2.json").write_bytes(stale_foreign_intent(2))
    old = time.time() - 10 * DAY
    os.utime(outside / "step_2.json", (old, old))
    replace_with_symlink(raw_path(store, "_txn"), outside)
    before = contents(outside)
    with pytest.raises(IrregularFileError, match="_txn"):
        store.begin(2)
    assert contents(outside) == before


@pytest.mark.parametrize("target", ["an empty directory", "a committed bundle"])
def test_a_symlinked_step_dir_is_refused_like_a_corrupt_bundle_and_only_the_link_is_moved_aside(store, outside, target):
    if target == "a committed bundle":
        save_sample(store, 2)
        os.rename(raw_path(store, "step_2"), outside / "step_2")
        os.symlink(outside / "step_2", raw_path(store, "step_2"))
    else:
        replace_with_symlink(raw_path(store, "step_2"), outside)
    before = contents(outside)
    with pytest.raises(BundleExistsError, match="step 2"):
        store.begin(2)
    save_replacing_a_corrupt_bundle(store, 2)
    assert contents(outside) == before
    assert not os.path.islink(raw_path(store, "step_2")) and store.steps() == [1, 2]
    assert [p.is_symlink() for p in Path(raw_path(store, "_quarantine")).iterdir()] == [True]


def test_quarantine_refuses_a_symlinked_quarantine_dir_and_leaves_the_bundle_in_place(store, outside):
    corrupt_file(store, 1, "train_dataloader.pt", "flip")
    replace_with_symlink(raw_path(store, "_quarantine"), outside)
    before = contents(outside)
    with pytest.raises(IrregularFileError, match="_quarantine.*symlink"):
        store.begin(1, replace_corrupt=True)
    assert contents(outside) == before
    assert os.path.exists(raw_path(store, "step_1", "COMMIT"))
    assert store.claims.read(1) is None  # the refused begin let its claim go


# --- writes into a running transaction -------------------------------------------------------------------


@pytest.mark.parametrize("planted", ["staging dir", "directory in it", "the file itself"])
def test_a_write_refuses_a_symlink_planted_in_its_staging_dir(store, outside, planted):
    txn = store.begin(2)
    staging = raw_path(store, "_tmp", txn.txid)
    where = {
        "staging dir": staging,
        "directory in it": f"{staging}/policy",
        "the file itself": f"{staging}/policy/weights.bin",
    }[planted]
    if planted == "the file itself":
        target = outside / "keep.txt"
        os.makedirs(os.path.dirname(where), exist_ok=True)
        os.symlink(target, where)
    else:
        replace_with_symlink(where, outside)
    before = contents(outside)
    with pytest.raises(IrregularFileError, match="symlink"):
        txn.write_bytes("policy/weights.bin", b"w" * 100)
    with pytest.raises(IrregularFileError, match="symlink"):
        txn.put_file("policy/weights.bin", raw_path(store, "step_1", "train_dataloader.pt"))
    txn.abort()
    assert contents(outside) == before
    assert store.steps() == [1]


def test_a_commit_refuses_a_staging_dir_swapped_for_a_symlink(store, outside):
    txn = store.begin(2)
    txn.write_bytes("a.bin", b"a" * 100)
    staging = raw_path(store, "_tmp", txn.txid)
    os.rename(staging, outside / txn.txid)
    os.symlink(outside / txn.txid, staging)
    before = contents(outside)
    with pytest.raises((IrregularFileError, LostWriteError)):
        txn.commit()
    assert contents(outside) == before
    assert store.steps() == [1] and not os.path.exists(raw_path(store, "step_2"))


@pytest.mark.parametrize("moment", ["join", "commit"])
def test_a_symlinked_roster_dir_is_refused_and_nothing_is_written_through_it(store, outside, moment):
    txn = store.begin(2)
    roster = raw_path(store, "_txn", txn.txid)
    if moment == "commit":
        with BundleStore.join(txn.handle(), "rank0") as part:
            part.write_bytes("r0.bin", b"0" * 100)
            receipt = part.seal()
        replace_with_symlink(roster, outside)
        before = contents(outside)
        with pytest.raises(IrregularFileError, match="symlink"):
            txn.commit(receipts=[receipt])
    else:
        replace_with_symlink(roster, outside)
        before = contents(outside)
        with pytest.raises(IrregularFileError, match="symlink"):
            BundleStore.join(txn.handle(), "rank0")
        txn.abort()
    assert contents(outside) == before
    assert store.steps() == [1]


# --- gc ---------------------------------------------------------------------------------------------------


def test_gc_removes_no_dead_transactions_data_through_a_symlinked_tmp_dir(store, outside):
    txn = store.begin(2)
    txn.write_bytes("a.bin", b"a" * 100)
    (outside / txn.txid).mkdir()
    (outside / txn.txid / "precious.bin").write_bytes(b"p" * 10)
    replace_with_symlink(raw_path(store, "_tmp"), outside)
    make_intent_foreign(store, 2, age=10 * DAY)  # its writer is presumed dead: gc discards its staging dir
    before = contents(outside)
    report = store.gc()
    assert contents(outside) == before
    assert any("_tmp is a symlink" in s for s in report.skipped)


def test_retention_deletes_nothing_through_a_symlinked_tmp_dir_and_keeps_the_bundle(store, outside):
    save_sample(store, 2)
    replace_with_symlink(raw_path(store, "_tmp"), outside)
    before = contents(outside)
    report = store.gc(keep_last=1)
    assert contents(outside) == before
    assert report.deleted_steps == [] and any("_tmp" in s and "symlink" in s for s in report.skipped)
    assert store.steps() == [1, 2]
