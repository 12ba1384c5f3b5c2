"""HashingWriter: a writable binary stream that hashes (and optionally compresses) bytes while passing them
to storage, so a file's digest costs no second pass over its bytes. Asked to compress only where it pays,
it holds back the file's first TRIAL_BYTES, compresses them, and stores the file raw if they did not shrink
to PAYS of their size (random bytes, already compressed data)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from rlckpt.store.io.compression import PAYS, TRIAL_BYTES, StreamCompressor
from rlckpt.store.io.digest import WRITE_ALGORITHM, Digest, new_hasher
from rlckpt.store.records.manifest import FileEntry


class HashingWriter(io.RawIOBase):
    """Write-only stream: logical bytes in, (compressed) stored bytes out to `raw`, digest of the stored bytes
    kept (WRITE_ALGORITHM).

    `on_close(entry, ok)` is called once: with the FileEntry on a clean close, or with None after
    `discard()` / an error, so the owner can commit or discard the underlying storage file. `guard(what)`
    wraps every write to storage (the owner turns storage failures into its own errors there). With
    `only_if_pays`, `compression` is tried on the file's start first (the entry says what was kept).
    """

    def __init__(
        self,
        raw: Any,
        relpath: str,
        on_close: Callable[[HashingWriter, FileEntry | None], None],
        compression: str | None = None,
        level: int = 1,
        guard: Callable[[str], AbstractContextManager[Any]] = lambda _what: contextlib.nullcontext(),
        only_if_pays: bool = False,
    ) -> None:
        super().__init__()
        self.raw = raw
        self._guard = guard
        self.relpath = relpath
        self._on_close = on_close
        self._compression = compression
        self._compressor = StreamCompressor(compression, level) if compression else None
        self._trial: bytearray | None = bytearray() if compression and only_if_pays else None
        self._algorithm = WRITE_ALGORITHM
        self._hash = new_hasher(self._algorithm)
        self._stored = 0
        self._logical = 0
        self._failed = False
        self._finished = False
        self.entry: FileEntry | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._finished:
            raise ValueError(f"write to closed bundle file {self.relpath!r}")
        view = memoryview(data).cast("B")
        try:
            self._logical += len(view)
            rest = view
            if self._trial is not None:  # held back until TRIAL_BYTES are in, then the rest goes as decided
                take = TRIAL_BYTES - len(self._trial)
                self._trial += rest[:take]
                rest = rest[take:]
                if len(self._trial) < TRIAL_BYTES:
                    return len(view)
                self._decide(final=False)
            if len(rest):
                self._emit(self._compressor.compress(rest) if self._compressor else rest)
        except BaseException:
            self._failed = True
            raise
        return len(view)

    def _decide(self, final: bool) -> None:
        """Compress the held-back start (the whole file when `final`); keep it compressed if that paid,
        else store the file raw from here on."""
        assert self._trial is not None and self._compressor is not None
        trial, self._trial = memoryview(self._trial), None
        compressor = self._compressor
        out = compressor.compress(trial) + (compressor.flush() if final else compressor.flush_block())
        if len(out) <= PAYS * len(trial):
            self._emit(out)
            if final:
                self._compressor = None  # its frame is complete
            return
        self._compressor, self._compression = None, None
        self._emit(trial)

    def _emit(self, out: bytes | memoryview) -> None:
        if len(out):
            self._hash.update(out)  # while the bytes are in cache, just before they go to storage
            with self._guard(f"writing {self.relpath}"):
                self.raw.write(out)
            self._stored += len(out)

    def discard(self) -> None:
        """Drop what was written: the file will not be part of the bundle."""
        if not self._finished:
            self._failed = True
            self.close()

    def close(self) -> None:
        if self._finished:
            return
        self._finished = True
        entry: FileEntry | None = None
        try:
            if not self._failed:
                if self._trial is not None:
                    self._decide(final=True)
                if self._compressor:
                    self._emit(self._compressor.flush())
                entry = FileEntry(
                    size=self._stored,
                    digest=Digest.of_hasher(self._algorithm, self._hash),
                    logical_size=self._logical,
                    compression=self._compression,
                )
        finally:
            super().close()
            self.entry = entry
            self._on_close(self, entry)

    def __del__(self) -> None:  # an abandoned writer must never publish its file
        if not self._finished:
            self._failed = True
            try:
                self.close()
            except Exception:
                pass

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.discard()
        else:
            self.close()
