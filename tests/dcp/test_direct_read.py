"""A shard file holding large tensors is read straight into the tensors it loads into (rlckpt.dcp._direct), on
local disk and on S3 alike (there in one GET): no buffer of its size, the same result as DCP's own load, and
nothing of it trusted before its digest. DIRECT_MIN is lowered so that a few MiB stand for the hundreds of MiB
of a real policy's tensors."""

from __future__ import annotations

import pickle
from typing import Any, cast

import aiohttp
import pytest
import torch
import torch.distributed.checkpoint as dcp

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.dcp import _prefetch as prefetch_module
from rlckpt.dcp import reader as reader_module
from rlckpt.errors import CorruptBundleError
from rlckpt.store import BufferPool, BundleStore
from rlckpt.store.backends import s3_io
from rlckpt.store.backends.s3 import S3Backend
from rlckpt.store.backends.s3_io import StreamedObject
from support.dcp_ranks import quiet_dcp_warnings
from support.dcp_scenarios import flip_bit

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

BIG = (768, 1024)  # 3 MiB of float32: one shard file of its own


@pytest.fixture
def pool(monkeypatch) -> BufferPool:
    """A pool of read buffers of this test's own, with direct reads from 64 KiB up."""
    pool = BufferPool()
    monkeypatch.setattr(prefetch_module, "READ_BUFFERS", pool)
    monkeypatch.setattr(reader_module, "DIRECT_MIN", 64 << 10)
    return pool


@pytest.fixture
def placed_loads(monkeypatch) -> list[object]:
    """The items loaded where their tensor's bytes landed (not copied there from memory)."""
    placed: list[object] = []
    real = reader_module.load_placed

    def spied(item: Any) -> torch.Tensor:
        placed.append(item)
        return real(item)

    monkeypatch.setattr(reader_module, "load_placed", spied)
    return placed


def saved(url: str, options: dict | None) -> dict[str, torch.Tensor]:
    state = {"big": torch.randn(*BIG, generator=torch.Generator().manual_seed(0)), "bias": torch.arange(10.0)}
    dcp.save(state, storage_writer=BundleStorageWriter(url, step=1, storage_options=options), no_dist=True)
    return state


def big_file(url: str, options: dict | None) -> str:
    """The relpath of the shard file holding only `big`."""
    bundle = BundleStore(url, options).open(1)
    metadata = pickle.loads(bundle.read_bytes("policy/.metadata"))
    (info,) = [info for index, info in metadata.storage_data.items() if index.fqn == "big"]
    return f"policy/{info.relative_path}"


def load(url: str, options: dict | None, into: dict[str, torch.Tensor]) -> None:
    dcp.load(into, storage_reader=BundleStorageReader(url, step=1, storage_options=options), no_dist=True)


def load_refused(url: str, options: dict | None) -> CorruptBundleError:
    """The CorruptBundleError a load raised inside DCP's CheckpointException (DCP wraps every rank's failure)."""
    with pytest.raises(dcp.CheckpointException) as excinfo:
        load(url, options, {"big": torch.zeros(*BIG), "bias": torch.zeros(10)})
    found = [err for err, _tb in excinfo.value.failures.values() if isinstance(err, CorruptBundleError)]
    assert found, f"no CorruptBundleError among {excinfo.value.failures}"
    return found[0]


def test_a_single_tensor_file_loads_into_its_tensor_without_a_buffer_of_its_size(store_location, pool, placed_loads):
    url, options = store_location
    state = saved(url, options)
    into = {"big": torch.zeros(*BIG), "bias": torch.zeros(10)}
    place = into["big"].data_ptr()

    load(url, options, into)

    assert torch.equal(into["big"], state["big"]) and torch.equal(into["bias"], state["bias"])
    assert into["big"].data_ptr() == place
    assert len(placed_loads) == 1  # loaded where its bytes landed
    assert pool.peak_lent <= 1 << 20  # the small item's file only; the 3 MiB file took no buffer
    assert pool.lent_bytes == 0


def test_a_flipped_byte_in_a_tensor_read_into_place_fails_the_load_naming_its_file(store_location, pool):
    url, options = store_location
    saved(url, options)
    rel = big_file(url, options)
    flip_bit(BundleStore(url, options), 1, rel, 2 << 20)  # inside the tensor's bytes

    assert f"{rel} has blake3:" in str(load_refused(url, options))


