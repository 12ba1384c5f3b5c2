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
from safetensors.torch import save_file

from rlckpt.errors import ExportError

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


def blake3_of(path: str) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update_mmap(path)
    return hasher.hexdigest()


class ExportTarget:
    """Where an export goes (a local dir, or a URL fsspec opens), written as described above. Use as a context
    manager: leaving it without `publish()` removes what it wrote."""

    def __init__(self, out: str, storage_options: dict[str, Any] | None = None, overwrite: bool = False) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(out, **(storage_options or {}))
        self.out = out
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        self.overwrite = overwrite
        self._scratch = tempfile.mkdtemp(prefix="rlckpt-export-")
        self._staging: str | None = None
        self._written: list[str] = []
        self._published = False
        self._check_free()
        if self.local:
            parent, name = os.path.split(os.path.abspath(self.root.rstrip("/")))
            os.makedirs(parent, exist_ok=True)
            self._staging = os.path.join(parent, f".{name}.rlckpt-export-{uuid.uuid4().hex[:12]}")
            os.mkdir(self._staging)

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
        shutil.rmtree(self._scratch, ignore_errors=True)
        if self._published:
            return
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
        else:
            for path in self._written:
                with contextlib.suppress(Exception):
                    self.fs.rm_file(path)

    def write_shard(self, name: str, tensors: dict[str, Any], metadata: dict[str, str]) -> WrittenFile:
        """One safetensors file of `tensors`: written (locally: into staging; else to a scratch file, then
        uploaded), its BLAKE3 taken from the bytes on disk."""
        if self._staging is not None:
            path = os.path.join(self._staging, name)
            save_file(tensors, path, metadata=metadata)
            return WrittenFile(name, os.path.getsize(path), blake3_of(path), list(tensors))
        if not self._written and self.overwrite:
            self._clear_remote()
        scratch = os.path.join(self._scratch, name)
        save_file(tensors, scratch, metadata=metadata)
        written = WrittenFile(name, os.path.getsize(scratch), blake3_of(scratch), list(tensors))
        target = f"{self.root.rstrip('/')}/{name}"
        self._written.append(target)
        self.fs.put_file(scratch, target)
        os.remove(scratch)
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
