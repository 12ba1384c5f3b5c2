"""DCP's own on-disk format, borrowed from `torch.distributed.checkpoint.filesystem` rather than re-implemented.

A bundle's `policy/` must stay loadable by plain `dcp.load(..., storage_reader=FileSystemReader(dir))`
(a user can leave rlckpt without converting), so shard names (`__{rank}_{n}.distcp`), the per-item
serialization (`torch.save` of each tensor, raw bytes for BYTE_IO items, appended to a file), the
`_StorageInfo(relative_path, offset, length)` records and the pickled `.metadata` are exactly what
DCP's FileSystemWriter produces: the code below calls DCP's own helpers to produce them. Two choices
differ, and no reader depends on either: which items share a file (SMALL_ITEM_BYTES, DEFAULT_MAX_SHARD_BYTES),
and the zip CRC-32 of each item's records, which torch.save leaves zero here (NO_ZIP_CRC). An item's bytes are
otherwise those DCP writes with torch's CRC option off.

Those helpers are private to torch. This module is the only place rlckpt touches them (each use is
marked), so a torch upgrade that moves one breaks here, and the format test (tests/dcp) says so.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import math
import pickle
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, cast

import torch
from torch import _weights_only_unpickler  # torch.load's weights-only unpickler (see load_tensor_view)
from torch.distributed.checkpoint.filesystem import (  # private DCP format helpers, see the module docstring
    CURRENT_DCP_VERSION,
    DEFAULT_SUFFIX,
    SerializationFormat,
    _metadata_fn,
    _split_by_size_and_type,
    _StorageWriterTransforms,
    _write_files_from_queue,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.serialization import _load, _open_zipfile_reader  # private: torch.load's own steps (load_tensor_view)
from torch.utils.serialization import config as torch_serialization_config

from rlckpt.store import WRITE_BLOCK_SIZE, planes_for

METADATA_NAME: str = _metadata_fn  # ".metadata"
DEFAULT_PREFIX = "policy"  # where a bundle keeps the policy checkpoint (docs/architecture.md)

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "DEFAULT_PREFIX",
    "METADATA_NAME",
    "metadata_bytes",
    "shard_compression",
    "shard_name",
    "load_tensor_view",
    "shard_plan",
    "write_shards",
]


def shard_name(rank_prefix: str, n: int) -> str:
    """`__{rank}_{n}.distcp`: `rank_prefix` is DCP's `_StoragePrefix.prefix` (`__{rank}_`)."""
    return f"{rank_prefix}{n}{DEFAULT_SUFFIX}"


class _CountingStream(io.RawIOBase):
    """What DCP's `_write_item` writes into. It asks `tell()` for each item's offset, which a stream going
    straight to storage (the participant's hashing writer) cannot answer by seeking: counting the bytes
    answers it, and nothing is read back, so the digest is computed once, while streaming.

    torch.save writes a tensor as a dozen small pieces (zip headers, pickle) and one big one (the data);
    each write into the store costs a digest update and a guarded storage call, so small pieces are
    gathered into one buffer of up to COALESCE_BYTES and big ones pass straight through."""

    COALESCE_BYTES = 1 << 20

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner
        self._pos = 0
        self._pending = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if len(self._pending) + n <= self.COALESCE_BYTES:
            self._pending += view
        else:
            self._drain()
            if n < self.COALESCE_BYTES:
                self._pending += view
            else:
                self._inner.write(view)
        self._pos += n
        return n

    def _drain(self) -> None:
        if self._pending:
            self._inner.write(self._pending)
            self._pending = bytearray()

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        """DCP's NoCloseWriter flushes after every item; the buffer is written out on close."""

    def close(self) -> None:
        if not self.closed:
            self._drain()
            super().close()
            self._inner.close()  # a clean close keeps the file (sha256 and size recorded)


OpenShard = Callable[[str], BinaryIO]


# Items up to this size (and every bytes item) go to a rank's last, small shard file. DCP writes each
# replicated item (AdamW's `step` counters, `param_groups`) once, into some rank's files, and every rank
# needs it on load; a reader must fetch and digest a whole file before it may use a byte of it, so a
# rank should not have to fetch another rank's whole shard for a few hundred bytes.
SMALL_ITEM_BYTES = 64 << 10

# With reuse on, a tensor chunk of at least this many bytes is a file of its own (shard_plan's `for_reuse`).
OWN_FILE_BYTES = 1 << 20

# torch.save's framing of one item (zip headers, pickle, records padded to 64 bytes): ~1.5 KiB measured,
# counted generously so that a file's real size stays under its cap.
ITEM_FRAMING_BYTES = 4 << 10

# A shard file is at most this many bytes, framing included, unless one item alone is larger (it then gets a
# file of its own). A reader fetches and digest-checks each file whole before torch reads it, so smaller files
# let the next file's fetch and digest overlap loading the current one and keep the reader's buffers to a few
# files. Within the store's S3 write block a file also goes out as one PUT rather than a multipart upload
# (create, parts, complete: three requests more), and the files of a rank upload in parallel.
DEFAULT_MAX_SHARD_BYTES = WRITE_BLOCK_SIZE - (64 << 10)


