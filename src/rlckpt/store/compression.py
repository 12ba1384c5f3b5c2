"""Per-file zstd compression: a streaming compressor for writers and whole/streaming decompression for readers."""

from __future__ import annotations

from typing import BinaryIO

import zstandard

ZSTD = "zstd"
DEFAULT_LEVEL = 1  # level 3 never paid off in the measurements (shared/notes/s3.md)


def check_compression(kind: str | None) -> str | None:
    """Return `kind` if it is a supported compression name (or None); raise ValueError otherwise."""
    if kind not in (None, ZSTD):
        raise ValueError(f"unknown compression {kind!r}; supported: None, 'zstd'")
    return kind


class StreamCompressor:
    """Feeds chunks through a zstd compressor and returns the compressed bytes produced so far."""

    def __init__(self, level: int = DEFAULT_LEVEL) -> None:
        self._cobj = zstandard.ZstdCompressor(level=level, threads=-1).compressobj()

    def compress(self, chunk: bytes | memoryview) -> bytes:
        return self._cobj.compress(chunk)

    def flush(self) -> bytes:
        return self._cobj.flush()


def decompress_bytes(data: bytes) -> bytes:
    """Decompress a whole zstd frame (works whether or not the frame records its content size)."""
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def copy_decompressed(src: BinaryIO, dst: BinaryIO, chunk_size: int = 8 << 20) -> int:
    """Stream-decompress `src` into `dst`; return the number of logical bytes written."""
    reader = zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True)
    total = 0
    while True:
        chunk = reader.read(chunk_size)
        if not chunk:
            return total
        dst.write(chunk)
        total += len(chunk)
