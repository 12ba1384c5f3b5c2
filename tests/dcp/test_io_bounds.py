"""What bounds rlckpt.dcp's requests and memory: shard files that fit one PUT whatever DCP's split would make
of them, a load that holds a bounded number of checked bytes however many files it reads, and tensor items
loaded as views of the checked buffer rather than copies."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.dcp import _prefetch as prefetch_module
from rlckpt.dcp import reader as reader_module
from rlckpt.dcp._format import DEFAULT_MAX_SHARD_BYTES, ITEM_FRAMING_BYTES, load_tensor_view, shard_plan
from rlckpt.store import WRITE_BLOCK_SIZE, BufferPool, BundleStore
from support.dcp_ranks import bitwise_equal, flat_tensors, plain_policy, policy_state, quiet_dcp_warnings
from support.faults import FaultPlan, FaultyFileSystem

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def tensor_item(name: str, nbytes: int) -> WriteItem:
    size = torch.Size([nbytes // 4])
    return WriteItem(
        index=MetadataIndex(name),
        type=WriteItemType.TENSOR,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=torch.Size([0]), sizes=size),
            properties=TensorProperties(dtype=torch.float32),
            size=size,
        ),
    )


def shard_item(name: str, rows: int, cols: int, ranks: int) -> WriteItem:
    """This rank's chunk (rows / ranks of the rows) of a float32 tensor sharded by rows over `ranks`."""
    return WriteItem(
        index=MetadataIndex(name, torch.Size([0, 0])),
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([rows // ranks, cols])),
            properties=TensorProperties(dtype=torch.float32),
            size=torch.Size([rows, cols]),
        ),
    )


def planned_bytes(bucket: list[WriteItem]) -> int:
    return sum(wi.tensor_data.chunk.sizes.numel() * 4 + ITEM_FRAMING_BYTES for wi in bucket)


def test_no_shard_file_of_several_items_outgrows_one_put_where_dcps_split_would():
    """256 tensors of 4 MiB: DCP's split into ceil(1 GiB / cap) files puts 4 into some files (16 MiB plus
    framing: each one a multipart upload on S3). Capped, every file of several items fits the cap, framing
    included, and the cap fits one PUT."""
    items = [tensor_item(f"w{i}", 4 << 20) for i in range(256)]
    files = shard_plan("__0_", items, thread_count=1)
    assert sorted(wi.index.fqn for _name, bucket in files for wi in bucket) == sorted(wi.index.fqn for wi in items)
    assert max(planned_bytes(bucket) for _name, bucket in files) <= DEFAULT_MAX_SHARD_BYTES < WRITE_BLOCK_SIZE
    assert [name for name, _bucket in files] == [f"__0_{n}.distcp" for n in range(len(files))]


def test_a_shard_weighs_its_chunk_not_the_whole_tensor_so_files_fill_up_to_the_cap():
    """24 items of one rank of 4, each a 2.7 MiB quarter of a 10.7 MiB tensor (a 256 MiB policy + AdamW at 4
    ranks): files are packed by the bytes the rank writes, 5 items to a file, not one quarter-full file per item
    as when the whole tensor's size was counted (25 requests a rank instead of 6)."""
    items = [shard_item(f"w{i}", 1672, 1672, ranks=4) for i in range(24)]
    files = shard_plan("__0_", items, thread_count=1)
    assert [len(bucket) for _name, bucket in files] == [5, 5, 5, 5, 4]
    assert max(planned_bytes(bucket) for _name, bucket in files) <= DEFAULT_MAX_SHARD_BYTES


def test_a_small_shard_of_a_large_tensor_goes_to_the_small_items_file():
    """A chunk within SMALL_ITEM_BYTES is a small item whatever the whole tensor's size: it rides in the rank's
    last, small file rather than in a file of its own."""
    items = [shard_item("big", 1024, 1024, ranks=4), shard_item("tiny", 4096, 16, ranks=4)]
    files = shard_plan("__0_", items, thread_count=1)
    assert [[wi.index.fqn for wi in bucket] for _name, bucket in files] == [["big"], ["tiny"]]


def test_an_item_larger_than_the_cap_gets_a_file_of_its_own_and_thread_count_still_splits():
    items = [tensor_item("huge", 40 << 20), tensor_item("a", 1 << 20), tensor_item("b", 1 << 20)]
    files = shard_plan("__0_", items, thread_count=2)
    buckets = sorted(sorted(wi.index.fqn for wi in bucket) for _name, bucket in files)
    assert buckets == [["a", "b"], ["huge"]]


def test_the_shard_file_of_one_tensor_of_the_write_block_size_is_one_put(s3_run_url, s3_storage_options):
    """A 16 MiB tensor (a common size) gets a file of its own: 16 MiB plus its framing. That file goes up as one
    PUT, not as a multipart upload of a 16 MiB part and a part of a few framing bytes (four requests, the writer
    waiting on the first)."""
    plan = FaultPlan()
    real = BundleStore(s3_run_url, s3_storage_options).fs
    store = BundleStore(s3_run_url, s3_storage_options, fs=FaultyFileSystem(real, plan))
    state = {"w": torch.rand(WRITE_BLOCK_SIZE // 4, generator=torch.Generator().manual_seed(0))}
    plan.calls.clear()
    dcp.save(state, storage_writer=BundleStorageWriter(store, step=1))
    uploads = [call.split(":", 1)[1] for call in plan.calls if call.startswith("_call_s3:")]
    assert "create_multipart_upload" not in uploads and "upload_part" not in uploads
    bundle = store.open(1)
    shard = [entry for name, entry in bundle.manifest.files.items() if name.endswith(".distcp")]
    assert len(shard) == 1 and shard[0].size > WRITE_BLOCK_SIZE
    loaded = {"w": torch.zeros_like(state["w"])}
    dcp.load(loaded, storage_reader=BundleStorageReader(s3_run_url, step=1, storage_options=s3_storage_options))
    assert torch.equal(loaded["w"], state["w"])


def test_every_saved_shard_file_of_several_items_is_within_max_shard_bytes(store_location):
    url, options = store_location
    model, optim = plain_policy(192, 3, seed=0)
    state = policy_state(model, optim)
    dcp.save(state, storage_writer=BundleStorageWriter(url, step=1, storage_options=options, max_shard_bytes=200_000))
    bundle = BundleStore(url, options).open(1)
    metadata = pickle.loads(bundle.read_bytes("policy/.metadata"))
    items_in: dict[str, int] = {}
    for info in metadata.storage_data.values():
        items_in[info.relative_path] = items_in.get(info.relative_path, 0) + 1
    shared = [bundle.manifest.files[f"policy/{name}"].size for name, n in items_in.items() if n > 1]
    assert len(items_in) >= 4 and shared
    assert max(shared) <= 200_000


def recorded_prefetches(monkeypatch) -> list:
    """Every Prefetch a load makes from here on (the files it fetches ahead, its workers, what it held)."""
    prefetches = []

    class Recorded(reader_module.Prefetch):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            prefetches.append(self)

    monkeypatch.setattr(reader_module, "Prefetch", Recorded)
    return prefetches


def test_a_load_holds_at_most_its_read_ahead_budget_of_checked_files(store_location, monkeypatch):
    """Memory on load is flat in the number and size of files: with a budget of two of these files, the
    buffers lent at once never hold more than two, whatever the number of files fetched ahead."""
    url, options = store_location
    model, optim = plain_policy(192, 3, seed=0)
    saved = policy_state(model, optim)
    dcp.save(saved, storage_writer=BundleStorageWriter(url, step=1, storage_options=options, max_shard_bytes=200_000))
    pool = BufferPool()
    monkeypatch.setattr(prefetch_module, "READ_BUFFERS", pool)
    monkeypatch.setattr(prefetch_module, "READ_AHEAD_BYTES", 2 * 200_000)
    prefetches = recorded_prefetches(monkeypatch)
    model2, optim2 = plain_policy(192, 3, seed=5)
    loaded = policy_state(model2, optim2)
    dcp.load(loaded, storage_reader=BundleStorageReader(url, step=1, storage_options=options, fetch_workers=4))
    assert bitwise_equal(flat_tensors(loaded), flat_tensors(saved)) == []
    assert 0 < prefetches[0].peak_held <= 2 * 200_000  # the bytes of the checked files held at once
    # each file (< 1 MiB) in a buffer rounded up to 1 MiB: two shard files and the small items' file at most,
    # where a window of files (fetch_workers + 1 ahead of the one loading) would hold six
    assert 0 < pool.peak_lent <= 3 << 20
    assert pool.lent_bytes == 0


def test_a_load_fetches_more_shard_files_at_once_from_an_object_store_than_from_local_disk(store_location, monkeypatch):
    """An object store serves each file as one streamed GET, bounded per stream by a relay or a distant
    server: more at once load faster there. Local disk keeps its three."""
    url, options = store_location
    model, optim = plain_policy(192, 3, seed=0)
    saved = policy_state(model, optim)
    dcp.save(saved, storage_writer=BundleStorageWriter(url, step=1, storage_options=options, max_shard_bytes=100_000))
    prefetches = recorded_prefetches(monkeypatch)
    model2, optim2 = plain_policy(192, 3, seed=5)
    loaded = policy_state(model2, optim2)
    dcp.load(loaded, storage_reader=BundleStorageReader(url, step=1, storage_options=options))
    assert bitwise_equal(flat_tensors(loaded), flat_tensors(saved)) == []
    (prefetch,) = prefetches
    assert len(prefetch._order) > reader_module.FETCH_WORKERS_OBJECT_STORE  # enough files for every worker
    local = not url.startswith("s3://")
    expected = reader_module.FETCH_WORKERS_LOCAL if local else reader_module.FETCH_WORKERS_OBJECT_STORE
    assert prefetch._pool._max_workers == expected


def test_a_tensor_item_loads_as_a_view_of_the_checked_bytes():
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    archive = io.BytesIO()
    torch.save(tensor, archive)
    buffer = bytearray(archive.getvalue())
    loaded = load_tensor_view(memoryview(buffer))
    assert torch.equal(loaded, tensor)
    start = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    assert start <= loaded.data_ptr() < start + len(buffer)  # no copy: it lives in the buffer


def test_a_tensor_item_cut_short_is_refused_not_read_past_its_end():
    archive = io.BytesIO()
    torch.save(torch.ones(1000), archive)
    with pytest.raises(RuntimeError):
        load_tensor_view(memoryview(bytearray(archive.getvalue()[:-2000])))


def test_a_ranks_joined_writers_reuse_one_store_and_its_client_across_saves(store_location, monkeypatch):
    """A trainer rank makes a new writer per save: building a store (an S3 client, new connections) for each
    would cost every save; the process keeps one per run."""
    from rlckpt.dcp import writer as writer_module

    url, options = store_location
    made = []

    class Counted(BundleStore):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(writer_module, "BundleStore", Counted)
    monkeypatch.setattr(writer_module, "_STORES", type(writer_module._STORES)())
    coordinator = BundleStore(url, options)
    model, optim = plain_policy(64, 2, seed=0)
    for step in (1, 2):
        txn = coordinator.begin(step)
        writer = BundleStorageWriter(txn.handle(), participant="rank0")
        dcp.save(policy_state(model, optim), storage_writer=writer)
        txn.commit(receipts=[writer.receipt], participants={"rank0"})
    assert len(made) == 1
    assert coordinator.steps() == [1, 2]
