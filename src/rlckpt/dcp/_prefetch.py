"""The shard files one rank's load needs, fetched a few ahead of DCP's read loop and digest-checked before
their bytes are handed out: into pooled buffers, inflated in memory, or spooled to disk (see Prefetch)."""

from __future__ import annotations

import functools
import io
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from rlckpt.errors import CorruptBundleError
from rlckpt.store import READ_BUFFERS, Bundle, FileEntry

from ._direct import FileItem
from ._format import ViewStream

# A shard file up to this size, or holding a single item, is read into memory (a reused buffer, hashed as it
# lands, no disk copy); a larger one is copied to the spool dir and checked there. rlckpt's writer keeps its
# files far below it (DEFAULT_MAX_SHARD_BYTES) unless one item is larger; files of another writer may be of
# any size.
IN_MEMORY_MAX = 64 << 20

# Checked files a rank's load holds in memory at once, fetched ahead of the one being loaded: a few of
# rlckpt's shard files (at most 16 MiB each), enough to keep the next file's fetch and digest beside loading
# the current one. A single file larger than this is held alone.
READ_AHEAD_BYTES = 48 << 20


class BufferStream(ViewStream):
    """A read-only, seekable stream over checked bytes in a pooled buffer (torch reads it with readinto:
    one copy, into the tensor's storage). Closing it gives the buffer back to the pool."""

    def __init__(self, view: memoryview, release: Callable[[], None]) -> None:
        super().__init__(view)
        self._release = release

    @property
    def view(self) -> memoryview:
        """The checked bytes themselves (valid until the stream is closed)."""
        return self._view

    def close(self) -> None:
        if not self.closed:
            self._view.release()
            self._release()
        super().close()


