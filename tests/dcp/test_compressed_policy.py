"""Policy compression (`BundleStorageWriter(compression=...)`): byte planes + zstd per shard file, every bit
back for every dtype, raw where it does not pay, and where "auto" compresses; on local disk and S3."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.errors import ShardedCheckpointError
from rlckpt.store import BundleStore
from support.dcp_ranks import bitwise_equal, quiet_dcp_warnings

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

N = 96 * 1024  # elements per tensor: above SMALL_ITEM_BYTES for every dtype, so each lands in a bulk file


def weights_like(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Drawn as trained weights are (normal, std 0.02), or small integers for an integer dtype."""
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(N, generator=gen, dtype=torch.float64) * 0.02).to(dtype)
    return torch.randint(-1000, 1000, (N,), generator=gen).to(dtype)


def any_bits(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every bit pattern alike (NaN payloads, infinities and subnormals among them): nothing to compress."""
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (N * dtype.itemsize,), generator=gen, dtype=torch.uint8)
    return raw.view(dtype)


DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64, torch.int32, torch.int8]


@pytest.fixture
def store(store_location):
    url, options = store_location
    return BundleStore(url, options)


def save_and_load(store: BundleStore, state: dict[str, torch.Tensor], compression: str | None) -> dict:
    dcp.save(state, storage_writer=BundleStorageWriter(store, step=1, compression=compression))
    into = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(into, storage_reader=BundleStorageReader(store, step=1))
    return into


def shard_compressions(store: BundleStore) -> dict[str, str | None]:
    files = store.open(1).manifest.files
    return {rel: entry.compression for rel, entry in files.items() if rel.endswith(".distcp")}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_compressed_save_loads_back_every_bit_of_each_dtype(store, dtype):
    state = {"weight": weights_like(dtype, 1), "bits": any_bits(dtype, 2), "bias": weights_like(dtype, 3)[:100]}
    assert bitwise_equal(save_and_load(store, state, "on"), state) == []
    if dtype.itemsize > 1:  # the int8 draw wraps around into noise
        assert any(shard_compressions(store).values())


def test_floats_are_stored_in_planes_of_their_width_and_random_bits_raw(store):
    state = {
        "bf16": weights_like(torch.bfloat16, 1),
        "fp32": weights_like(torch.float32, 2),
        "noise": any_bits(torch.bfloat16, 3),
    }
    writer = BundleStorageWriter(store, step=1, compression="on", max_shard_bytes=N * 2 + (8 << 10))  # one each
    dcp.save(state, storage_writer=writer)
    files = store.open(1).manifest.files
    kinds = sorted(e.compression or "raw" for rel, e in files.items() if e.logical_size > N)
    assert kinds == ["raw", "zstd-planes2", "zstd-planes4"]
    stored, logical = (sum(getattr(e, k) for e in files.values()) for k in ("size", "logical_size"))
    assert stored < 0.9 * logical


def test_auto_compresses_on_object_stores_and_not_on_local_disk(store):
    save_and_load(store, {"weight": weights_like(torch.bfloat16, 1)}, "auto")
    compressed = {kind is not None for kind in shard_compressions(store).values()}
    assert compressed == {not store.is_local}


def test_off_is_the_default_and_stores_every_shard_raw(store):
    dcp.save({"weight": weights_like(torch.bfloat16, 1)}, storage_writer=BundleStorageWriter(store, step=1))
    assert set(shard_compressions(store).values()) == {None}


def test_an_unknown_compression_mode_is_refused_when_the_writer_is_made(store):
    with pytest.raises(ShardedCheckpointError, match="compression must be one of off, auto, on"):
        BundleStorageWriter(store, step=1, compression="zstd")