@pytest.mark.parametrize("from_end", [1, 20, 300], ids=["end-record", "directory", "small-records"])
def test_a_flipped_byte_where_the_file_says_where_its_tensor_lies_still_fails_the_load(store_location, pool, from_end):
    """Where the pieces lie is read unchecked (the directory; on S3 the first bytes, then the directory); a forged
    one misplaces them, and the digest of the whole file still refuses it."""
    url, options = store_location
    saved(url, options)
    rel = big_file(url, options)
    store = BundleStore(url, options)
    flip_bit(store, 1, rel, store.open(1).manifest.files[rel].size - from_end)

    assert f"{rel} has blake3:" in str(load_refused(url, options))


@pytest.fixture
def held(monkeypatch) -> list[StreamedObject]:
    """Every S3 object a read in order holds (each counts the GETs it made)."""
    made: list[StreamedObject] = []
    real = S3Backend.hold

    def hold(self: S3Backend, path: str) -> StreamedObject:
        made.append(cast(StreamedObject, real(self, path)))
        return made[-1]

    monkeypatch.setattr(S3Backend, "hold", hold)
    return made


def test_on_s3_a_file_read_into_its_tensors_is_one_get(s3_run_url, s3_storage_options, pool, held, placed_loads):
    """Its small records, its tensor's bytes and the look at where they lie are all read off one GET, kept open
    from piece to piece: no request per piece, and no buffer of the file's size."""
    state = saved(s3_run_url, s3_storage_options)
    into = {"big": torch.zeros(*BIG), "bias": torch.zeros(10)}

    load(s3_run_url, s3_storage_options, into)

    assert torch.equal(into["big"], state["big"])
    assert len(placed_loads) == 1  # loaded where it landed: its guessed place was confirmed
    assert [obj.requests for obj in held] == [1]  # the small item's file is fetched whole, as ever, not held
    assert pool.peak_lent <= 1 << 20


def test_on_s3_a_get_that_breaks_midway_is_reopened_where_it_broke(s3_run_url, s3_storage_options, pool, held):
    """The connection drops after the first MiB of the tensor's file: the read goes on from that byte with a
    second GET, and the load is whole (and checked)."""
    state = saved(s3_run_url, s3_storage_options)
    real_fill = s3_io._fill
    broke: list[int] = []

    async def fill_then_break(body: Any, target: memoryview) -> int:
        if broke or len(target) < (1 << 20):
            return await real_fill(body, target)
        got = await real_fill(body, target[: 1 << 20])
        broke.append(got)
        raise s3_io._BodyBroke(got, aiohttp.ClientPayloadError("connection reset by peer"))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(s3_io, "_fill", fill_then_break)
        into = {"big": torch.zeros(*BIG), "bias": torch.zeros(10)}
        load(s3_run_url, s3_storage_options, into)

    assert broke == [1 << 20]
    assert torch.equal(into["big"], state["big"])
    assert [obj.requests for obj in held] == [2]


def test_on_s3_a_get_that_gives_nothing_fails_the_load_without_reopening_it(s3_run_url, s3_storage_options, pool, held):
    """A silent server (the body times out before its first byte) is not asked again and again: one GET, and the
    load fails naming the file, within the deadline of one request."""
    saved(s3_run_url, s3_storage_options)
    rel = big_file(s3_run_url, s3_storage_options)

    async def silent(body: Any, target: memoryview) -> int:
        raise s3_io._BodyBroke(0, TimeoutError("read timeout"))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(s3_io, "_fill", silent)
        with pytest.raises(dcp.CheckpointException) as excinfo:
            load(s3_run_url, s3_storage_options, {"big": torch.zeros(*BIG), "bias": torch.zeros(10)})

    assert [obj.requests for obj in held] == [1]
    assert any(rel.split("/")[-1] in str(err) for err, _tb in excinfo.value.failures.values()), excinfo.value.failures


def test_on_s3_a_placement_its_directory_does_not_confirm_loads_the_common_way(s3_run_url, s3_storage_options, pool):
    """On S3 where a tensor lies is guessed from the item's first bytes; a guess the item's own directory does not
    confirm once the file checked out (here: the pickle's record taken for the tensor's) is not trusted: the item
    loads from the bytes read, the common way, with the stored values."""
    from rlckpt.dcp import _direct

    state = saved(s3_run_url, s3_storage_options)
    guesses: list[_direct.Layout] = []

    def misled(read: Any, start: int, length: int, nbytes: int) -> _direct.Layout | None:
        found = _direct.locate_head(read, start, length, nbytes)
        if found is not None:
            guesses.append(_direct.Layout(found.record, 0, nbytes, length))  # the first record's header: the pickle
        return guesses[-1] if found is not None else None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader_module, "locate_head", misled)
        into = {"big": torch.zeros(*BIG), "bias": torch.zeros(10)}
        load(s3_run_url, s3_storage_options, into)

    assert len(guesses) == 1
    assert torch.equal(into["big"], state["big"])