# torch.save's zip CRC-32 is left out of the shard files. It costs 0.24 s of CPU per GiB (about 4 GB/s here) on
# the thread writing the shard, on cores a trainer rank shares with everything else, and nobody reads it: torch
# builds its zip reader with CRC checks off (a tensor with a flipped byte loads), and rlckpt checks each file's
# BLAKE3 digest before any reader sees a byte of it. torch's setting is a per-thread override (a ContextVar):
# patched in the writing threads only, for the length of the write, a torch.save elsewhere keeps its CRC.
NO_ZIP_CRC = {"save.compute_crc32": False}
_TORCH_SAVE_CONFIG: Any = torch_serialization_config  # torch installs its patch() at import: mypy cannot see it


def _chunk_bytes(wi: WriteItem) -> int:
    """The tensor bytes an item puts in its file: its chunk's, this rank's shard of the tensor (0 for a bytes
    item). DCP's own `_item_size` counts the whole tensor, so with it a tensor sharded over 4 ranks weighed 4
    times its bytes here, and each 16 MiB file held a single quarter-full item (25 files per rank, not 6)."""
    if wi.type == WriteItemType.BYTE_IO or wi.tensor_data is None:
        return 0
    return math.prod(wi.tensor_data.chunk.sizes) * wi.tensor_data.properties.dtype.itemsize


def shard_compression(items: Sequence[WriteItem]) -> str:
    """How a shard file of `items` is compressed when its rank compresses: byte planes of the element width
    that holds most of its bytes (2 for bf16, 4 for fp32, ...), plain zstd for a file of bytes items."""
    weights: dict[int, int] = {}
    for wi in items:
        if wi.tensor_data is not None:
            width = wi.tensor_data.properties.dtype.itemsize
            weights[width] = weights.get(width, 0) + _chunk_bytes(wi)
    return planes_for(max(weights, key=lambda w: weights[w]) if weights else 1)


def _cost(wi: WriteItem) -> int:
    """What an item adds to its file: its bytes and torch.save's framing."""
    return _chunk_bytes(wi) + ITEM_FRAMING_BYTES


def _pack(items: list[WriteItem], files: int, cap: int) -> list[list[WriteItem]]:
    """Items into at least `files` files of at most `cap` bytes each (framing counted): the largest first,
    each into the least-filled file, or into a new file when even that one has no room for it (then none
    has). An item larger than `cap` gets a file of its own. Balanced like DCP's split, but capped."""
    heap: list[tuple[int, int]] = [(0, i) for i in range(files)]
    buckets: list[list[WriteItem]] = [[] for _ in range(files)]
    for wi in sorted(items, key=_cost, reverse=True):
        load, i = heap[0]
        if load and load + _cost(wi) > cap:
            i = len(buckets)
            buckets.append([])
            heapq.heappush(heap, (_cost(wi), i))
        else:
            heapq.heapreplace(heap, (load + _cost(wi), i))
        buckets[i].append(wi)
    return [b for b in buckets if b]


def shard_plan(
    rank_prefix: str,
    items: list[WriteItem],
    thread_count: int = 1,
    max_shard_bytes: int | None = DEFAULT_MAX_SHARD_BYTES,
    for_reuse: bool = False,
) -> list[tuple[str, list[WriteItem]]]:
    """How one rank's items go into files, named as DCP names them (`__{rank}_{n}.distcp`).

    The tensors above SMALL_ITEM_BYTES go into at least `thread_count` files, balanced by size, none above
    `max_shard_bytes` with its framing (an item larger than that gets a file of its own); then the small items
    get files of their own, capped the same way. None: DCP's own split (`thread_count` files, uncapped). No
    empty files. `for_reuse`: each tensor of at least OWN_FILE_BYTES gets a file of its own, in the plan's
    order, so that a tensor that did not change is a file that did not change (store reuse, io/reuse.py); the
    rest are packed as above after them.
    """

    def small(wi: WriteItem) -> bool:
        return wi.type == WriteItemType.BYTE_IO or _chunk_bytes(wi) <= SMALL_ITEM_BYTES

    own: list[list[WriteItem]] = []
    if for_reuse:
        own = [[wi] for wi in items if not small(wi) and _chunk_bytes(wi) >= OWN_FILE_BYTES]
        items = [wi for wi in items if small(wi) or _chunk_bytes(wi) < OWN_FILE_BYTES]
    bulk = [wi for wi in items if not small(wi)]
    rest = [wi for wi in items if small(wi)]
    if own:
        cap = max_shard_bytes or DEFAULT_MAX_SHARD_BYTES
        buckets = own + _pack(bulk, 1, cap) + _pack(rest, 1, cap)
    elif max_shard_bytes is None:
        buckets = [b for b in _split_by_size_and_type(thread_count, bulk) if b] if bulk else []  # private DCP helper
        buckets += [rest] if rest else []
    else:
        buckets = _pack(bulk, thread_count, max_shard_bytes) + _pack(rest, 1, max_shard_bytes)
    return [(shard_name(rank_prefix, n), bucket) for n, bucket in enumerate(buckets)]


