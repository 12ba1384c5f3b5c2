"""Manifest and COMMIT formats: bundles are written in format 2 with BLAKE3 digests, format-1 bundles (sha256)
stay readable, every digest is checked under the algorithm its record names, and a record of a format
newer than this rlckpt reads is refused in one line."""

from __future__ import annotations

import hashlib
import json
import re

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlckpt
from rlckpt.errors import CorruptBundleError, NewerFormatError
from rlckpt.store import COMMIT_FORMAT, MANIFEST_FORMAT, BundleStore, Digest, FileEntry, Manifest
from rlckpt.store.records.manifest import canonical_json
from support.store_checks import (
    corrupt_file,
    raw_path,
    rewrite_as_format_1,
    rewrite_manifest,
    sample_payload,
    save_sample,
    stored_path,
)

PLAIN = "policy/weights.bin"  # stored as written
ZSTD = "policy/optim.bin"  # stored zstd


@pytest.fixture
def store(store_location):
    url, options = store_location
    s = BundleStore(url, options)
    save_sample(s, 1)
    save_sample(s, 2)
    return s


def raw_json(store, step, name):
    return json.loads(store.fs.cat_file(raw_path(store, f"step_{step}", name)))


def put_record(store, step, name, obj):
    store.fs.pipe_file(raw_path(store, f"step_{step}", name), canonical_json(obj))


def read_every_way(bundle, rel, tmp_path):
    """The file's logical bytes through each reader, all of which must agree."""
    out = tmp_path / f"{bundle.step}-{rel.replace('/', '_')}"
    bundle.get_file(rel, out)
    with bundle.open(rel) as stream:
        streamed = stream.read()
    return {bundle.read_bytes(rel), streamed, out.read_bytes()}