def test_a_tensor_of_another_dtype_of_the_same_size_loads_as_dcps_own_copy_converts_it(tmp_path, pool):
    """The stored bytes land in an int32 tensor; the loaded float32 view of them is then copied into it with
    DCP's conversion, as FileSystemReader would (its result, bit for bit)."""
    url = str(tmp_path / "run")
    saved(url, None)
    ours = {"big": torch.zeros(*BIG, dtype=torch.int32), "bias": torch.zeros(10)}
    dcps = {"big": torch.zeros(*BIG, dtype=torch.int32), "bias": torch.zeros(10)}

    load(url, None, ours)
    bundle_dir = BundleStore(url).open(1)
    local = tmp_path / "plain"
    bundle_dir.get_dir("policy", local)
    dcp.load(dcps, storage_reader=dcp.FileSystemReader(str(local)), no_dist=True)

    assert torch.equal(ours["big"], dcps["big"]) and ours["big"].abs().sum() > 0


def test_a_tensor_that_is_not_one_block_of_memory_is_loaded_the_common_way(tmp_path, pool):
    url = str(tmp_path / "run")
    state = saved(url, None)
    strided = torch.zeros(BIG[1], BIG[0]).t()  # the right shape, not contiguous
    into = {"big": strided, "bias": torch.zeros(10)}

    load(url, None, into)

    assert torch.equal(into["big"], state["big"])  # bytes placed as if it were one block would be transposed
    assert into["big"] is strided and not strided.is_contiguous()


