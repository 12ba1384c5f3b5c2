"""A shard file that holds one large tensor, read straight into the tensor it loads into.

DCP writes each tensor item as a `torch.save` archive: a zip whose one big record is the tensor's raw bytes,
stored uncompressed between a few small records (the pickle before it, the directory after). A file holding
a single such item is read here in three pieces, in order and hashed as they land: the small records before
the tensor's bytes into a small buffer, the tensor's bytes into the caller's tensor itself, and the rest into
another small buffer. No buffer of the file's size is held, whatever the tensor's size, and its bytes are
copied once, from the store into place.

Where the pieces lie comes from the archive's zip directory, read first and unchecked: it only decides where
bytes go. Nothing is parsed as data before the whole file's digest checked out; then torch's weights-only
loader reads the archive (the pickle from the small buffers) with the tensor's storage given as the caller's
tensor, so the loaded tensor is the caller's memory, and it must come out as exactly that tensor (dtype,
shape, strides, place), or it is copied there as DCP would copy it. A tensor's bytes reach the caller's tensor
before the digest is checked: a file that fails the check fails the load, which then leaves its state as any
failed DCP load does (partly loaded).

Any file that does not fit this (no such archive, a tensor of another size, a caller's tensor that is not one
contiguous block of host memory) is read the common way, into a reused buffer (reader.py), and so is every file
on an object store, where each of the small reads above is a request of its own.
"""

from __future__ import annotations

import ctypes
import struct
import zipfile
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

import torch
from torch import _weights_only_unpickler  # torch.load's weights-only unpickler, as _format.load_tensor_view
from torch.serialization import _load, _open_zipfile_reader  # private: torch.load's own steps

from rlckpt.store import Bundle, FileEntry

from ._format import SeekableStream

# A single-item file at least this large is read into its tensor: rlckpt's own shard files stay below it unless
# one tensor is larger, and below it a file is one of the reused read buffers, fetched ahead of the loop.
DIRECT_MIN = 16 << 20
TAIL_PROBE = 64 << 10  # the end of a file read to find the zip directory (a tensor archive's is < 2 KiB)
SMALL_MAX = 1 << 20  # what may lie around the tensor's bytes (pickle, small records, directory) to read this way

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... file name length, extra field length (30 bytes)


@dataclass(frozen=True)
class Layout:
    """Where one tensor archive's pieces lie in its file: the tensor record's local header at `header`, its
    bytes at [data, data + nbytes) once the header's lengths are known, the file `size` bytes long."""

    record: str  # the record's name inside the archive, e.g. "data/0"
    header: int
    nbytes: int
    size: int


def load_into(bundle: Bundle, relpath: str, entry: FileEntry, target: torch.Tensor) -> torch.Tensor | None:
    """`relpath` read into `target` and loaded (`read_into_tensor`), or None, with nothing read into `target`,
    when the tensor or the file does not fit that. The tensor is asked first: one that cannot take the bytes
    costs no look at the file."""
    place = host_bytes(target)
    if place is None:
        return None
    layout = locate(bundle, relpath, entry, len(place))
    return None if layout is None else read_into_tensor(bundle, relpath, layout, place)


def locate(bundle: Bundle, relpath: str, entry: FileEntry, nbytes: int) -> Layout | None:
    """The layout of `relpath` if it is one tensor archive whose single storage record holds `nbytes` bytes,
    stored, with small records around it; else None (read the common way). Reads the file's end unchecked."""
    if entry.compression is not None or entry.size < nbytes:
        return None
    start = max(0, entry.size - TAIL_PROBE)
    tail = bundle.read_unchecked(relpath, start, entry.size)
    try:
        with zipfile.ZipFile(cast(BinaryIO, _Pieces(entry.size, [(start, tail)]))) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error):
        return None
    storages = [i for i in infos if i.filename.partition("/")[2].startswith("data/")]
    if len(storages) != 1:
        return None
    info = storages[0]
    if info.compress_type != zipfile.ZIP_STORED or info.file_size != nbytes or info.compress_size != nbytes:
        return None
    if info.header_offset > SMALL_MAX or entry.size - nbytes > SMALL_MAX:
        return None
    return Layout(info.filename.partition("/")[2], info.header_offset, nbytes, entry.size)


