"""DCP's own on-disk format, borrowed from `torch.distributed.checkpoint.filesystem` rather than re-implemented.

A bundle's `policy/` must stay loadable by plain `dcp.load(..., storage_reader=FileSystemReader(dir))`
(a user can leave rlckpt without converting), so shard names (`__{rank}_{n}.distcp`), the per-item
serialization (`torch.save` of each tensor, raw bytes for BYTE_IO items, appended to one file), the
`_StorageInfo(relative_path, offset, length)` records and the pickled `.metadata` are exactly what
DCP's FileSystemWriter produces: the code below calls DCP's own helpers to produce them.

Those helpers are private to torch. This module is the only place rlckpt touches them (each use is
marked), so a torch upgrade that moves one breaks here, and the format test (tests/dcp) says so.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

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
from torch.distributed.checkpoint.planner import SavePlanner, WriteItem
from torch.distributed.checkpoint.storage import WriteResult

METADATA_NAME: str = _metadata_fn  # ".metadata"
DEFAULT_PREFIX = "policy"  # where a bundle keeps the policy checkpoint (docs/architecture.md)

__all__ = ["DEFAULT_PREFIX", "METADATA_NAME", "metadata_bytes", "shard_name", "write_shards"]


def shard_name(rank_prefix: str, n: int) -> str:
    """`__{rank}_{n}.distcp`: `rank_prefix` is DCP's `_StoragePrefix.prefix` (`__{rank}_`)."""
    return f"{rank_prefix}{n}{DEFAULT_SUFFIX}"


class _CountingStream(io.RawIOBase):
    """What DCP's `_write_item` writes into: it asks `tell()` for each item's offset, which a stream that
    goes straight to storage (the participant's hashing writer) cannot answer by seeking. Counting the
    bytes written answers it; nothing is buffered or read back, so the digest is streamed once."""

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner
        self._pos = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = self._inner.write(data)
        self._pos += n
        return n

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:  # DCP's NoCloseWriter flushes after every item; the inner stream has no buffer
        pass

    def close(self) -> None:
        if not self.closed:
            super().close()
            self._inner.close()  # a clean close keeps the file (sha256 and size recorded)


OpenShard = Callable[[str], BinaryIO]


def write_shards(
    open_shard: OpenShard,
    rank_prefix: str,
    items: list[WriteItem],
    planner: SavePlanner,
    thread_count: int = 1,
    per_thread_copy_ahead: int = 10_000_000,
) -> tuple[list[str], list[WriteResult]]:
    """Write one rank's planned items into shard files opened by `open_shard(name)`, as DCP's
    FileSystemWriter does (single file per rank, or `thread_count` files split by size and type).

    `open_shard` returns a writable stream whose clean close keeps the file and whose `discard()`
    drops it. Unlike DCP's writer, a failure in any writing thread is raised here (DCP's own threads
    lose it); the files already closed are the caller's to remove.

    Returns:
        The shard names written and DCP's WriteResults (storage_data: `_StorageInfo(name, offset, length)`).
    """
    names = [shard_name(rank_prefix, n) for n in range(thread_count)]
    file_queue: queue.Queue[tuple[str, str, list[WriteItem]]] = queue.Queue()
    for name, bucket in zip(names, _split_by_size_and_type(thread_count, items), strict=True):
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
            _write_files_from_queue(  # private DCP helper, see the module docstring
                create_stream, file_queue, result_queue, planner, _StorageWriterTransforms(),
                per_thread_copy_ahead, False, thread_count, SerializationFormat.TORCH_SAVE,
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after every thread stopped
            failures.append(exc)
            with contextlib.suppress(queue.Empty):  # the other threads need not write what will be thrown away
                while True:
                    file_queue.get_nowait()

    threads = [threading.Thread(target=worker, name=f"rlckpt-dcp-write-{i}", daemon=True) for i in range(1, thread_count)]
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
    return names, results


def metadata_bytes(metadata: Metadata, results: Sequence[WriteResult], storage_meta: StorageMeta | None) -> bytes:
    """`.metadata` as DCP's FileSystemWriter.finish pickles it: the plan's Metadata with the version,
    every item's storage record, and the storage meta."""
    metadata.version = CURRENT_DCP_VERSION
    metadata.storage_data = {wr.index: wr.storage_data for wr in results}
    metadata.storage_meta = storage_meta
    return pickle.dumps(metadata)
