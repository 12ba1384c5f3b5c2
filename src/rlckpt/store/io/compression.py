"""Per-file zstd: streaming compressors for writers, and one bounded decompressor every reader uses.

A bundle file stored compressed is exactly one zstd frame that inflates to exactly the manifest's
`logical_size`. The decompressor feeds the frame in pieces small enough that no piece can inflate
far past that size, so an 8 KiB entry that would inflate to 256 MiB is refused after ~4 MiB.

`zstd-planes<W>` (manifest format 3) is zstd over the file's bytes regrouped into byte planes: the file
is cut into PLANE_BLOCK-sized blocks, and each block's W-byte elements are stored as W planes (byte 0 of
every element, then byte 1, ...), its last `len % W` bytes as they are. A float's sign and exponent share
one byte, which takes few values in trained weights and optimizer state, so that plane compresses well;
the mantissa planes are stored nearly raw. Regrouping moves bytes only: the round trip gives back every bit.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import zstandard

ZSTD = "zstd"
PLANES = {"zstd-planes2": 2, "zstd-planes4": 4, "zstd-planes8": 8}  # name -> element width in bytes
COMPRESSIONS = (ZSTD, *PLANES)  # every compression a manifest may name, oldest first
DEFAULT_LEVEL = 1  # level 3 never paid off in the measurements (docs/benchmarks.md)
PLANE_BLOCK = 1 << 20  # the unit a file's bytes are regrouped in (part of the stored format: never change it)
# zstd's match finder for byte planes: a 128 KiB window, a small hash table and 7-byte matches at least. An
# exponent plane is a few symbols repeated: level 1's own settings took it at ~250 MB/s to 0.37 of its size,
# these at ~600 MB/s to 0.34 (a decoder then holds 128 KiB of window, not 512 KiB or more).
PLANE_PARAMS = {"window_log": 17, "hash_log": 6, "min_match": 7}
ONE_SHOT_MAX = 64 << 20  # a whole entry up to this logical size is inflated in one call (decompress_exact)

# A writer that compresses only where it pays tries the file's first TRIAL_BYTES (or the whole file, if
# smaller) and keeps compression if they shrank to PAYS of their size or less; else the file is stored raw.
TRIAL_BYTES = PLANE_BLOCK
PAYS = 0.95

# A zstd block inflates to at most BLOCK_MAX bytes and occupies at least 4 bytes of input (an RLE
# block: 3-byte header + 1 byte), so `n` input bytes complete at most n // 4 + 1 blocks.
BLOCK_MAX = zstandard.BLOCKSIZE_MAX
SLACK = 8 << 20  # how far past the logical size one piece of output may reach before it is refused
MIN_PIECE = 128


class DecompressionError(ValueError):
    """A stored zstd entry is not one frame inflating to its logical size (readers make it CorruptBundleError)."""


def check_compression(kind: str | None) -> str | None:
    """Return `kind` if it is a supported compression name (or None); raise ValueError otherwise."""
    if kind is not None and kind not in COMPRESSIONS:
        raise ValueError(f"unknown compression {kind!r}; supported: None, {', '.join(map(repr, COMPRESSIONS))}")
    return kind


def planes_for(width: int) -> str:
    """The compression for elements of `width` bytes: byte planes for 2, 4 and 8, plain zstd otherwise."""
    return next((name for name, w in PLANES.items() if w == width), ZSTD)


def split_planes(block: bytes | memoryview, width: int) -> bytes:
    """One block's bytes regrouped into `width` planes (its last ``len % width`` bytes kept in place)."""
    data = np.frombuffer(block, dtype=np.uint8)
    body = len(data) // width * width
    planes = data[:body].reshape(-1, width).T.tobytes()  # C order of the transpose: plane after plane
    return planes + data[body:].tobytes()


def join_planes(data: bytes | bytearray | memoryview, width: int) -> bytearray:
    """The inverse of split_planes: one block's planes back into its elements. A bytearray's strided slice
    assignment does this at ~1 GB/s; numpy's transpose in this direction (short inner loops) at a third of it."""
    n = len(data) // width
    out = bytearray(len(data))
    for k in range(width):
        out[k : n * width : width] = data[k * n : (k + 1) * n]
    out[n * width :] = data[n * width :]
    return out


def _join_all_planes(data: bytes, width: int) -> bytes:
    """A whole file's logical bytes from its decompressed planes, block by block (split_planes' blocks)."""
    if len(data) <= PLANE_BLOCK:
        return bytes(join_planes(data, width))
    view = memoryview(data)
    return b"".join([join_planes(view[i : i + PLANE_BLOCK], width) for i in range(0, len(view), PLANE_BLOCK)])


class _Blocks:
    """Re-cuts a stream of chunks into PLANE_BLOCK-sized blocks (the last one shorter), as bytes."""

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, chunk: bytes | memoryview) -> Iterator[bytes]:
        view = memoryview(chunk).cast("B")
        if self._pending:
            take = min(len(view), PLANE_BLOCK - len(self._pending))
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) < PLANE_BLOCK:
                return
            yield bytes(self._pending)
            self._pending = bytearray()
        while len(view) >= PLANE_BLOCK:
            yield view[:PLANE_BLOCK].tobytes()
            view = view[PLANE_BLOCK:]
        self._pending += view

    def tail(self) -> bytes:
        tail, self._pending = bytes(self._pending), bytearray()
        return tail


