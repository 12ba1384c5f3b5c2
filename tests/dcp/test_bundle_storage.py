"""BundleStorageWriter / BundleStorageReader in one process (DCP without a process group, world size 1), on
local disk and on S3 with the same body: DCP's own format, digests before torch sees a byte, no in-place
overwrite, what a failed save leaves, and the refusals. The multi-rank behaviour is in test_multi_rank.py."""

from __future__ import annotations

import gc
import io
import pickle
import struct
import threading
import zipfile
import zlib

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.dcp import _format as format_module
from rlckpt.dcp import _prefetch as prefetch_module
from rlckpt.dcp import _safe_unpickle as safe_unpickle
from rlckpt.dcp._format import SMALL_ITEM_BYTES
from rlckpt.errors import BundleExistsError, CorruptBundleError, InvalidPathError, ShardedCheckpointError
from rlckpt.store import BufferPool, BundleStore
from support import dcp_scenarios as scenarios
from support.dcp_ranks import (
    bitwise_equal,
    flat_tensors,
    plain_policy,
    policy_state,
    quiet_dcp_warnings,
    train_step,
)
from support.store_checks import debris, rewrite_as_format_1

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

WIDTH, DEPTH = 192, 3  # weights (144 KiB) above SMALL_ITEM_BYTES, biases below


def trained_state(seed: int) -> dict:
    model, optim = plain_policy(WIDTH, DEPTH, seed=seed)
    train_step(model, optim, WIDTH, seed=seed + 1)
    return policy_state(model, optim)


@pytest.fixture
def run(store_location):
    """(store, url, storage_options) of an empty run, with step 1 saved through rlckpt from trained_state(0)."""
    url, options = store_location
    store = BundleStore(url, options)  # one store (one S3 client) per test where the URL form is not the point
    dcp.save(trained_state(0), storage_writer=BundleStorageWriter(store, step=1))
    return store, url, options


def load(reader, seed: int = 77) -> dict[str, torch.Tensor]:
    state = trained_state(seed)
    dcp.load(state, storage_reader=reader)
    return flat_tensors(state)


def raised_inside(excinfo, error: type[BaseException]) -> BaseException:
    """The `error` a rank raised inside DCP's CheckpointException (DCP wraps every rank's failure)."""
    failures = getattr(excinfo.value, "failures", {})
    found = [err for err, _tb in failures.values() if isinstance(err, error)]
    assert found, f"no {error.__name__} among {failures}"
    return found[0]


def largest_item(store: BundleStore, step: int):
    """The _StorageInfo of the biggest item in step's policy/.metadata (its middle is tensor data)."""
    metadata = pickle.loads(store.open(step).read_bytes("policy/.metadata"))
    return max(metadata.storage_data.values(), key=lambda info: info.length)


def dcp_own_writer(url: str, options, **kwargs):
    if options is None:
        return dcp.FileSystemWriter(url, **kwargs)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(url, sync_files=False, **kwargs, **options)


# --- DCP's own format ------------------------------------------------------------------------------


def item_bytes(read_file, metadata) -> dict:
    """Each item's serialized bytes, from the files `metadata` points into."""
    files: dict[str, bytes] = {}
    out = {}
    for index, info in metadata.storage_data.items():
        data = files.setdefault(info.relative_path, read_file(info.relative_path))
        out[index] = data[info.offset : info.offset + info.length]
    return out


def zip_records(item: bytes) -> list[tuple[str, int, int]]:
    """(name, recorded CRC-32, CRC-32 of its bytes) of every record of one item (a torch.save zip)."""
    with zipfile.ZipFile(io.BytesIO(item)) as archive:
        return [(info.filename, info.CRC, zlib.crc32(_record_bytes(item, info))) for info in archive.infolist()]