def host_bytes(tensor: torch.Tensor) -> memoryview | None:
    """A writable byte view of `tensor`'s memory when it is one contiguous block of host memory, else None."""
    if tensor.device.type != "cpu" or tensor.layout != torch.strided or not tensor.is_contiguous():
        return None
    if tensor.is_quantized or tensor.numel() == 0:
        return None
    if tensor.is_conj() or tensor.is_neg() or type(tensor) is not torch.Tensor:
        return None
    nbytes = tensor.numel() * tensor.element_size()
    block = (ctypes.c_char * nbytes).from_address(tensor.data_ptr())
    return memoryview(block).cast("B")


def read_into_tensor(bundle: Bundle, relpath: str, layout: Layout, place: memoryview) -> torch.Tensor | None:
    """Read `relpath` with its tensor's bytes landing in `place` (the caller's tensor's `host_bytes`, which
    `locate` was given the size of; the module doc), check the whole file, and load it: the loaded tensor,
    viewing `place`. None, having read nothing into `place`, when the record's local header is not where the
    directory said (the caller reads the file the common way).

    Raises:
        CorruptBundleError: the file differs from the manifest (then `place` holds what was read).
    """
    read = bundle.read_in_order(relpath)
    head = bytearray(layout.header + _LOCAL_HEADER.size)
    if read.into(memoryview(head)) != len(head):
        return None
    signature, name_len, extra_len = _LOCAL_HEADER.unpack_from(head, layout.header)
    if signature != b"PK\x03\x04":
        return None
    rest = bytearray(name_len + extra_len)
    data_start = len(head) + len(rest)
    data_end = data_start + layout.nbytes
    if data_end > layout.size or read.into(memoryview(rest)) != len(rest):
        return None
    read.into(place)
    after = bytearray(layout.size - data_end + 1)  # one byte more: a longer file is noticed
    got = read.into(memoryview(after))
    read.finish()  # from here on every byte read is the manifest's (so data_end + got is the file's size)
    pieces: list[tuple[int, memoryview | bytes | bytearray]] = [
        (0, head),
        (len(head), rest),
        (data_start, place),
        (data_end, memoryview(after)[:got]),
    ]
    with _open_zipfile_reader(cast(BinaryIO, _Pieces(layout.size, pieces))) as archive:  # private torch helper
        given = _TensorInPlace(archive, layout.record, torch.frombuffer(place, dtype=torch.uint8))
        loaded = _load(given, "cpu", _weights_only_unpickler, encoding="utf-8")
    return cast(torch.Tensor, loaded)


def in_place(loaded: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether the loaded tensor is `target` itself (same memory, dtype, shape and strides): nothing to copy."""
    return (
        isinstance(loaded, torch.Tensor)
        and loaded.dtype == target.dtype
        and loaded.shape == target.shape
        and loaded.stride() == target.stride()
        and loaded.data_ptr() == target.data_ptr()
    )


class _TensorInPlace:
    """torch's archive reader, but the tensor record's storage is the caller's tensor, already read there."""

    def __init__(self, archive: Any, record: str, storage: torch.Tensor) -> None:
        self._archive = archive
        self._record = record
        self._storage = storage

    def get_storage_from_record(self, name: str, nbytes: int, kind: Any) -> torch.Tensor:
        if name != self._record or nbytes != self._storage.numel():
            raise ValueError(f"the archive's pickle names storage {name} of {nbytes} bytes, not its tensor record")
        return self._storage

    def __getattr__(self, name: str) -> Any:
        return getattr(self._archive, name)


class _Pieces(SeekableStream):
    """A file of `size` bytes at hand only in pieces (each at its offset), as a seekable read-only stream: a read
    is served from the pieces, across consecutive ones; one that starts where no piece is raises OSError before
    anything is allocated (a forged zip directory may name a read as large as the file)."""

    def __init__(self, size: int, pieces: list[tuple[int, memoryview | bytes | bytearray]]) -> None:
        super().__init__(size)
        self._pieces = [(at, memoryview(piece).cast("B")) for at, piece in pieces]

    def _piece_at(self, pos: int) -> tuple[int, memoryview] | None:
        return next(((at, view) for at, view in self._pieces if at <= pos < at + len(view)), None)

    def read(self, size: int | None = -1) -> bytes:
        want = self._size - self._pos if size is None or size < 0 else size
        chunks: list[bytes] = []
        while want > 0 and self._pos < self._size:
            found = self._piece_at(self._pos)
            if found is None:
                if not chunks:
                    raise OSError(f"byte {self._pos} of the file is not at hand")
                break
            at, view = found
            chunk = bytes(view[self._pos - at : self._pos - at + want])
            chunks.append(chunk)
            self._pos += len(chunk)
            want -= len(chunk)
        return b"".join(chunks)

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        data = self.read(len(out))
        out[: len(data)] = data
        return len(data)
