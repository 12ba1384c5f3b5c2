"""A shard file's large tensors read straight into the tensors they load into (local disk and S3).

DCP writes each tensor item as a `torch.save` archive: a zip whose one big record is the tensor's raw bytes,
stored uncompressed between a few small records (the pickle before it, the directory after). A shard file is
such items back to back. It is read here front to back, once, hashed as it lands: of each item whose tensor is
at least DIRECT_MIN bytes and whose caller's tensor is one contiguous block of host memory, the small records
before the tensor's bytes go into a small buffer, the tensor's bytes into the caller's tensor itself, and the rest
into another small buffer; every other item (and anything between items) goes into memory as it is. No buffer of
the file's size is held, and a placed tensor's bytes are copied once, from the store into place. On S3 the whole
read is one GET, kept open from piece to piece (the store's held stream).

Where the pieces lie, nothing checked yet, only decides where bytes go. On local disk it comes from each item's
zip directory, peeked at first (`locate`); on S3, where a peek at the end would be a request of its own, from the
item's first bytes as the read reaches them (`locate_head`: its tensor record's local header), and after the file
checked out the item's directory must agree (`confirmed`), or the item loads the common way from the pieces that
hold it. Nothing is parsed as data before the whole file's digest checked out; then torch's weights-only loader
reads each placed archive (the pickle from the small buffers) with the tensor's storage given as the caller's
tensor, so the loaded tensor is the caller's memory, and it must come out as exactly that tensor (dtype, shape,
strides, place), or it is copied there as DCP would copy it. A tensor's bytes reach the caller's tensor before the
digest is checked: a file that fails the check fails the load, which then leaves its state as any failed DCP load
does (partly loaded).

An item that does not fit this (no such archive, a tensor of another size, a caller's tensor that is not one
contiguous block of host memory) is loaded from memory the common way; a file with no item to place is read as
every file is, into a reused buffer (reader.py).
"""

from __future__ import annotations

import ctypes
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, cast

import torch
from torch import _weights_only_unpickler  # torch.load's weights-only unpickler, as _format.load_tensor_view
from torch.serialization import _load, _open_zipfile_reader  # private: torch.load's own steps

from rlckpt.store import InOrderRead

from ._format import SeekableStream

# A tensor item at least this large is read into its tensor; a smaller one is read into memory with the file's
# other small items (placing it would cost a look at its directory, more than the copy it spares).
DIRECT_MIN = 1 << 20
TAIL_PROBE = 4 << 10  # the end of an item peeked at to find its zip directory (a tensor archive's is < 2 KiB)
SMALL_MAX = 1 << 20  # what may lie around the tensor's bytes (pickle, small records, directory) to read this way
SKIP_CHUNK = 1 << 20  # bytes between the items a rank loads (another rank's) pass through a buffer this large

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... file name length, extra field length (30 bytes)
_LOCAL_SIGNATURE = b"PK\x03\x04"
_METHOD = struct.Struct("<H")  # a local header's compression method, at its byte 8
HEAD_PROBE = 4 << 10  # an item's first bytes looked at for its tensor record's local header (torch's is < 1 KiB in)

Piece = tuple[int, memoryview | bytes | bytearray]  # bytes at hand, and where they lie
Finder = Callable[[InOrderRead, int, int, int], "Layout | None"]  # locate_head's signature


class InMemoryOverBudget(Exception):
    """A read in order would hold more of a file in memory than its caller allowed."""


@dataclass(frozen=True)
class Layout:
    """Where one tensor archive's pieces lie in its item (offsets from the item's start): the tensor record's local
    header at `header`, its bytes at [data, data + nbytes) once the header's lengths are known, the item `size`
    bytes long."""

    record: str  # the record's name inside the archive, e.g. "data/0"
    header: int
    nbytes: int
    size: int