def test_a_file_is_placed_only_into_a_tensor_of_its_tensor_record_size(tmp_path):
    """A rank loading a slice of a stored tensor (resharding) wants fewer bytes than the record holds: the file
    is not laid out for it, and is read the common way (DCP narrows it)."""
    from rlckpt.dcp._direct import locate, locate_head

    url = str(tmp_path / "run")
    saved(url, None)
    rel = big_file(url, None)
    bundle = BundleStore(url).open(1)
    entry = bundle.manifest.files[rel]
    whole = BIG[0] * BIG[1] * 4

    with bundle.read_in_order(rel) as read:
        layout = locate(read, 0, entry.size, whole)
        assert layout is not None and layout.nbytes == whole and layout.record == "data/0"
        assert locate(read, 0, entry.size, whole // 2) is None
        assert locate_head(read, 0, entry.size, whole) == layout  # S3's guess from the first bytes: the same
        assert locate_head(read, 0, entry.size, whole // 2) is None


def test_a_forged_directory_naming_a_huge_central_directory_is_not_read_into_memory(tmp_path):
    """The directory is read unchecked: one claiming a central directory as large as the file must not make
    the reader allocate it; the file is then simply read the common way."""
    import struct

    from rlckpt.dcp._direct import Pieces

    size = 1 << 40  # a 1 TiB file, of which the last 22 bytes are an end record naming a 1 TiB - 22 directory
    end_record = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, 0xFFFFFFFF, 0, 0)
    stream = Pieces(size, [(size - len(end_record), end_record)])
    stream.seek(0)
    with pytest.raises(OSError):
        stream.read(size - len(end_record))


# --- files of several tensors -------------------------------------------------------------------------------

NAMES = ("a", "b", "c")


def saved_together(url: str, options: dict | None) -> dict[str, torch.Tensor]:
    """Three 3 MiB tensors and a small one, which rlckpt's writer puts in one shard file (16 MiB at most)."""
    gen = torch.Generator().manual_seed(1)
    state = {name: torch.randn(*BIG, generator=gen) for name in NAMES} | {"bias": torch.arange(10.0)}
    dcp.save(state, storage_writer=BundleStorageWriter(url, step=1, storage_options=options), no_dist=True)
    return state


def file_of(url: str, options: dict | None, fqn: str) -> tuple[str, int]:
    """The relpath of the shard file holding `fqn`, and where its item starts in it."""
    bundle = BundleStore(url, options).open(1)
    metadata = pickle.loads(bundle.read_bytes("policy/.metadata"))
    (info,) = [info for index, info in metadata.storage_data.items() if index.fqn == fqn]
    return f"policy/{info.relative_path}", info.offset


def test_a_file_of_several_tensors_loads_each_into_its_own_tensor_without_a_buffer_of_the_file(store_location, pool):
    url, options = store_location
    state = saved_together(url, options)
    assert len({file_of(url, options, name)[0] for name in NAMES}) == 1  # the case under test: one file holds all three
    into = {name: torch.zeros(*BIG) for name in NAMES} | {"bias": torch.zeros(10)}
    places = {name: into[name].data_ptr() for name in NAMES}

    load(url, options, into)

    assert all(torch.equal(into[name], state[name]) for name in (*NAMES, "bias"))
    assert {name: into[name].data_ptr() for name in NAMES} == places
    assert pool.peak_lent <= 1 << 20  # no read buffer holds a tensor (let alone the 9 MiB file)


@pytest.mark.parametrize("name", NAMES)
def test_a_flipped_byte_in_any_tensor_of_a_file_read_into_place_fails_the_load_naming_the_file(
    store_location, pool, name
):
    url, options = store_location
    saved_together(url, options)
    rel, start = file_of(url, options, name)
    flip_bit(BundleStore(url, options), 1, rel, start + (2 << 20))

    with pytest.raises(dcp.CheckpointException) as excinfo:
        load(url, options, {n: torch.zeros(*BIG) for n in NAMES} | {"bias": torch.zeros(10)})

    assert any(f"{rel} has blake3:" in str(err) for err, _tb in excinfo.value.failures.values())


def test_the_items_of_a_file_a_rank_does_not_load_are_still_checked_with_it(store_location, pool):
    """A rank that loads one item of a file (another world size, a part of the state) reads past the others, but
    hashes them: a flipped byte in an item it skipped still fails its load."""
    url, options = store_location
    state = saved_together(url, options)
    only_b = {"b": torch.zeros(*BIG)}
    load(url, options, only_b)
    assert torch.equal(only_b["b"], state["b"])
    rel, start = file_of(url, options, "c")
    flip_bit(BundleStore(url, options), 1, rel, start + 100)

    with pytest.raises(dcp.CheckpointException) as excinfo:
        load(url, options, {"b": torch.zeros(*BIG)})

    assert any(f"{rel} has blake3:" in str(err) for err, _tb in excinfo.value.failures.values())


def test_a_file_whose_unplaced_items_would_exceed_the_read_ahead_is_read_the_common_way(store_location, monkeypatch):
    """What an in-order read holds in memory (the items it cannot place) is bounded like every read ahead: beyond
    READ_AHEAD_BYTES the file is fetched whole the common way (spooled to disk above IN_MEMORY_MAX)."""
    pool = BufferPool()
    monkeypatch.setattr(prefetch_module, "READ_BUFFERS", pool)
    monkeypatch.setattr(prefetch_module, "READ_AHEAD_BYTES", 1 << 20)
    url, options = store_location
    state = saved_together(url, options)
    strided = torch.zeros(BIG[1], BIG[0]).t()  # "a" cannot be placed: 3 MiB would go into memory
    into = {"a": strided, "b": torch.zeros(*BIG), "c": torch.zeros(*BIG), "bias": torch.zeros(10)}

    load(url, options, into)

    assert all(torch.equal(into[name], state[name]) for name in (*NAMES, "bias"))
    assert pool.peak_lent >= 9 << 20  # the whole file, in a read buffer


def test_on_s3_a_file_whose_items_cannot_be_located_past_the_read_ahead_is_read_again_the_common_way(
    s3_run_url, s3_storage_options, monkeypatch
):
    """On S3 an item is located only as the read reaches it: when none can be, what would go into memory passes
    READ_AHEAD_BYTES partway through the file; the read stops there, and the file is fetched whole the common way
    (what was placed before is loaded again)."""
    from rlckpt.dcp import _direct

    pool = BufferPool()
    monkeypatch.setattr(prefetch_module, "READ_BUFFERS", pool)
    monkeypatch.setattr(prefetch_module, "READ_AHEAD_BYTES", 4 << 20)
    monkeypatch.setattr(reader_module, "locate_head", lambda *_args: None)
    stopped: list[str] = []
    real_read_items = _direct.read_items

    def read_items(*args: Any, **kwargs: Any) -> None:
        try:
            real_read_items(*args, **kwargs)
        except _direct.InMemoryOverBudget as exc:
            stopped.append(str(exc))
            raise

    monkeypatch.setattr(reader_module, "read_items", read_items)
    state = saved_together(s3_run_url, s3_storage_options)
    into = {name: torch.zeros(*BIG) for name in NAMES} | {"bias": torch.zeros(10)}

    load(s3_run_url, s3_storage_options, into)

    assert len(stopped) == 1
    assert all(torch.equal(into[name], state[name]) for name in (*NAMES, "bias"))
    assert pool.peak_lent >= 9 << 20  # the whole file, in a read buffer