class Prefetch:
    """The shard files one rank's load plan needs, in the order the read loop will want them, fetched ahead by
    `workers` threads while what they hold stays within `budget` bytes (READ_AHEAD_BYTES): a file is started
    only if it fits beside the files fetched and not yet closed by the loop (the one being loaded included),
    or when none is held (so a file larger than the budget is read alone). Memory is bounded by the budget, or
    by one such file, whatever the number and size of the files.

    Every fetch is digest-checked before its bytes are handed out. An uncompressed file up to IN_MEMORY_MAX,
    or one that holds a single item (what DCP's own load allocates for that item anyway), is read into a
    buffer of the process's READ_BUFFERS pool (reused from load to load, so its pages are faulted in once) and
    hashed as it lands; a compressed one by `Bundle.read_bytes`; a larger one by `Bundle.get_file` into a
    private spool dir. A file given a job in `in_order` is fetched by that job instead, once (its result comes
    back as a `ReadInOrder`, holding what the job said it would cost); a second fetch of it is the common one.
    Fetching and hashing the next files (on other cores) overlaps loading the current one."""

    def __init__(
        self,
        bundle: Bundle,
        relpaths: list[str],
        workers: int,
        spool_dir: str | None,
        single_item: frozenset[str] = frozenset(),
        budget: int | None = None,
        in_order: dict[str, InOrderJob] | None = None,
    ) -> None:
        self.bundle = bundle
        self.spool_dir = spool_dir
        self._jobs = dict(in_order or {})
        self.budget = READ_AHEAD_BYTES if budget is None else budget
        self._single_item = single_item
        self._dir: str | None = None
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, min(workers, len(relpaths) or 1)), thread_name_prefix="rlckpt-dcp-fetch"
        )
        self._order = list(relpaths)
        self._next = 0
        self._futures: dict[str, Future[io.IOBase]] = {}
        self._held = 0  # bytes of the files fetched (or being fetched) into memory and not closed yet
        self.peak_held = 0  # the most ever held at once (tests read the bound off it)
        self._lock = threading.Lock()
        self._closed = False
        self._ahead()

    def _entry(self, relpath: str) -> FileEntry:
        try:
            return self.bundle.manifest.files[relpath]
        except KeyError:
            raise CorruptBundleError(
                f"step {self.bundle.step} at {self.bundle.url}: its DCP metadata names {relpath}, "
                "which the bundle does not hold"
            ) from None

    def _in_memory(self, entry: FileEntry, relpath: str) -> bool:
        return entry.compression is None and (entry.size <= IN_MEMORY_MAX or relpath in self._single_item)

    def _cost(self, relpath: str) -> int:
        """The memory a fetch of `relpath` holds until its stream is closed (a spooled file holds disk)."""
        if relpath in self._jobs:
            return self._jobs[relpath].cost
        entry = self.bundle.manifest.files.get(relpath)
        if entry is None:
            return 0
        if self._in_memory(entry, relpath):
            return entry.size
        return entry.logical_size if entry.logical_size <= IN_MEMORY_MAX else 0

    def _ahead(self) -> None:
        with self._lock:
            while self._next < len(self._order) and not self._closed:
                rel = self._order[self._next]
                cost = self._cost(rel)
                if self._held and self._held + cost > self.budget:
                    return  # wait until the loop closes a file
                self._next += 1
                if rel not in self._futures:
                    self._start(rel, cost)

    def _start(self, relpath: str, cost: int) -> None:
        """Begin fetching `relpath`, counting `cost` as held until its stream closes (the caller holds the lock)."""
        self._held += cost
        self.peak_held = max(self.peak_held, self._held)
        self._futures[relpath] = self._pool.submit(self._fetch, relpath, cost)

    def _released(self, cost: int) -> None:
        with self._lock:
            self._held -= cost
        self._ahead()

    def _fetch(self, relpath: str, cost: int) -> io.IOBase:
        try:
            return self._fetch_checked(relpath, functools.partial(self._released, cost))
        except BaseException:
            self._released(cost)
            raise

    def _fetch_checked(self, relpath: str, on_close: Callable[[], None]) -> io.IOBase:
        with self._lock:
            job = self._jobs.pop(relpath, None)
        if job is not None:
            return ReadInOrder(job.run(), on_close)
        entry = self._entry(relpath)
        if self._in_memory(entry, relpath):
            buffer = READ_BUFFERS.take(entry.size + 1)
            try:
                view = self.bundle.read_into(relpath, buffer)
            except BaseException:
                READ_BUFFERS.give(buffer)
                raise
            return BufferStream(view, _both(functools.partial(READ_BUFFERS.give, buffer), on_close))
        if entry.logical_size <= IN_MEMORY_MAX:
            return _ClosingBytes(self.bundle.read_bytes(relpath), on_close)
        with self._lock:
            if self._dir is None:
                self._dir = tempfile.mkdtemp(prefix="rlckpt-dcp-load-", dir=self.spool_dir)
        local = os.path.join(self._dir, *relpath.split("/"))  # relpath is a manifest entry: a safe relative path
        self.bundle.get_file(relpath, local)
        stream = open(local, "rb")  # noqa: SIM115 - handed to the read loop, closed there
        os.remove(local)  # the open stream keeps the checked copy until it is closed
        on_close()  # on disk: it holds no memory
        return stream

    def take(self, relpath: str) -> io.IOBase:
        """The checked contents of `relpath` as a readable, seekable stream (waits for its fetch). Close it
        as soon as it is read: the files after it are fetched as closed ones make room."""
        with self._lock:
            future = self._futures.get(relpath)
            if future is None:  # not in the plan's order (the loop asked for another file): fetch it now
                self._start(relpath, self._cost(relpath))
                future = self._futures[relpath]
        try:
            return future.result()
        finally:
            with self._lock:
                self._futures.pop(relpath, None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pending = list(self._futures.values())
            self._futures.clear()
        for future in pending:
            future.cancel()
        self._pool.shutdown(wait=True)
        for future in pending:  # fetched but never read: close what was opened
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result().close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


@dataclass(frozen=True)
class InOrderJob:
    """How the prefetch reads one file in order (_direct.py): `run()` gives its items read and checked, or None
    when the file is to be read the common way; `cost` is the memory they hold until the loop is done with them."""

    run: Callable[[], list[tuple[int, FileItem]] | None]
    cost: int


class ReadInOrder(io.IOBase):
    """What an in-order job gave (`items`: request index and item, in file order; None: read the file the common
    way), handed to the read loop as the prefetch hands every file; `on_close` runs once it is closed."""

    def __init__(self, items: list[tuple[int, FileItem]] | None, on_close: Callable[[], None]) -> None:
        super().__init__()
        self.items = items
        self._on_close: Callable[[], None] | None = on_close

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        self.items = None
        super().close()
        if on_close is not None:
            on_close()


def _both(first: Callable[[], object], second: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            first()
        finally:
            second()

    return run


class _ClosingBytes(io.BytesIO):
    """Checked, inflated bytes in memory; `on_close` runs once when the read loop closes them."""

    def __init__(self, data: bytes, on_close: Callable[[], None]) -> None:
        super().__init__(data)
        self._on_close: Callable[[], None] | None = on_close

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        super().close()
        if on_close is not None:
            on_close()