@dataclass(eq=False)
class FileItem:
    """One item of a shard file, at [start, start + length) of it, as `read_items` reads it: with a `layout` and a
    `place` (the caller's tensor's bytes), its tensor's bytes go there; its other bytes, or all of them, into
    memory. `pieces` is what was read, at offsets from the item's start; `placed` whether the tensor landed."""

    start: int
    length: int
    layout: Layout | None = None
    place: memoryview | None = None
    pieces: list[Piece] = field(default_factory=list)
    placed: bool = False
    guessed: bool = False  # the layout came from the item's first bytes (locate_head), to be confirmed

    def stream(self, file_size: int) -> Pieces:
        """The item's bytes, at their offsets in the file, as a read-only stream over the file (valid only once
        the file checked out)."""
        return Pieces(file_size, [(self.start + at, piece) for at, piece in self.pieces])


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


def locate(read: InOrderRead, start: int, length: int, nbytes: int) -> Layout | None:
    """The layout of the item at [start, start + length) of the file `read` reads, if it is one tensor archive whose
    single storage record holds `nbytes` bytes, stored, with small records around it; else None (load it the
    common way). Peeks at the item's end, unchecked (local disk: a read of its own)."""
    if length < nbytes:
        return None
    probe = max(0, length - TAIL_PROBE)
    tail = read.peek(start + probe, start + length)
    return _directory_layout(Pieces(length, [(probe, tail)]), length, nbytes)


def locate_head(read: InOrderRead, start: int, length: int, nbytes: int) -> Layout | None:
    """Where the item at [start, start + length) would hold a stored record of `nbytes` bytes named data/..., by its
    first bytes alone (peeked, unchecked: on S3 the held stream reads them ahead, no request of its own), for a read
    in order that reaches the item before its zip directory (which comes last). A guess, until `confirmed`."""
    if length < nbytes or length - nbytes > SMALL_MAX:
        return None
    head = read.peek(start, start + min(HEAD_PROBE, length - nbytes))
    at = head.find(_LOCAL_SIGNATURE)
    while at >= 0 and at + _LOCAL_HEADER.size <= len(head):
        _signature, name_len, extra_len = _LOCAL_HEADER.unpack_from(head, at)
        name = head[at + _LOCAL_HEADER.size : at + _LOCAL_HEADER.size + name_len]
        record = name.partition(b"/")[2]
        if len(name) == name_len and record.startswith(b"data/"):
            stored = _METHOD.unpack_from(head, at + 8)[0] == zipfile.ZIP_STORED
            if not stored or at + _LOCAL_HEADER.size + name_len + extra_len + nbytes > length:
                return None
            return Layout(record.decode("ascii", "replace"), at, nbytes, length)
        at = head.find(_LOCAL_SIGNATURE, at + 1)
    return None


def confirmed(item: FileItem) -> bool:
    """Whether the item's own zip directory (read and checked by now) lays it out as `locate_head` guessed: torch's
    loader finds the tensor's bytes through the directory, so a placed tensor is the item's only if both agree."""
    layout = item.layout
    if layout is None:
        return False
    return _directory_layout(Pieces(item.length, item.pieces), item.length, layout.nbytes) == layout


def _directory_layout(stream: Pieces, length: int, nbytes: int) -> Layout | None:
    """The layout the zip directory of a `length`-byte item gives (`stream`: the item, at least its end), or None."""
    try:
        with zipfile.ZipFile(cast(BinaryIO, stream)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error):
        return None
    storages = [i for i in infos if i.filename.partition("/")[2].startswith("data/")]
    if len(storages) != 1:
        return None
    info = storages[0]
    if info.compress_type != zipfile.ZIP_STORED or info.file_size != nbytes or info.compress_size != nbytes:
        return None
    if info.header_offset > SMALL_MAX or length - nbytes > SMALL_MAX:
        return None
    return Layout(info.filename.partition("/")[2], info.header_offset, nbytes, length)