def _record_bytes(item: bytes, info: zipfile.ZipInfo) -> bytes:
    """A stored (uncompressed) record's bytes: after its local header (30 bytes), name and extra field."""
    name_len, extra_len = struct.unpack_from("<HH", item, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len
    return item[start : start + info.file_size]


def saved_items(url: str, options, writer) -> dict:
    """Every item's bytes, by index, of what `writer` saved of trained_state(0) at `url`."""
    dcp.save(trained_state(0), storage_writer=writer)
    store = BundleStore(url, options)
    if store.steps():
        bundle = store.open(store.steps()[-1])
        metadata = pickle.loads(bundle.read_bytes("policy/.metadata"))
        return item_bytes(lambda name: bundle.read_bytes(f"policy/{name}"), metadata)
    metadata = pickle.loads(store.fs.cat_file(f"{store.root}/.metadata"))
    return item_bytes(lambda name: store.fs.cat_file(f"{store.root}/{name}"), metadata)


@pytest.mark.parametrize("thread_count", [1, 2])
def test_every_item_is_stored_byte_for_byte_as_dcps_own_writer_stores_it_without_zip_crcs(
    store_location, thread_count, monkeypatch
):
    """DCP's format: same .metadata (but which file an item went to), and for every item the bytes DCP's own
    writer stores with torch's zip CRC-32 off in all its threads (rlckpt leaves it out: _format.NO_ZIP_CRC)."""
    url, options = store_location
    state = trained_state(0)
    with monkeypatch.context() as patched:
        patched.setattr(torch.serialization, "get_crc32_options", lambda: False)
        dcp.save(state, storage_writer=dcp_own_writer(f"{url}-dcp", options, thread_count=thread_count))
    dcp.save(state, storage_writer=BundleStorageWriter(url, step=1, storage_options=options, thread_count=thread_count))
    theirs = BundleStore(f"{url}-dcp", options)
    bundle = BundleStore(url, options).open(1)

    ours_md = pickle.loads(bundle.read_bytes("policy/.metadata"))
    their_md = pickle.loads(theirs.fs.cat_file(f"{theirs.root}/.metadata"))
    assert ours_md.state_dict_metadata == their_md.state_dict_metadata
    assert ours_md.version == their_md.version
    assert set(ours_md.storage_data) == set(their_md.storage_data)  # no receipts or other extras rode along
    assert all(
        info.relative_path.startswith("__0_") and info.relative_path.endswith(".distcp")
        for info in ours_md.storage_data.values()
    )
    ours = item_bytes(lambda name: bundle.read_bytes(f"policy/{name}"), ours_md)
    assert ours == item_bytes(lambda name: theirs.fs.cat_file(f"{theirs.root}/{name}"), their_md)


@pytest.mark.parametrize("thread_count", [1, 2])
def test_the_records_of_every_item_carry_no_zip_crc(store_location, thread_count):
    """torch.save's CRC-32 is work no torch reader checks; the shard file's BLAKE3 is checked instead."""
    url, options = store_location
    items = saved_items(
        url, options, BundleStorageWriter(url, step=1, storage_options=options, thread_count=thread_count)
    )
    records = [record for item in items.values() for record in zip_records(item)]
    assert records and all(recorded == 0 for _name, recorded, _actual in records)
    assert any(actual != 0 for _name, _recorded, actual in records)  # a zero would not show the CRC was left out


def test_dcps_own_writer_still_records_the_zip_crc_of_every_item(store_location):
    """rlckpt's saves leave torch's switch as it was: DCP's writer, after one, records every CRC-32."""
    url, options = store_location
    dcp.save(trained_state(0), storage_writer=BundleStorageWriter(url, step=1, storage_options=options))
    items = saved_items(f"{url}-dcp", options, dcp_own_writer(f"{url}-dcp", options))
    records = [record for item in items.values() for record in zip_records(item)]
    assert records and all(recorded == actual for _name, recorded, actual in records)


def test_a_torch_save_in_another_thread_during_a_shard_write_records_its_zip_crc(store_location, monkeypatch):
    """The CRC is left out of rlckpt's shard files only: a torch.save elsewhere in the process while a rank
    writes its shards (a trainer's own file, mid async save) still records it, or zip tools refuse the file."""
    url, options = store_location
    writing, saved = threading.Event(), threading.Event()
    write = format_module._CountingStream.write

    def paused_write(self, data):  # the save's first write, inside its writing thread, waits for ours
        if not writing.is_set():
            writing.set()
            assert saved.wait(30)
        return write(self, data)

    monkeypatch.setattr(format_module._CountingStream, "write", paused_write)
    saving = threading.Thread(
        target=dcp.save,
        args=(trained_state(0),),
        kwargs={"storage_writer": BundleStorageWriter(url, step=1, storage_options=options)},
    )
    saving.start()
    try:
        assert writing.wait(30)
        ours = io.BytesIO()
        torch.save(torch.arange(1000.0), ours)
    finally:
        saved.set()
        saving.join(60)
    records = zip_records(ours.getvalue())
    assert records and all(recorded == actual for _name, recorded, actual in records)
    assert BundleStore(url, options).steps() == [1]


def test_small_items_get_a_file_of_their_own(run):
    """Replicated items (AdamW's step counters, param_groups) are small; every rank reads them, so they
    must not sit in a file with a rank's big shards, which the reader would have to fetch whole."""
    store, _url, _options = run
    metadata = pickle.loads(store.open(1).read_bytes("policy/.metadata"))
    small = SMALL_ITEM_BYTES
    files: dict[str, list[int]] = {}
    for info in metadata.storage_data.values():
        files.setdefault(info.relative_path, []).append(info.length)
    holding_small = {name for name, lengths in files.items() if min(lengths) < small}
    assert len(files) == 2 and len(holding_small) == 1
    assert max(files[holding_small.pop()]) < small + 4096  # an item's torch.save framing is ~1-2 KiB


def test_max_shard_bytes_caps_the_size_of_shard_files(store_location):
    url, options = store_location
    dcp.save(
        trained_state(0),
        storage_writer=BundleStorageWriter(url, step=1, storage_options=options, max_shard_bytes=200_000),
    )
    bundle = BundleStore(url, options).open(1)
    sizes = [bundle.manifest.files[rel].size for rel in bundle.files_under("policy") if rel.endswith(".distcp")]
    assert len(sizes) >= 4 and max(sizes) < 200_000 + 150_000  # one 144 KiB weight (+ framing) may top a file up
    assert (
        bitwise_equal(load(BundleStorageReader(url, step=1, storage_options=options)), flat_tensors(trained_state(0)))
        == []
    )


def test_a_bundles_policy_dir_loads_with_dcps_own_reader(run):
    store, _url, options = run
    assert bitwise_equal(load(scenarios.dcp_own_reader(store, 1, options)), flat_tensors(trained_state(0))) == []


def test_the_reader_accepts_a_store_or_an_opened_bundle(run):
    store, _url, _options = run
    expected = flat_tensors(trained_state(0))
    assert bitwise_equal(load(BundleStorageReader(store, step=1)), expected) == []
    assert bitwise_equal(load(BundleStorageReader(store.open(1))), expected) == []


def test_checkpoint_id_names_the_step(run):
    _store, url, options = run
    dcp.save(trained_state(5), checkpoint_id=7, storage_writer=BundleStorageWriter(url, storage_options=options))
    assert BundleStore(url, options).steps() == [1, 7]
    state = trained_state(9)
    dcp.load(state, checkpoint_id=7, storage_reader=BundleStorageReader(url, step=1, storage_options=options))
    assert bitwise_equal(flat_tensors(state), flat_tensors(trained_state(5))) == []


def test_a_standalone_save_records_the_checkpoint_in_the_manifest(store_location):
    url, options = store_location
    writer = BundleStorageWriter(url, step=3, storage_options=options, metadata={"run": "r1"})
    dcp.save(trained_state(0), storage_writer=writer)
    assert writer.manifest is not None
    assert writer.manifest.metadata == {"run": "r1", "dcp": {"prefix": "policy", "world_size": 1, "version": "1.0.0"}}
    assert BundleStore(url, options).open(3).manifest.metadata == writer.manifest.metadata


# --- digests before torch sees a byte ----------------------------------------------------------------


def test_a_flipped_bit_in_a_shard_is_refused_naming_the_file(run):
    store, url, options = run
    item = largest_item(store, 1)
    scenarios.flip_bit(store, 1, f"policy/{item.relative_path}", item.offset + item.length // 2)
    target = trained_state(77)
    before = flat_tensors(target)
    with pytest.raises(dcp.CheckpointException) as excinfo:
        dcp.load(target, storage_reader=BundleStorageReader(url, storage_options=options))
    error = raised_inside(excinfo, CorruptBundleError)
    assert f"policy/{item.relative_path} has blake3:" in str(error)
    assert bitwise_equal(flat_tensors(target), before) == []  # torch never saw a byte of it


def test_dcps_own_reader_loads_the_same_flipped_bit_silently(run):
    store, _url, options = run
    item = largest_item(store, 1)
    scenarios.flip_bit(store, 1, f"policy/{item.relative_path}", item.offset + item.length // 2)
    differ = bitwise_equal(load(scenarios.dcp_own_reader(store, 1, options)), flat_tensors(trained_state(0)))
    assert len(differ) == 1  # no error, one tensor quietly wrong


def test_a_flipped_bit_in_metadata_is_refused_before_it_is_unpickled(run, monkeypatch):
    store, url, options = run
    scenarios.flip_bit(store, 1, "policy/.metadata", 100)

    def no_unpickling(*args, **kwargs):
        raise AssertionError("unpickled .metadata whose digest did not match")

    monkeypatch.setattr(safe_unpickle, "restricted_loads", no_unpickling)
    with pytest.raises(CorruptBundleError, match=r"policy/\.metadata has blake3:"):
        BundleStorageReader(url, step=1, storage_options=options)


def test_a_checkpoint_in_a_format_1_bundle_loads_checked_under_sha256(run):
    store, url, options = run
    rewrite_as_format_1(store, 1)
    assert bitwise_equal(load(BundleStorageReader(url, storage_options=options)), flat_tensors(trained_state(0))) == []


def test_a_flipped_bit_in_a_format_1_bundles_shard_is_refused_under_sha256(run):
    store, url, options = run
    rewrite_as_format_1(store, 1)
    item = largest_item(store, 1)
    scenarios.flip_bit(store, 1, f"policy/{item.relative_path}", item.offset + item.length // 2)
    with pytest.raises(dcp.CheckpointException) as excinfo:
        dcp.load(trained_state(77), storage_reader=BundleStorageReader(url, storage_options=options))
    assert f"policy/{item.relative_path} has sha256:" in str(raised_inside(excinfo, CorruptBundleError))


def test_a_load_reads_into_buffers_it_gives_back_whether_it_succeeds_or_fails(run, monkeypatch):
    """How many buffers a load has lent at once depends on its read-ahead's timing, so what is asserted is
    what does not: every buffer comes back, and the next load takes the kept ones."""
    store, url, options = run
    pool = BufferPool()
    monkeypatch.setattr(prefetch_module, "READ_BUFFERS", pool)
    load(BundleStorageReader(url, storage_options=options))
    assert pool.lent_bytes == 0 and pool.idle_bytes > 0 and pool.reused == 0
    load(BundleStorageReader(url, storage_options=options))
    assert pool.lent_bytes == 0 and pool.reused > 0  # the second load read into the first one's buffers
    item = largest_item(store, 1)
    scenarios.flip_bit(store, 1, f"policy/{item.relative_path}", item.offset + item.length // 2)
    with pytest.raises(dcp.CheckpointException):
        load(BundleStorageReader(url, storage_options=options))
    assert pool.lent_bytes == 0


# --- no in-place overwrite, and what a failed save leaves -----------------------------------------------


def test_saving_a_committed_step_again_is_refused_and_leaves_it_intact(run):
    store, url, options = run
    with pytest.raises(dcp.CheckpointException) as excinfo:
        dcp.save(trained_state(5), storage_writer=BundleStorageWriter(store, step=1))
    raised_inside(excinfo, BundleExistsError)
    assert bitwise_equal(load(BundleStorageReader(store, step=1)), flat_tensors(trained_state(0))) == []
    assert debris(store) == []


def failing_save(writer) -> None:
    dcp.save(trained_state(5), storage_writer=writer, planner=scenarios.FailingPlanner(0, "before_write"))


def test_a_failed_save_in_a_with_block_leaves_nothing(run):
    store, url, options = run
    with pytest.raises(dcp.CheckpointException), BundleStorageWriter(store, step=2) as writer:
        failing_save(writer)
    assert store.steps() == [1]
    assert debris(store) == []


def test_a_dropped_writer_aborts_the_transaction_its_failed_save_left_open(run):
    """DCP never calls the coordinator's writer again after another rank failed; its transaction is
    aborted when the writer goes away."""
    store, url, options = run
    writer = BundleStorageWriter(store, step=2)
    with pytest.raises(dcp.CheckpointException) as excinfo:
        failing_save(writer)
    assert store.read_intent(2) is not None  # still held while the writer lives
    del writer, excinfo  # the traceback holds DCP's frames, which hold the writer
    gc.collect()
    assert store.read_intent(2) is None
    assert debris(store) == []


def test_a_retry_through_the_same_writer_commits_the_step_its_failed_save_left_open(run):
    store, url, options = run
    writer = BundleStorageWriter(store, step=2)
    with pytest.raises(dcp.CheckpointException):
        failing_save(writer)
    dcp.save(trained_state(5), storage_writer=writer)
    assert store.steps() == [1, 2]
    assert bitwise_equal(load(BundleStorageReader(store, step=2)), flat_tensors(trained_state(5))) == []


# --- refusals -------------------------------------------------------------------------------------


def test_ranks_that_opened_different_bundles_are_refused(run):
    store, url, options = run
    dcp.save(trained_state(5), storage_writer=BundleStorageWriter(store, step=2))
    readers = [BundleStorageReader(store, step=1), BundleStorageReader(store, step=2)]
    plans = [r.prepare_local_plan(dcp.LoadPlan([])) for r in readers]
    with pytest.raises(ShardedCheckpointError, match=r"step 1 .* step 2 .*pass an explicit step"):
        readers[0].prepare_global_plan(plans)


def test_a_bundle_without_dcp_metadata_under_the_prefix_is_named(run):
    store, _url, _options = run
    with pytest.raises(ShardedCheckpointError, match=r"no DCP checkpoint under 'optim'.*optim/\.metadata"):
        BundleStorageReader(store, step=1, prefix="optim")


def test_a_prefix_under_a_reserved_name_is_refused_before_anything_is_written(run):
    store, _url, _options = run
    for prefix in ("COMMIT", "manifest.json/policy"):
        with pytest.raises(InvalidPathError, match="reserved for the bundle's own metadata"):
            BundleStorageWriter(store, step=2, prefix=prefix)
    assert store.steps() == [1]
    assert debris(store) == []


def test_a_joined_writer_saves_once(run):
    store, _url, _options = run
    txn = store.begin(2)
    writer = BundleStorageWriter(txn.handle(), participant="rank0")
    dcp.save(trained_state(5), storage_writer=writer)
    with pytest.raises(dcp.CheckpointException) as excinfo:
        dcp.save(trained_state(5), storage_writer=writer)
    assert "saves once" in str(raised_inside(excinfo, ShardedCheckpointError))
    txn.commit(receipts=[writer.receipt], participants={"rank0"})
    assert bitwise_equal(load(BundleStorageReader(store, step=2)), flat_tensors(trained_state(5))) == []
