"""Byte-plane compression (`zstd-planes<W>`): every bit back, through every reader, on local disk and S3;
raw where it does not pay; and the manifest format that names it."""

from __future__ import annotations

import json
import os

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from rlckpt.errors import CorruptBundleError
from rlckpt.store import BundleStore
from rlckpt.store.io import compression as compression_module
from rlckpt.store.io.compression import (
    PAYS,
    PLANE_BLOCK,
    PLANES,
    StreamCompressor,
    decompress_exact,
    join_planes,
    planes_for,
    split_planes,
)
from rlckpt.store.records.manifest import MANIFEST_FORMAT, canonical_json
from support.store_checks import raw_path, rewrite_manifest


@pytest.fixture
def store(store_location):
    url, options = store_location
    return BundleStore(url, options)


def low_entropy_floats(n_bytes: int, width: int) -> bytes:
    """Bytes like small trained weights: the top byte of each element takes a few values, the rest any."""
    noise = bytearray(os.urandom(n_bytes))
    noise[width - 1 :: width] = bytes(0x3C + (b & 3) for b in noise[width - 1 :: width])
    return bytes(noise)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=4 * 1024), width=st.sampled_from([2, 4, 8]))
def test_planes_of_a_block_join_back_into_the_same_bytes(data, width):
    assert join_planes(split_planes(data, width), width) == data


@settings(max_examples=25, deadline=None)
@given(
    size=st.integers(0, 3 * PLANE_BLOCK + 17),
    kind=st.sampled_from(sorted(PLANES)),
    cuts=st.lists(st.integers(1, PLANE_BLOCK + 3), max_size=6),
)
def test_a_stream_compressed_in_planes_in_any_chunks_inflates_to_every_bit(size, kind, cuts):
    data = os.urandom(size)
    compressor, out, pos = StreamCompressor(kind), [], 0
    for cut in cuts:
        out.append(compressor.compress(data[pos : pos + cut]))
        pos += cut
    out.append(compressor.compress(data[pos:]))
    out.append(compressor.flush())
    assert decompress_exact(b"".join(out), size, kind) == data


def test_planes_for_an_element_width_names_its_planes_and_plain_zstd_otherwise():
    assert [planes_for(w) for w in (1, 2, 4, 8, 16)] == ["zstd", "zstd-planes2", "zstd-planes4", "zstd-planes8", "zstd"]


@pytest.mark.parametrize("kind", sorted(PLANES))
def test_a_file_stored_in_planes_reads_back_bit_exact_through_every_reader(store, tmp_path, kind):
    width = PLANES[kind]
    data = low_entropy_floats(2 * PLANE_BLOCK + 5 * width + 3, width)  # blocks, then a tail not a whole element
    with store.begin(4) as txn:
        with txn.open("policy/w.bin", compression=kind) as stream:
            stream.write(data[:1000])
            stream.write(data[1000:])
        txn.commit({})
    bundle = store.open(4)
    entry = bundle.manifest.files["policy/w.bin"]
    assert (entry.compression, entry.logical_size) == (kind, len(data)) and entry.size < len(data)
    assert bundle.read_bytes("policy/w.bin") == data
    with bundle.open("policy/w.bin") as stream:
        assert stream.read() == data
    bundle.get_file("policy/w.bin", tmp_path / "w.bin")
    assert (tmp_path / "w.bin").read_bytes() == data
    bundle.verify()


def test_a_file_that_does_not_pay_is_stored_raw_and_one_that_does_is_compressed(store):
    width = 2
    noise, floats = os.urandom(3 * PLANE_BLOCK), low_entropy_floats(3 * PLANE_BLOCK, width)
    with store.begin(1) as txn:
        for rel, data in (("noise.bin", noise), ("floats.bin", floats), ("small.bin", floats[:999])):
            with txn.open(rel, compression=planes_for(width), only_if_pays=True) as stream:
                stream.write(data)
        txn.commit({})
    bundle = store.open(1)
    files = bundle.manifest.files
    assert (files["noise.bin"].compression, files["noise.bin"].size) == (None, len(noise))
    assert files["floats.bin"].compression == "zstd-planes2" and files["floats.bin"].size <= PAYS * len(floats)
    assert files["small.bin"].compression == "zstd-planes2"  # decided on the whole file, at its close
    assert [bundle.read_bytes(r) for r in ("noise.bin", "floats.bin", "small.bin")] == [noise, floats, floats[:999]]


def test_a_bundle_without_planes_is_written_in_manifest_format_2_and_one_with_them_in_format_3(store):
    for step, kind in ((1, "zstd"), (2, "zstd-planes4")):
        with store.begin(step) as txn:
            txn.write_bytes("w.bin", low_entropy_floats(4096, 4), compression=kind)
            txn.commit({})
    formats = [json.loads(store.fs.cat_file(raw_path(store, f"step_{s}", "manifest.json")))["format"] for s in (1, 2)]
    assert formats == [2, MANIFEST_FORMAT] == [2, 3]


def test_a_format_2_manifest_naming_planes_is_refused(store):
    with store.begin(2) as txn:
        txn.write_bytes("w.bin", low_entropy_floats(4096, 4), compression="zstd-planes4")
        txn.commit({})
    obj = json.loads(store.fs.cat_file(raw_path(store, "step_2", "manifest.json")))
    rewrite_manifest(store, 2, canonical_json({**obj, "format": 2}))
    with pytest.raises(CorruptBundleError, match="compression"):
        store.open(2)


def test_an_unknown_compression_is_refused_before_anything_is_written(store):
    with store.begin(1) as txn, pytest.raises(ValueError, match="unknown compression 'zstd-planes3'"):
        txn.open("w.bin", compression="zstd-planes3")


def test_planes_are_checked_as_one_zstd_frame_of_the_logical_size():
    frame = zstandard.compress(b"\1" * 100)
    with pytest.raises(ValueError, match="100 bytes, the manifest says 101"):
        decompress_exact(frame, 101, "zstd-planes2")


@pytest.mark.parametrize("kind", ["zstd", "zstd-planes2"])
def test_a_sound_entry_is_inflated_in_one_call_not_streamed(kind, monkeypatch):
    data = low_entropy_floats(3 * PLANE_BLOCK + 1, 2)
    compressor = StreamCompressor(kind)
    stored = compressor.compress(data[:PLANE_BLOCK]) + compressor.flush_block()
    stored += compressor.compress(data[PLANE_BLOCK:]) + compressor.flush()

    def streamed(*_args):
        raise AssertionError("inflated through the streaming decoder")

    monkeypatch.setattr(compression_module, "ExactDecompressor", streamed)
    assert decompress_exact(stored, len(data), kind) == data


def test_a_frame_that_declares_another_size_than_the_manifest_is_refused_without_inflating_it():
    stored = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))  # declares its 64 MiB in its header
    with pytest.raises(ValueError, match="logical size"):
        decompress_exact(stored, 1000, "zstd-planes4")