def write_shards(
    open_shard: OpenShard,
    files: list[tuple[str, list[WriteItem]]],
    planner: SavePlanner,
    thread_count: int = 1,
    per_thread_copy_ahead: int = 10_000_000,
) -> list[WriteResult]:
    """Write `files` (from shard_plan) through streams opened by `open_shard(name)`, item by item as
    DCP's FileSystemWriter does, in up to `thread_count` threads.

    `open_shard` returns a writable stream whose clean close keeps the file and whose `discard()`
    drops it. Unlike DCP's writer, a failure in any writing thread is raised here (DCP's own threads
    lose it); the files already closed are the caller's to remove.

    Returns:
        DCP's WriteResults (storage_data: `_StorageInfo(name, offset, length)`).
    """
    file_queue: queue.Queue[tuple[str, str, list[WriteItem]]] = queue.Queue()
    for name, bucket in files:
        file_queue.put((name, name, bucket))  # (path for create_stream, storage key = name relative to the prefix)
    result_queue: queue.Queue[list[WriteResult]] = queue.Queue()
    failures: list[BaseException] = []

    @contextlib.contextmanager
    def create_stream(name: str, mode: str) -> Iterator[io.IOBase]:
        if mode != "wb":
            raise ValueError(f"shard streams are write-only, got mode {mode!r}")
        raw = open_shard(name)
        try:
            yield _CountingStream(raw)
        except BaseException:
            raw.discard()  # type: ignore[attr-defined]  # never keep a half-written shard
            raise
        raw.close()  # DCP closes it already; a second close is a no-op

    def worker() -> None:
        try:
            # DCP's own per-file loop (item order, tensor resolution, torch.save per item). use_fsync is
            # off: without a fileno() it would fall back to a machine-wide os.sync(); the store fsyncs
            # each file itself on local disk when it is closed.
            with _TORCH_SAVE_CONFIG.patch(NO_ZIP_CRC):
                _write_files_from_queue(  # private DCP helper, see the module docstring
                    create_stream,
                    file_queue,
                    result_queue,
                    planner,
                    _StorageWriterTransforms(),
                    per_thread_copy_ahead,
                    False,
                    thread_count,
                    SerializationFormat.TORCH_SAVE,
                )
        except BaseException as exc:
            failures.append(exc)
            with contextlib.suppress(queue.Empty):  # the other threads need not write what will be thrown away
                while True:
                    file_queue.get_nowait()

    workers = min(thread_count, len(files))
    threads = [threading.Thread(target=worker, name=f"rlckpt-dcp-write-{i}", daemon=True) for i in range(1, workers)]
    for thread in threads:
        thread.start()
    worker()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    results: list[WriteResult] = []
    while not result_queue.empty():
        results.extend(result_queue.get_nowait())
    return results


class SeekableStream(io.RawIOBase):
    """A seekable read-only stream over `size` bytes: its position and seeks. A subclass serves the reads."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


class ViewStream(SeekableStream):
    """A seekable read-only stream over a memoryview, for torch's zip reader (which reads the archive's
    directory and small records through it) and for a shard file's checked bytes (reader.py)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__(len(view))
        self._view = view

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), self._size - self._pos))
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        data = bytes(self._view[self._pos : max(self._pos, end)])
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)


def load_tensor_view(item: memoryview) -> torch.Tensor:
    """One tensor item (DCP writes each as a torch.save archive) loaded as `torch.load(weights_only=True)`
    loads it, by torch's own loader and weights-only unpickler, but with the tensor's storage viewing `item`
    instead of a copy of it, as `torch.load(mmap=True)` views a file: `item` is passed as the archive's
    overall storage. The tensor is valid only while `item` is (the caller copies it into place at once).
    A storage the archive places outside `item` is cut at its end, and torch then refuses the tensor."""
    storage = torch.frombuffer(item, dtype=torch.uint8).untyped_storage()
    stream = cast(BinaryIO, ViewStream(item))
    with _open_zipfile_reader(stream) as archive:  # private torch.serialization helper
        tensor = _load(archive, "cpu", _weights_only_unpickler, overall_storage=storage, encoding="utf-8")
    return cast(torch.Tensor, tensor)


def metadata_bytes(metadata: Metadata, results: Sequence[WriteResult], storage_meta: StorageMeta | None) -> bytes:
    """`.metadata` as DCP's FileSystemWriter.finish pickles it: the plan's Metadata with the version,
    every item's storage record, and the storage meta."""
    metadata.version = CURRENT_DCP_VERSION
    metadata.storage_data = {wr.index: wr.storage_data for wr in results}
    metadata.storage_meta = storage_meta
    return pickle.dumps(metadata)