class StreamCompressor:
    """Feeds chunks through a zstd compressor (one frame per file), regrouped into byte planes first for
    a `zstd-planes<W>` kind, and returns the compressed bytes so far."""

    def __init__(self, kind: str = ZSTD, level: int = DEFAULT_LEVEL) -> None:
        check_compression(kind)
        self._width = PLANES.get(kind, 0)
        self._blocks = _Blocks() if self._width else None
        tuning = PLANE_PARAMS if self._width else {}
        params = zstandard.ZstdCompressionParameters.from_level(level, threads=-1, **tuning)
        self._cobj = zstandard.ZstdCompressor(compression_params=params).compressobj()

    def compress(self, chunk: bytes | memoryview) -> bytes:
        if self._blocks is None:
            return self._cobj.compress(chunk)
        return b"".join([self._cobj.compress(split_planes(b, self._width)) for b in self._blocks.feed(chunk)])

    def flush_block(self) -> bytes:
        """What the bytes so far compress to, out now (the frame goes on): a writer's trial of a file's start."""
        return self._cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)

    def flush(self) -> bytes:
        """The end of the frame (the last, shorter block of planes first)."""
        head = b""
        if self._blocks is not None:
            tail = self._blocks.tail()
            head = self._cobj.compress(split_planes(tail, self._width)) if tail else b""
        return head + self._cobj.flush()


class ExactDecompressor:
    """Inflate one zstd frame, in chunks, into exactly `logical_size` bytes; DecompressionError otherwise
    (not zstd, truncated, a second frame or trailing bytes, or more or fewer bytes than promised). A
    `zstd-planes<W>` frame's blocks are put back into elements as they complete (`finish` gives the last)."""

    def __init__(self, logical_size: int, kind: str = ZSTD) -> None:
        check_compression(kind)
        self.logical_size = logical_size
        self.produced = 0
        self._dobj = zstandard.ZstdDecompressor().decompressobj()
        self._width = PLANES.get(kind, 0)
        self._blocks = _Blocks() if self._width else None

    def feed(self, chunk: bytes | bytearray | memoryview) -> Iterator[bytes]:
        """The logical bytes that `chunk` (the next stored bytes) completes."""
        for out in self._inflate(chunk):
            if self._blocks is None:
                yield out
            else:
                for block in self._blocks.feed(out):
                    yield bytes(join_planes(block, self._width))

    def _inflate(self, chunk: bytes | bytearray | memoryview) -> Iterator[bytes]:
        """The frame's bytes (planes still grouped) that `chunk` completes, bounded by the logical size."""
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

    def finish(self) -> bytes:
        """Check that the frame ended and produced exactly the logical size; the last logical bytes (those
        of a last, shorter block of planes; b"" for plain zstd)."""
        if not self._dobj.eof:
            raise DecompressionError(f"ends inside its zstd frame (truncated after {self.produced} logical bytes)")
        if self.produced != self.logical_size:
            raise DecompressionError(f"decompresses to {self.produced} bytes, the manifest says {self.logical_size}")
        if self._blocks is None:
            return b""
        return bytes(join_planes(self._blocks.tail(), self._width))


def decompress_exact(data: bytes | bytearray, logical_size: int, kind: str = ZSTD) -> bytes:
    """A whole stored entry in memory -> its logical bytes (bounded; see ExactDecompressor). Up to ONE_SHOT_MAX,
    in one call that cannot allocate more than the logical size, when the entry is sound; anything else is
    taken through ExactDecompressor, whose refusal names what is wrong."""
    check_compression(kind)
    width = PLANES.get(kind, 0)
    if 0 < logical_size <= ONE_SHOT_MAX:
        out = _one_shot(data, logical_size)
        if out is not None:
            return _join_all_planes(out, width) if width else out
    decoder = ExactDecompressor(logical_size, kind)
    out = b"".join(decoder.feed(data))
    return out + decoder.finish()


def _one_shot(data: bytes | bytearray, logical_size: int) -> bytes | None:
    """The frame in `data` inflated in one call, if it is exactly one frame inflating to exactly `logical_size`
    bytes; None otherwise (the caller finds out why). A frame that declares its content size is inflated only
    if it declares the logical size; one that does not gets an output buffer of the logical size, no more."""
    try:
        declared = zstandard.frame_content_size(data)  # -1: the frame does not say
        if declared not in (-1, logical_size) or _frame_end(data) != len(data):
            return None
        out = zstandard.ZstdDecompressor().decompress(
            data, max_output_size=logical_size, read_across_frames=False, allow_extra_data=False
        )
    except (zstandard.ZstdError, ValueError):
        return None
    return out if len(out) == logical_size else None


_RAW, _RLE, _COMPRESSED = 0, 1, 2


def _frame_end(data: bytes | bytearray) -> int:
    """Where the zstd frame at the start of `data` ends, from its header and its blocks' headers (a block:
    3 bytes of header, then its size in bytes, one byte for an RLE block); -1 if it runs past the end."""
    pos = zstandard.frame_header_size(data)
    checksum = zstandard.get_frame_parameters(data).has_checksum
    while pos + 3 <= len(data):
        header = int.from_bytes(data[pos : pos + 3], "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        pos += 3 + (1 if kind == _RLE else size)
        if kind not in (_RAW, _RLE, _COMPRESSED):
            return -1
        if last:
            return pos + (4 if checksum else 0)
    return -1