def in_pieces(bundle, rel):
    """The file read with `read_in_order` in three uneven pieces (the last one byte too long), checked."""
    size = bundle.manifest.files[rel].size
    read = bundle.read_in_order(rel)
    got = []
    for piece in (bytearray(size // 3), bytearray(1), bytearray(size - size // 3)):  # the file, and one byte more
        got.append(bytes(piece[: read.into(memoryview(piece))]))
    return got, read


# --- what is written --------------------------------------------------------------------------------------


def test_a_new_bundle_is_written_in_format_2_with_a_blake3_digest_of_each_stored_file(store):
    manifest = raw_json(store, 2, "manifest.json")
    assert (manifest["format"], manifest["writer_version"]) == (2, rlckpt.__version__)
    for rel, entry in manifest["files"].items():
        stored = store.fs.cat_file(stored_path(store, 2, rel))
        assert (entry["algorithm"], entry["digest"]) == ("blake3", blake3.blake3(stored).hexdigest()), rel


def test_a_new_commit_names_the_blake3_digest_of_the_manifest_the_writer_and_the_run(store):
    marker = raw_json(store, 2, "COMMIT")
    manifest_bytes = store.fs.cat_file(raw_path(store, "step_2", "manifest.json"))
    assert marker == {
        "format": 3,
        "manifest_algorithm": "blake3",
        "manifest_digest": blake3.blake3(manifest_bytes).hexdigest(),
        "run": store.run_record().run_id,
        "signature": None,  # the store has no signing key
        "step": 2,
        "txid": marker["txid"],
        "writer_version": rlckpt.__version__,
    }


def test_a_format_2_bundle_reads_back_the_bytes_written_through_every_reader(store, tmp_path):
    bundle = store.open(2)
    assert bundle.verify().format == 2
    for rel, data in sample_payload(2).items():
        assert read_every_way(bundle, rel, tmp_path) == {data}, rel


def test_a_file_read_in_order_is_its_bytes_across_pieces_and_checks_out_when_finished(store):
    bundle = store.open(2)
    pieces, read = in_pieces(bundle, PLAIN)
    read.finish()
    assert b"".join(pieces) == sample_payload(2)[PLAIN] and len(pieces[1]) == 1


@pytest.mark.parametrize("how", ["truncate", "append"])
def test_a_file_read_in_order_of_another_size_is_refused_when_finished(store, how):
    bundle = store.open(2)  # the listing checked out; the file changes afterwards
    if how == "append":
        path = stored_path(store, 2, PLAIN)
        store.fs.pipe_file(path, store.fs.cat_file(path) + b"!")
    else:
        corrupt_file(store, 2, PLAIN, how)
    _pieces, read = in_pieces(bundle, PLAIN)
    with pytest.raises(CorruptBundleError, match=f"{PLAIN} has [0-9]+ bytes, the manifest says"):
        read.finish()


def test_a_peek_during_a_read_in_order_is_the_stored_bytes_and_leaves_the_check_to_the_pieces(store):
    bundle = store.open(2)
    data = sample_payload(2)[PLAIN]
    with bundle.read_in_order(PLAIN) as read:
        assert read.peek(10, 30) == data[10:30]
        pieces = [bytearray(7), bytearray(len(data) - 7 + 1)]
        got = [bytes(piece[: read.into(memoryview(piece))]) for piece in pieces]
        assert read.peek(len(data) - 5, len(data) + 5) == data[-5:]  # unchecked: what is there, up to the end
        read.finish()
    assert b"".join(got) == data


def test_a_read_in_order_holds_its_file_once_for_all_its_pieces_and_peeks(store, monkeypatch):
    """Local disk opens the file once (one path walk beneath the root), not once per piece: a reader placing many
    small items of one file would otherwise pay an open for each."""
    bundle = store.open(2)
    backend = type(bundle.backend)
    held = []
    monkeypatch.setattr(backend, "hold", lambda self, path, _hold=backend.hold: held.append(path) or _hold(self, path))
    size = bundle.manifest.files[PLAIN].size
    with bundle.read_in_order(PLAIN) as read:
        read.peek(0, 4)
        for _ in range(size + 1):
            if not read.into(memoryview(bytearray(1))):
                break
        read.finish()
    assert len(held) == 1 and held[0].endswith(PLAIN)


# --- format 1 (sha256) ------------------------------------------------------------------------------------


def test_a_hand_built_format_1_bundle_opens_verifies_and_reads_under_sha256(store, tmp_path):
    rewrite_as_format_1(store, 2)
    bundle = store.open(2)
    assert (bundle.manifest.format, bundle.manifest.writer_version) == (1, None)
    assert {entry.digest.algorithm for entry in bundle.verify().files.values()} == {"sha256"}
    for rel, data in sample_payload(2).items():
        assert read_every_way(bundle, rel, tmp_path) == {data}, rel
    assert store.steps() == [1, 2]


def test_a_flipped_byte_in_a_format_1_bundle_is_caught_under_sha256(store):
    rewrite_as_format_1(store, 2)
    corrupt_file(store, 2, PLAIN, "flip")
    with pytest.raises(CorruptBundleError, match=f"{PLAIN} has sha256:"):
        store.open(2).verify()


# --- a flipped byte under BLAKE3 --------------------------------------------------------------------------


@pytest.mark.parametrize("rel", [PLAIN, ZSTD])
def test_a_flipped_byte_is_caught_under_blake3_by_every_reader(store, rel, tmp_path):
    corrupt_file(store, 2, rel, "flip")
    bundle = store.open(2)
    readers = {
        "verify": bundle.verify,
        "read_bytes": lambda: bundle.read_bytes(rel),
        "open": lambda: bundle.open(rel),
        "get_file": lambda: bundle.get_file(rel, tmp_path / "out.bin"),
    }
    if rel == PLAIN:
        readers["read_into"] = lambda: bundle.read_into(rel, bytearray(1 << 20))
        readers["read_in_order"] = lambda: in_pieces(bundle, rel)[1].finish()
    for name, read in readers.items():
        with pytest.raises(CorruptBundleError, match=f"{rel} has blake3:[0-9a-f]{{64}}, the manifest says blake3:"):
            read()
        assert not (tmp_path / "out.bin").exists(), name


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_flipped_bit_of_a_stored_file_is_caught(store, data):
    rel = data.draw(st.sampled_from([PLAIN, ZSTD]))
    path = stored_path(store, 2, rel)
    good = store.fs.cat_file(path)
    at = data.draw(st.integers(0, len(good) - 1))
    bit = data.draw(st.integers(0, 7))
    store.fs.pipe_file(path, good[:at] + bytes([good[at] ^ (1 << bit)]) + good[at + 1 :])
    try:
        with pytest.raises(CorruptBundleError, match=rel):
            store.open(2).read_bytes(rel)
    finally:
        store.fs.pipe_file(path, good)


# --- the COMMIT's digest of the manifest ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("claimed", "used"),
    [("sha256", lambda b: blake3.blake3(b).hexdigest()), ("blake3", lambda b: hashlib.sha256(b).hexdigest())],
    ids=["claims-sha256-of-a-blake3-digest", "claims-blake3-of-a-sha256-digest"],
)
def test_a_commit_naming_the_manifest_under_another_algorithm_than_it_used_is_refused(store, claimed, used):
    marker = raw_json(store, 2, "COMMIT")
    manifest_bytes = store.fs.cat_file(raw_path(store, "step_2", "manifest.json"))
    put_record(store, 2, "COMMIT", {**marker, "manifest_algorithm": claimed, "manifest_digest": used(manifest_bytes)})
    with pytest.raises(
        CorruptBundleError, match=f"manifest.json has {claimed}:[0-9a-f]{{64}}, COMMIT names {claimed}:"
    ):
        store.open(2)
    assert store.steps() == [1]


# --- what this rlckpt cannot read -------------------------------------------------------------------------


def test_a_file_digest_of_an_unknown_algorithm_is_refused_in_one_line(store):
    manifest = raw_json(store, 2, "manifest.json")
    manifest["files"][PLAIN]["algorithm"] = "md5"
    rewrite_manifest(store, 2, canonical_json(manifest))
    with pytest.raises(
        CorruptBundleError,
        match=re.escape(
            f"manifest.json: manifest: files['{PLAIN}'].algorithm: expected one of 'blake3', 'sha256', got 'md5'"
        ),
    ) as exc:
        store.open(2)
    assert "\n" not in str(exc.value)


def test_an_uncompressed_entry_whose_logical_size_is_not_its_size_is_refused_naming_the_field(store):
    manifest = raw_json(store, 2, "manifest.json")
    manifest["files"][PLAIN]["logical_size"] += 1
    rewrite_manifest(store, 2, canonical_json(manifest))
    with pytest.raises(CorruptBundleError, match=re.escape(f"manifest: files['{PLAIN}'].logical_size: uncompressed")):
        store.open(2)


def test_a_file_listed_where_another_needs_a_directory_is_refused_naming_the_path(store):
    manifest = raw_json(store, 2, "manifest.json")
    manifest["files"][f"{PLAIN}/inner"] = manifest["files"][PLAIN]
    rewrite_manifest(store, 2, canonical_json(manifest))
    expected = f"manifest: files['{PLAIN}/inner']: '{PLAIN}/inner' lies under '{PLAIN}', which is a file"
    with pytest.raises(CorruptBundleError, match=re.escape(expected)):
        store.open(2)


def test_a_commit_naming_an_unknown_algorithm_is_refused_in_one_line(store):
    put_record(store, 2, "COMMIT", {**raw_json(store, 2, "COMMIT"), "manifest_algorithm": "xxh3"})
    with pytest.raises(
        CorruptBundleError, match="COMMIT: COMMIT: manifest_algorithm: expected one of 'blake3', 'sha256', got 'xxh3'"
    ) as exc:
        store.open(2)
    assert "\n" not in str(exc.value)


def test_a_manifest_of_a_newer_format_is_refused_in_one_line_naming_the_format_and_its_writer(store):
    newer = MANIFEST_FORMAT + 1
    manifest = {**raw_json(store, 2, "manifest.json"), "format": newer, "writer_version": "0.3.1", "shards": {}}
    rewrite_manifest(store, 2, canonical_json(manifest))
    with pytest.raises(NewerFormatError) as exc:
        store.open(2)
    message = str(exc.value)
    assert f"manifest.json: manifest format {newer} was written by a newer rlckpt 0.3; " in message
    assert f"this rlckpt {rlckpt.__version__} reads manifest formats 1-{MANIFEST_FORMAT}" in message
    assert "\n" not in message and not isinstance(exc.value, CorruptBundleError)


def test_a_commit_of_a_newer_format_is_refused_in_one_line_naming_the_format_and_its_writer(store):
    put_record(store, 2, "COMMIT", {**raw_json(store, 2, "COMMIT"), "format": 7, "writer_version": "1.4.0"})
    with pytest.raises(NewerFormatError, match="COMMIT: COMMIT format 7 was written by a newer rlckpt 1.4; ") as exc:
        store.open(2)
    assert "\n" not in str(exc.value)


def test_a_bundle_of_a_newer_format_counts_as_the_newest_and_is_listed_as_newer(store):
    marker = raw_json(store, 2, "COMMIT")
    del marker["writer_version"]  # a future format need not keep it: the refusal still names the format
    put_record(store, 2, "COMMIT", {**marker, "format": COMMIT_FORMAT + 1})
    assert store.latest() == 2  # nothing older is taken for the newest
    entries = {e.step: e for e in store.entries()}
    assert (entries[1].state, entries[2].state) == ("committed", "newer")
    assert f"COMMIT format {COMMIT_FORMAT + 1} was written by a newer rlckpt;" in entries[2].detail


def test_a_replace_corrupt_save_refuses_a_newer_bundle_rather_than_quarantining_it(store):
    put_record(store, 2, "COMMIT", {**raw_json(store, 2, "COMMIT"), "format": COMMIT_FORMAT + 1})
    with pytest.raises(NewerFormatError):
        store.begin(2, replace_corrupt=True)
    assert not store.fs.exists(raw_path(store, "_quarantine"))
    assert store.read_intent(2) is None  # the claim was let go


# --- records, without a store -----------------------------------------------------------------------------

entries = st.builds(
    lambda size, data, algorithm: {"size": size, "digest": Digest.of(data, algorithm)},
    st.integers(0, 2**40),
    st.binary(max_size=64),
    st.sampled_from(["blake3", "sha256"]),
)


@given(files=st.dictionaries(st.from_regex(r"[a-z]{1,8}(/[a-z0-9_]{1,8}){0,2}", fullmatch=True), entries, max_size=8))
def test_a_format_2_manifest_reads_back_as_written_whatever_its_entries_algorithms(files):
    paths = sorted(files)
    if any(b.startswith(a + "/") for a in paths for b in paths):
        return  # a file where another needs a directory: not a manifest
    written = Manifest(
        step=3,
        txid="t" * 32,
        created="2026-12-02T00:00:00Z",
        files={rel: FileEntry(size=e["size"], digest=e["digest"], logical_size=e["size"]) for rel, e in files.items()},
    )
    assert Manifest.from_bytes(written.to_bytes()) == written
