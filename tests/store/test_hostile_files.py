"""Reads are bounded: no file planted in a run can exhaust a reader's memory or disk or hang it.

Metadata reads are capped, local reads never follow a symlink nor open a FIFO, and zstd entries
inflate only to the manifest's logical size, as exactly one frame, in every reader alike.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
import zstandard

from rlckpt.errors import CorruptBundleError
from rlckpt.store import BundleStore
from rlckpt.store.records.manifest import COMMIT_MAX_BYTES, MANIFEST_MAX_BYTES, canonical_json
from support.store_checks import forge_file, raw_path, rewrite_manifest, save_sample

pytestmark = pytest.mark.timeout(60)  # a reader that hangs on a FIFO fails here instead of stalling CI

# What any of these reads may allocate in Python: a few times the largest metadata cap, far below the
# hostile objects (2 GiB files, /dev/zero, a 256 MiB decompression bomb).
MEMORY_CEILING = 3 * MANIFEST_MAX_BYTES


@pytest.fixture
def store(store_location):
    url, options = store_location
    s = BundleStore(url, options)
    save_sample(s, 1)
    save_sample(s, 2)
    return s


@pytest.fixture
def local_store(tmp_path):
    s = BundleStore(str(tmp_path / "run"))
    save_sample(s, 1)
    save_sample(s, 2)
    return s


def peak_allocation(action):
    """Run `action` and return (its result or exception, the peak bytes Python allocated meanwhile)."""
    tracemalloc.start()
    try:
        try:
            outcome = action()
        except Exception as exc:
            outcome = exc
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def states(store):
    return {e.step: e.state for e in store.entries()}


# --- metadata that is too large -------------------------------------------------------------------


def test_oversized_commit_marks_the_bundle_corrupt_without_reading_it_whole(store):
    store.fs.pipe_file(raw_path(store, "step_2", "COMMIT"), b" " * (COMMIT_MAX_BYTES + 1))
    with pytest.raises(CorruptBundleError, match="COMMIT.*cap"):
        store.open(2)
    assert states(store) == {1: "committed", 2: "corrupt"}
    assert store.steps() == [1]


@pytest.mark.parametrize("name", ["COMMIT", "manifest.json", "intent"])
def test_two_gib_metadata_file_is_refused_within_a_small_memory_ceiling(local_store, name):
    target = raw_path(local_store, "_txn", "step_3.json") if name == "intent" else raw_path(local_store, "step_2", name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as sparse:
        sparse.truncate(2 << 30)  # 2 GiB, sparse: costs no disk
    outcome, peak = peak_allocation(lambda: (states(local_store), local_store.gc(), local_store.steps()))
    assert not isinstance(outcome, BaseException), outcome
    entries, _report, steps = outcome
    assert peak < MEMORY_CEILING
    assert steps == [1] if name != "intent" else [1, 2]
    if name == "intent":
        assert entries[3] == "writing"  # unreadable but fresh: it may be a claimant's; it ages by mtime
    else:
        assert entries[2] == "corrupt"


@pytest.mark.parametrize("name", ["COMMIT", "manifest.json", "step_3.json"])
def test_symlink_to_dev_zero_in_place_of_metadata_is_refused(local_store, name):
    target = (
        raw_path(local_store, "_txn", name)
        if name.endswith(".json") and name != "manifest.json"
        else raw_path(local_store, "step_2", name)
    )
    if os.path.exists(target):
        os.remove(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.symlink("/dev/zero", target)
    outcome, peak = peak_allocation(lambda: (states(local_store), local_store.gc()))
    assert not isinstance(outcome, BaseException), outcome
    assert peak < MEMORY_CEILING
    if name == "step_3.json":
        assert outcome[0][3] in ("writing", "stale")
    else:
        assert outcome[0][2] == "corrupt"
        assert 2 in outcome[1].corrupt_steps


@pytest.mark.parametrize("name", ["COMMIT", "manifest.json", "step_3.json"])
def test_fifo_in_place_of_metadata_does_not_hang_readers(local_store, name):
    target = raw_path(local_store, "_txn", name) if name == "step_3.json" else raw_path(local_store, "step_2", name)
    if os.path.exists(target):
        os.remove(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.mkfifo(target)
    entries = states(local_store)
    report = local_store.gc()
    if name == "step_3.json":
        assert 3 in entries
        assert local_store.steps() == [1, 2]
    else:
        assert entries[2] == "corrupt"
        assert 2 in report.corrupt_steps
        assert local_store.steps() == [1]


def test_symlinked_data_file_is_refused_even_with_the_right_size(local_store, tmp_path):
    outside = tmp_path / "outside.bin"
    target = raw_path(local_store, "step_2", "policy/weights.bin")
    outside.write_bytes(Path(target).read_bytes())
    os.remove(target)
    os.symlink(outside, target)
    with pytest.raises(CorruptBundleError, match="weights.bin.*symlink"):
        local_store.open(2)
    assert states(local_store)[2] == "corrupt"


def test_symlinked_step_directory_is_reported_corrupt_and_left_alone(local_store, tmp_path):
    os.rename(raw_path(local_store, "step_2"), tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", raw_path(local_store, "step_2"))
    with pytest.raises(CorruptBundleError):
        local_store.open(2)
    assert states(local_store)[2] == "corrupt"
    report = local_store.gc(keep_last=1)
    assert 2 in report.corrupt_steps
    assert (tmp_path / "elsewhere" / "COMMIT").exists()  # gc neither followed nor removed it


# --- decompression ----------------------------------------------------------------------------------

BOMB = zstandard.ZstdCompressor(level=19).compress(b"\0" * (256 << 20))  # ~8 KiB that inflates to 256 MiB


def readers(store, tmp_path):
    """Every way to read a file of a bundle, each as a callable of the relpath."""

    def read_bytes(rel):
        return store.open(2).read_bytes(rel)

    def open_stream(rel):
        with store.open(2).open(rel) as stream:
            return stream.read()

    def get_file(rel):
        store.open(2).get_file(rel, tmp_path / "out" / rel)

    def verify(_rel):
        store.open(2).verify()

    return {"read_bytes": read_bytes, "open": open_stream, "get_file": get_file, "verify": verify}


@pytest.mark.parametrize("kind", ["zstd", "zstd-planes4"])
@pytest.mark.parametrize("reader", ["read_bytes", "open", "get_file", "verify"])
def test_decompression_bomb_is_refused_by_every_reader_within_bounds(store, tmp_path, reader, kind):
    forge_file(store, 2, "bomb.bin", BOMB, logical_size=10, compression=kind)
    read = readers(store, tmp_path)[reader]
    outcome, peak = peak_allocation(lambda: read("bomb.bin"))
    assert isinstance(outcome, CorruptBundleError), outcome
    assert "bomb.bin" in str(outcome) and "logical size" in str(outcome)
    assert peak < MEMORY_CEILING
    written = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
    assert written < MEMORY_CEILING  # get_file did not write the inflated bytes out


@pytest.mark.parametrize("reader", ["read_bytes", "open", "get_file", "verify"])
@pytest.mark.parametrize(
    "stored",
    [
        pytest.param(b"this was never zstd", id="not-zstd"),
        pytest.param(zstandard.compress(b"a" * 100) + zstandard.compress(b"b" * 100), id="two-frames"),
        pytest.param(zstandard.compress(b"a" * 200) + b"trailing", id="trailing-bytes"),
        pytest.param(zstandard.compress(b"a" * 200)[:-4], id="truncated-frame"),
    ],
)
def test_malformed_zstd_entry_is_corrupt_in_every_reader(store, tmp_path, reader, stored):
    forge_file(store, 2, "odd.bin", stored, logical_size=200, compression="zstd")
    with pytest.raises(CorruptBundleError, match="odd.bin"):
        readers(store, tmp_path)[reader]("odd.bin")


@pytest.mark.parametrize("kind", ["zstd", "zstd-planes2"])
@pytest.mark.parametrize("reader", ["read_bytes", "open", "get_file", "verify"])
def test_zstd_entry_shorter_than_its_logical_size_is_corrupt_in_every_reader(store, tmp_path, reader, kind):
    forge_file(store, 2, "short.bin", zstandard.compress(b"x" * 99), logical_size=100, compression=kind)
    with pytest.raises(CorruptBundleError, match="short.bin.*99 bytes"):
        readers(store, tmp_path)[reader]("short.bin")


# --- records that are not canonical ------------------------------------------------------------------


def test_manifest_with_a_duplicate_key_is_refused(store):
    raw = store.fs.cat_file(raw_path(store, "step_2", "manifest.json"))
    assert raw.startswith(b'{"created":')
    duplicated = b'{"created":"1999-01-01T00:00:00Z",' + raw[1:]  # last one wins in a lax parser
    rewrite_manifest(store, 2, duplicated)
    with pytest.raises(CorruptBundleError, match="duplicate key 'created'"):
        store.open(2)
    assert store.steps() == [1]


def test_commit_with_a_duplicate_key_is_refused(store):
    marker = json.loads(store.fs.cat_file(raw_path(store, "step_2", "COMMIT")))
    duplicated = b'{"format":1,' + canonical_json(marker)[1:]
    store.fs.pipe_file(raw_path(store, "step_2", "COMMIT"), duplicated)
    with pytest.raises(CorruptBundleError, match="duplicate key 'format'"):
        store.open(2)


def test_manifest_in_another_json_layout_is_refused(store):
    obj = json.loads(store.fs.cat_file(raw_path(store, "step_2", "manifest.json")))
    rewrite_manifest(store, 2, json.dumps(obj, indent=2).encode())
    with pytest.raises(CorruptBundleError, match="canonical"):
        store.open(2)


def test_deeply_nested_metadata_is_refused_not_a_recursion_crash(store):
    rewrite_manifest(store, 2, b'{"metadata":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(CorruptBundleError, match="manifest.json: manifest is nested deeper than 64 levels"):
        store.open(2)
