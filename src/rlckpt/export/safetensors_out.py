"""Writing an export: safetensors shard files in the Hugging Face layout (`model.safetensors`, or
`model-0000K-of-0000N.safetensors` with `model.safetensors.index.json`), plus `rlckpt-export.json` naming the
bundle they came from, as a transaction of its own: on local disk everything is written into a staging dir
beside the output and renamed into place last; on an object store the shards go first and the index (the file a
loader reads first) and `rlckpt-export.json` last. Either way an interrupted export leaves nothing that looks
complete."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import blake3
import fsspec
import torch

from rlckpt.errors import ExportError
from rlckpt.export.consolidate import TensorInfo

log = logging.getLogger(__name__)

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PROVENANCE = "rlckpt-export.json"


def shard_names(count: int) -> list[str]:
    """The file names of `count` shards, as Hugging Face names them."""
    if count == 1:
        return [SINGLE]
    return [f"model-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1)]


@dataclass
class WrittenFile:
    name: str
    bytes: int
    blake3: str
    tensors: list[str] = field(default_factory=list)


# The safetensors format's dtype names (its spec, https://github.com/huggingface/safetensors#format).
DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
}


def header_bytes(slots: list[TensorInfo], metadata: dict[str, str]) -> bytes:
    """The file's start: the header's length (8 bytes, little-endian) and the header, JSON naming each tensor's
    dtype, shape and byte range (in `slots` order, back to back), padded with spaces to 8 bytes."""
    obj: dict[str, Any] = {"__metadata__": dict(metadata)}
    at = 0
    for slot in slots:
        if slot.dtype not in DTYPE_NAMES:
            raise ExportError(f"{slot.name}: safetensors has no dtype {slot.dtype}")
        obj[slot.name] = {
            "dtype": DTYPE_NAMES[slot.dtype],
            "shape": list(slot.shape),
            "data_offsets": [at, at + slot.nbytes],
        }
        at += slot.nbytes
    text = json.dumps(obj, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


class ShardStream:
    """A safetensors file written as its tensors come: the header first (every dtype and shape is known from
    the bundle's `.metadata` before a byte is read), then each tensor's bytes straight from its memory, in the
    header's order, hashed (BLAKE3) as they go. `write(tensor)` refuses one that is not the next slot's."""

    def __init__(self, path: str, slots: list[TensorInfo], metadata: dict[str, str]) -> None:
        self.path = path
        self._slots = list(slots)
        self._next = 0
        self._hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        self._file = open(path, "wb")  # noqa: SIM115  # closed by finish() or abandon()
        self._put(header_bytes(self._slots, metadata))

    def _put(self, data: Any) -> None:
        self._hasher.update(data)
        self._file.write(data)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        slot = self._slots[self._next] if self._next < len(self._slots) else None
        if slot is None or slot.name != name or tensor.dtype != slot.dtype or tuple(tensor.shape) != slot.shape:
            raise ExportError(f"{self.path}: {name} ({tensor.dtype}, {tuple(tensor.shape)}) is not the next tensor")
        if slot.nbytes:
            self._put(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)  # its memory, not a copy
        self._next += 1

    def finish(self) -> WrittenFile:
        """Close the file once every slot is written (fsynced); its size and digest."""
        if self._next != len(self._slots):
            raise ExportError(f"{self.path}: {len(self._slots) - self._next} tensors were never written")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return WrittenFile(
            os.path.basename(self.path),
            os.path.getsize(self.path),
            self._hasher.hexdigest(),
            [s.name for s in self._slots],
        )

    def abandon(self) -> None:
        self._file.close()


class ExportTarget:
    """Where an export goes (a local dir, or a URL fsspec opens), written as described above. Use as a context
    manager: leaving it without `publish()` removes what it wrote."""

    def __init__(self, out: str, storage_options: dict[str, Any] | None = None, overwrite: bool = False) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(out, **(storage_options or {}))
        self.out = out
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        self.overwrite = overwrite
        self._scratch: str | None = None  # an object store's shards are written here, then uploaded
        self._staging: str | None = None
        self._written: list[str] = []
        self._published = False
        self._check_free()
        if self.local:
            parent, name = os.path.split(os.path.abspath(self.root.rstrip("/")))
            os.makedirs(parent, exist_ok=True)
            self._staging = os.path.join(parent, f".{name}.rlckpt-export-{uuid.uuid4().hex[:12]}")
            os.mkdir(self._staging)
        else:
            self._scratch = tempfile.mkdtemp(prefix="rlckpt-export-")

    def _existing(self) -> list[str]:
        if self.local:
            path = self.root.rstrip("/")
            if not os.path.exists(path):
                return []
            if not os.path.isdir(path):
                return [path]
            return sorted(os.listdir(path))
        try:
            return sorted(self.fs.find(self.root))
        except FileNotFoundError:
            return []

    def _check_free(self) -> None:
        found = self._existing()
        if found and not self.overwrite:
            raise ExportError(
                f"{self.out} exists and is not empty ({len(found)} entries, e.g. {found[0]}): pass --overwrite "
                "(overwrite=True) to replace it"
            )

    def __enter__(self) -> ExportTarget:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if self._published:
            return
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
        else:
            for path in self._written:
                with contextlib.suppress(Exception):
                    self.fs.rm_file(path)

    def open_shard(self, name: str, slots: list[TensorInfo], metadata: dict[str, str]) -> ShardStream:
        """A shard file to stream tensors into (locally: in staging; else a scratch file, uploaded by
        `close_shard`)."""
        folder = self._staging if self._staging is not None else self._scratch
        assert folder is not None
        return ShardStream(os.path.join(folder, name), slots, metadata)

    def close_shard(self, stream: ShardStream) -> WrittenFile:
        """Finish a shard stream: fsynced in staging, or uploaded to the object store and its scratch copy gone."""
        written = stream.finish()
        if self._staging is None:
            if not self._written and self.overwrite:
                self._clear_remote()
            target = f"{self.root.rstrip('/')}/{written.name}"
            self._written.append(target)
            self.fs.put_file(stream.path, target)
            os.remove(stream.path)
        return written

    def _clear_remote(self) -> None:
        found = self._existing()
        if found:
            log.warning("removing %d objects of the export at %s (overwrite)", len(found), self.out)
            self.fs.rm(found)

    def write_json(self, name: str, obj: Any) -> None:
        data = json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n"
        if self._staging is not None:
            with open(os.path.join(self._staging, name), "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            return
        target = f"{self.root.rstrip('/')}/{name}"
        self._written.append(target)
        self.fs.pipe_file(target, data)

    def publish(self) -> None:
        """Make the export visible: on local disk the staging dir renamed into place (a previous export moved
        aside first and removed after, with `overwrite`); elsewhere every file is already in place."""
        if self._staging is not None:
            _fsync_dir_files(self._staging)
            final = os.path.abspath(self.root.rstrip("/"))
            aside = None
            if os.path.lexists(final):
                if os.path.isdir(final) and not os.listdir(final):
                    os.rmdir(final)
                else:
                    aside = f"{final}.rlckpt-replaced-{uuid.uuid4().hex[:12]}"
                    os.rename(final, aside)
            os.rename(self._staging, final)
            _fsync_dir(os.path.dirname(final))
            self._staging = None
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True) if os.path.isdir(aside) else os.remove(aside)
        self._published = True


def _fsync_dir_files(path: str) -> None:
    for name in os.listdir(path):
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    _fsync_dir(path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def index_of(files: list[WrittenFile], total: int) -> dict[str, Any]:
    """`model.safetensors.index.json`: the total size of the tensors and which file holds each."""
    return {"metadata": {"total_size": total}, "weight_map": {t: f.name for f in files for t in f.tensors}}


def plan_shards(sizes: list[tuple[str, int]], max_shard_size: int) -> list[list[str]]:
    """Names into shards of at most `max_shard_size` bytes, in order (a larger tensor alone), as HF shards."""
    shards: list[list[str]] = []
    size = 0
    for name, nbytes in sizes:
        if shards and size + nbytes <= max_shard_size:
            shards[-1].append(name)
            size += nbytes
        else:
            shards.append([name])
            size = nbytes
    return shards or [[]]


def iter_names(shards: list[list[str]]) -> Iterator[tuple[str, list[str]]]:
    yield from zip(shard_names(len(shards)), shards, strict=True)
