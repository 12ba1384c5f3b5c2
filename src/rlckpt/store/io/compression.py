"""Per-file zstd: a streaming compressor for writers, and one bounded decompressor every reader uses.

A bundle file stored with zstd is exactly one frame that inflates to exactly the manifest's
`logical_size`. The decompressor feeds the frame in pieces small enough that no piece can inflate
far past that size, so an 8 KiB entry that would inflate to 256 MiB is refused after ~4 MiB.
"""

from __future__ import annotations

from collections.abc import Iterator

import zstandard

ZSTD = "zstd"
DEFAULT_LEVEL = 1  # level 3 never paid off in the measurements (docs/benchmarks.md)

# A zstd block inflates to at most BLOCK_MAX bytes and occupies at least 4 bytes of input (an RLE
# block: 3-byte header + 1 byte), so `n` input bytes complete at most n // 4 + 1 blocks.
BLOCK_MAX = zstandard.BLOCKSIZE_MAX
SLACK = 8 << 20  # how far past the logical size one piece of output may reach before it is refused
MIN_PIECE = 128


class DecompressionError(ValueError):
    """A stored zstd entry is not one frame inflating to its logical size (readers make it CorruptBundleError)."""


def check_compression(kind: str | None) -> str | None:
    """Return `kind` if it is a supported compression name (or None); raise ValueError otherwise."""
    if kind not in (None, ZSTD):
        raise ValueError(f"unknown compression {kind!r}; supported: None, 'zstd'")
    return kind


class StreamCompressor:
    """Feeds chunks through a zstd compressor (one frame per file) and returns the compressed bytes so far."""

    def __init__(self, level: int = DEFAULT_LEVEL) -> None:
        self._cobj = zstandard.ZstdCompressor(level=level, threads=-1).compressobj()

    def compress(self, chunk: bytes | memoryview) -> bytes:
        return self._cobj.compress(chunk)

    def flush(self) -> bytes:
        return self._cobj.flush()


class ExactDecompressor:
    """Inflate one zstd frame, in chunks, into exactly `logical_size` bytes; DecompressionError otherwise
    (not zstd, truncated, a second frame or trailing bytes, or more or fewer bytes than promised)."""

    def __init__(self, logical_size: int) -> None:
        self.logical_size = logical_size
        self.produced = 0
        self._dobj = zstandard.ZstdDecompressor().decompressobj()

    def feed(self, chunk: bytes | memoryview) -> Iterator[bytes]:
        """The logical bytes that `chunk` (the next stored bytes) completes."""
        view = memoryview(chunk).cast("B")
        pos = 0
        while pos < len(view):
            if self._dobj.eof:
                raise DecompressionError("has bytes after the end of its zstd frame (a second frame or trailing data)")
            allowance = self.logical_size + 1 - self.produced + SLACK
            piece = view[pos : pos + max(MIN_PIECE, allowance // BLOCK_MAX * 4)]
            pos += len(piece)
            try:
                out = self._dobj.decompress(piece)
            except zstandard.ZstdError as exc:
                raise DecompressionError(f"is not a valid zstd frame: {exc}") from None
            self.produced += len(out)
            if self.produced > self.logical_size:
                raise DecompressionError(f"inflates past the manifest's logical size of {self.logical_size} bytes")
            if self._dobj.eof and self._dobj.unused_data:
                raise DecompressionError("has bytes after the end of its zstd frame (a second frame or trailing data)")
            if out:
                yield out

    def finish(self) -> None:
        """Check that the frame ended and produced exactly the logical size."""
        if not self._dobj.eof:
            raise DecompressionError(f"ends inside its zstd frame (truncated after {self.produced} logical bytes)")
        if self.produced != self.logical_size:
            raise DecompressionError(f"decompresses to {self.produced} bytes, the manifest says {self.logical_size}")


def decompress_exact(data: bytes, logical_size: int) -> bytes:
    """A whole stored entry in memory -> its logical bytes (bounded; see ExactDecompressor)."""
    decoder = ExactDecompressor(logical_size)
    out = b"".join(decoder.feed(data))
    decoder.finish()
    return out