def read_items(
    read: InOrderRead,
    size: int,
    items: list[FileItem],
    find: Finder | None = None,
    in_memory_max: int | None = None,
) -> None:
    """Read the `size`-byte file front to back (`items` in file order, apart): each item with a layout into its
    place and small buffers where it fits that, every other item into memory whole, what lies between items
    through a scratch buffer; then check the whole file. With `find` (`locate_head`), an item given a place but no
    layout is located when the read reaches it, and kept placed only if its directory then agrees (`confirmed`).

    Raises:
        CorruptBundleError: the file differs from the manifest (placed tensors then hold what was read).
        InMemoryOverBudget: the items read into memory came to more than `in_memory_max` bytes (the read stops).
    """
    in_memory = 0
    for item in items:
        _skip(read, item.start - read.position)
        if find is not None and item.place is not None and item.layout is None:
            item.layout = find(read, item.start, item.length, len(item.place))
            item.guessed = item.layout is not None
        item.placed = item.layout is not None and item.place is not None and _read_placed(read, item)
        if not item.placed:
            in_memory += item.length
            if in_memory_max is not None and in_memory > in_memory_max:
                raise InMemoryOverBudget(f"more than {in_memory_max} bytes of the file's items would go to memory")
            _read_rest(read, item)
    _skip(read, size - read.position + 1)  # one byte more: a longer file is noticed
    read.finish()
    for item in items:
        if item.placed and item.guessed and not confirmed(item):
            item.placed = False  # every byte of it is in its pieces: it loads the common way from them


def _skip(read: InOrderRead, count: int) -> None:
    """Read (and hash) the next `count` bytes, or what is left of the file, keeping none of them."""
    scratch = memoryview(bytearray(min(count, SKIP_CHUNK))) if count > 0 else memoryview(b"")
    while count > 0:
        got = read.into(scratch[: min(count, len(scratch))])
        if not got:
            return
        count -= got


def _read_piece(read: InOrderRead, item: FileItem, into: memoryview | bytearray) -> bool:
    """The item's next bytes into `into`; whether they filled it (the file goes on)."""
    at = read.position - item.start
    got = read.into(memoryview(into))
    item.pieces.append((at, memoryview(into)[:got]))
    return got == len(into)


def _read_placed(read: InOrderRead, item: FileItem) -> bool:
    """The item in four pieces (the records before its tensor's local header's lengths, the name and extra field,
    the tensor's bytes into its place, the rest), or False where the header is not where the directory said, or
    the file ends early (then what is left of it is read the common way)."""
    layout, place = cast(Layout, item.layout), cast(memoryview, item.place)
    head = bytearray(layout.header + _LOCAL_HEADER.size)
    if not _read_piece(read, item, head):
        return False
    signature, name_len, extra_len = _LOCAL_HEADER.unpack_from(head, layout.header)
    data_end = len(head) + name_len + extra_len + layout.nbytes
    if signature != b"PK\x03\x04" or data_end > layout.size:
        return False
    if not _read_piece(read, item, bytearray(name_len + extra_len)) or not _read_piece(read, item, place):
        return False
    _read_piece(read, item, bytearray(layout.size - data_end))
    return True


def _read_rest(read: InOrderRead, item: FileItem) -> None:
    left = item.start + item.length - read.position
    if left > 0:
        _read_piece(read, item, bytearray(left))


def load_placed(item: FileItem) -> torch.Tensor:
    """A placed item's tensor, from its checked pieces (after `read_items`): loaded by torch's weights-only loader
    with the tensor record's storage given as the place itself, so it views the caller's tensor."""
    layout, place = cast(Layout, item.layout), cast(memoryview, item.place)
    with _open_zipfile_reader(cast(BinaryIO, Pieces(item.length, item.pieces))) as archive:  # private torch helper
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


class Pieces(SeekableStream):
    """A file of `size` bytes at hand only in pieces (each at its offset), as a seekable read-only stream: a read
    is served from the pieces, across consecutive ones; one that starts where no piece is raises OSError before
    anything is allocated (a forged zip directory may name a read as large as the file)."""

    def __init__(self, size: int, pieces: list[tuple[int, memoryview | bytes | bytearray]]) -> None:
        super().__init__(size)
        self._pieces = [(at, memoryview(piece).cast("B")) for at, piece in pieces]

    def span(self, start: int, length: int) -> memoryview | None:
        """Bytes [start, start + length) as a view of the one piece that holds them all, or None."""
        found = self._piece_at(start)
        if found is None or start + length > found[0] + len(found[1]):
            return None
        return found[1][start - found[0] : start - found[0] + length]

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
