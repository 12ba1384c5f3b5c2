"""Reuse of unchanged files: a save may take a file from the run's previous committed bundle (its base) instead
of writing it again, when the bytes it was about to store are the base's file (same path, size, digest,
logical size and compression). The storage shares or copies the file (Backend.reuse_file: a hard link on local
disk, a server-side copy on S3), so every bundle stays whole on its own: reading, verifying, copying,
replicating, deleting and gc treat a reused file as any other (docs/store-protocol.md#reuse-of-unchanged-files).

Whether a file is unchanged is known only once its bytes are hashed, so a file that may be reused is held in
memory (a Spool) until it is closed, up to SPOOL_LIMIT bytes: past that it goes to storage as any file."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlckpt.store.records.manifest import FileEntry

# A file that may be reused is held in memory up to this many bytes; a larger one is written as it comes.
SPOOL_LIMIT = 256 << 20


@dataclass(frozen=True)
class ReuseBase:
    """The committed bundle a save may take unchanged files from: its step, txid and file entries."""

    step: int
    txid: str
    files: Mapping[str, FileEntry]

    def describe(self) -> str:
        return f"step {self.step} (txid {self.txid})"


class Spool:
    """Where a file that may be reused is written first: its stored bytes kept in memory until the file is
    closed, when the writer either reuses the base's file or writes these bytes (`take_real`). Past `limit`
    bytes, or once asked, the real file is opened with `open_real` and everything goes there."""

    def __init__(self, open_real: Callable[[], Any], limit: int | None = None) -> None:
        self._open_real = open_real
        self._limit = SPOOL_LIMIT if limit is None else limit
        self._held: bytearray | None = bytearray()
        self.real: Any = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self._held is not None and len(self._held) + len(view) <= self._limit:
            self._held += view
            return len(view)
        self.take_real().write(view)
        return len(view)

    @property
    def spilled(self) -> bool:
        """Whether the bytes went to the real file (too many to hold, or asked to): nothing left to reuse."""
        return self._held is None

    def take_real(self) -> Any:
        """The real file, opened now if it was not, with every held byte written into it."""
        if self._held is not None:
            held, self._held = self._held, None
            self.real = self._open_real()
            if held:
                self.real.write(held)
        return self.real

    def drop(self) -> None:
        """Forget the held bytes (the file is reused, or discarded before it reached storage)."""
        self._held = None


def unchanged(entry: FileEntry, base: Mapping[str, FileEntry], relpath: str) -> bool:
    """Whether `entry`, just written as `relpath`, stores exactly the base's file of that path."""
    return base.get(relpath) == entry
