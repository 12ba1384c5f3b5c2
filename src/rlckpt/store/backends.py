"""The per-backend commit primitives; everything else in the store is shared code over fsspec.

Local disk: stage under `_tmp/<txid>/`, fsync, atomic directory rename into `step_<N>/`, fsync parent.
Object stores (S3, memory): no rename; write in place under `step_<N>/`, COMMIT last as one
create-exclusive PUT. Exclusivity of the writer is decided earlier by the intent (see store.py).
"""

from __future__ import annotations

import errno
import logging
import os
import uuid
from typing import Any

from fsspec.spec import AbstractBufferedFile

from rlckpt.errors import BundleExistsError

from .digest import sha256_of_stream
from .manifest import FileEntry
from .paths import COMMIT_NAME, MANIFEST_NAME, TMP_DIR
from .storage_errors import is_precondition_failed

log = logging.getLogger(__name__)

WRITE_BLOCK_SIZE = 16 << 20


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def is_local_fs(fs: Any) -> bool:
    """True for fsspec's LocalFileSystem (possibly behind a wrapper that forwards `protocol`)."""
    protocols = _protocols(fs)
    return "file" in protocols or "local" in protocols


def is_s3fs(fs: Any) -> bool:
    """True for s3fs (possibly wrapped): its cat_file/find take the request-saving options used below."""
    return "s3" in _protocols(fs) and hasattr(fs, "max_concurrency")


def fsync_path(path: str, directory: bool = False) -> None:
    """fsync a file or directory by path (Linux allows fsync on a read-only descriptor)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Backend:
    """Common interface; `root` is the run's path as the filesystem sees it (no protocol, no trailing slash)."""

    local: bool = False

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = root

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def read_object(self, path: str, size: int | None = None) -> bytes:
        """A whole stored object (intent, COMMIT, manifest, a small file) in as few requests as possible.

        s3fs's cat_file sends a HEAD before the GET to decide whether to fetch in parallel ranges; for
        small objects (size unknown but small, or known and below one block) a single GET is enough."""
        if is_s3fs(self.fs) and (size is None or size <= int(getattr(self.fs, "default_block_size", 0))):
            return bytes(self.fs.cat_file(path, max_concurrency=1))
        return bytes(self.fs.cat_file(path))

    def list_step(self, step_dir: str) -> list[str]:
        """Full paths of every file under `step_dir/`: one LIST on S3, even when there is none (a plain
        find() of an empty prefix adds a HEAD and a second LIST to look for a file of that name)."""
        if is_s3fs(self.fs):
            return list(self.fs.find(self.root, prefix=f"{step_dir}/"))
        try:
            return list(self.fs.find(self.path(step_dir)))
        except FileNotFoundError:
            return []

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a stored object: one ranged GET on S3, no HEAD (the caller knows the size)."""
        return bytes(self.fs.cat_file(path, start=start, end=end))

    # --- overridden -------------------------------------------------------------------------
    def data_root(self, step_dir: str, txid: str) -> str:
        raise NotImplementedError

    def create_exclusive(self, path: str, data: bytes) -> None:
        """Write a small object only if it does not exist; raise FileExistsError if it does."""
        raise NotImplementedError

    def open_write(self, path: str) -> Any:
        raise NotImplementedError

    def finish_write(self, raw: Any, path: str, ok: bool) -> None:
        raise NotImplementedError

    def publish(self, step_dir: str, txid: str, manifest: bytes, commit: bytes) -> None:
        """Make the staged bundle visible atomically; BundleExistsError if another writer got there first."""
        raise NotImplementedError

    def discard(self, step_dir: str, txid: str) -> None:
        """Remove everything a transaction wrote (it holds the step's intent and did not commit)."""
        raise NotImplementedError

    def delete_bundle(self, step_dir: str) -> None:
        """Delete a committed bundle so that it turns invisible first (COMMIT gone) and then disappears."""
        raise NotImplementedError


class LocalBackend(Backend):
    """Local disk: same-filesystem staging dir + fsync + rename."""

    local = True

    def data_root(self, step_dir: str, txid: str) -> str:
        return self.path(TMP_DIR, txid)

    def create_exclusive(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_path(os.path.dirname(path), directory=True)

    def open_write(self, path: str) -> Any:
        self.fs.makedirs(self.fs._parent(path), exist_ok=True)
        return self.fs.open(path, "wb")

    def finish_write(self, raw: Any, path: str, ok: bool) -> None:
        raw.close()
        if ok:
            fsync_path(path)
        elif os.path.exists(path):
            os.remove(path)

    def copy_in(self, local_src: str, path: str) -> FileEntry:
        """Uncompressed local file into staging: kernel-side copy, then hash what landed, then fsync."""
        self.fs.makedirs(self.fs._parent(path), exist_ok=True)
        self.fs.put_file(local_src, path)
        with self.fs.open(path, "rb") as staged:
            digest, size = sha256_of_stream(staged)
        fsync_path(path)
        return FileEntry(size=size, sha256=digest, logical_size=size, compression=None)

    def publish(self, step_dir: str, txid: str, manifest: bytes, commit: bytes) -> None:
        staging = self.data_root(step_dir, txid)
        os.makedirs(staging, exist_ok=True)
        self.fs.pipe_file(f"{staging}/{MANIFEST_NAME}", manifest)
        fsync_path(f"{staging}/{MANIFEST_NAME}")
        self.fs.pipe_file(f"{staging}/{COMMIT_NAME}", commit)
        fsync_path(f"{staging}/{COMMIT_NAME}")
        for dirpath, _dirs, _files in os.walk(staging):
            fsync_path(dirpath, directory=True)
        final = self.path(step_dir)
        try:
            os.rename(staging, final)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                raise BundleExistsError(f"{final} already exists: another writer committed this step") from exc
            raise
        fsync_path(self.root, directory=True)

    def discard(self, step_dir: str, txid: str) -> None:
        staging = self.data_root(step_dir, txid)
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)

    def delete_bundle(self, step_dir: str) -> None:
        doomed = self.path(TMP_DIR, f"delete-{uuid.uuid4().hex}")
        os.makedirs(self.path(TMP_DIR), exist_ok=True)
        os.rename(self.path(step_dir), doomed)  # atomic: invisible at once
        fsync_path(self.root, directory=True)
        self.fs.rm(doomed, recursive=True)


class ObjectBackend(Backend):
    """Object stores: in place under step_<N>/, COMMIT last as one small create-exclusive PUT."""

    def data_root(self, step_dir: str, txid: str) -> str:
        return self.path(step_dir)

    def create_exclusive(self, path: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(path, data, mode="create")
        except Exception as exc:
            if is_precondition_failed(exc) and not isinstance(exc, FileExistsError):
                raise FileExistsError(errno.EEXIST, f"{path} exists (precondition failed)") from exc
            raise

    def open_write(self, path: str) -> Any:
        """Opened with autocommit=False, so that nothing but finish_write(ok=True) can publish it: fsspec's
        `__del__` closes a file that is garbage-collected unfinished, which with autocommit would publish
        the partial object (e.g. a writer dropped in a reference cycle, whose finalizers run in any order)."""
        return self.fs.open(path, "wb", autocommit=False, block_size=WRITE_BLOCK_SIZE)

    def finish_write(self, raw: Any, path: str, ok: bool) -> None:
        """Success: publish in one step. Failure: discard (aborts a started multipart upload, drops the buffer).

        On s3fs (any fsspec AbstractBufferedFile) autocommit is switched on just before close(): a file
        smaller than one block then goes out as one PUT instead of a 3-request multipart upload, and a
        larger one completes its multipart upload inside close(). With autocommit left off, s3fs would
        make every file, even 1 KiB, a multipart upload and commit() it separately."""
        if ok:
            try:
                if isinstance(raw, AbstractBufferedFile) and not raw.autocommit:
                    raw.autocommit = True
                    raw.close()
                else:
                    raw.close()
                    raw.commit()
                return
            except BaseException:
                self._discard_file(raw)
                raise
        self._discard_file(raw)

    @staticmethod
    def _discard_file(raw: Any) -> None:
        try:
            raw.discard()  # aborts a multipart upload, publishes nothing
        finally:
            raw.closed = True  # fsspec's __del__ would otherwise try to flush the discarded buffer

    def publish(self, step_dir: str, txid: str, manifest: bytes, commit: bytes) -> None:
        try:
            self.create_exclusive(self.path(step_dir, MANIFEST_NAME), manifest)  # a loser cannot replace it
            self.create_exclusive(self.path(step_dir, COMMIT_NAME), commit)
        except FileExistsError as exc:
            raise BundleExistsError(f"{self.path(step_dir)} already has a manifest/COMMIT: another writer won") from exc

    def discard(self, step_dir: str, txid: str) -> None:
        """Delete the step's objects unless it has a COMMIT (one LIST answers both)."""
        prefix = self.path(step_dir)
        keys = self.list_step(step_dir)
        if self.path(step_dir, COMMIT_NAME) in keys:
            log.warning("not discarding %s: it has a COMMIT (written by another transaction)", prefix)
            return
        if keys:
            self.fs.rm(keys)

    def delete_bundle(self, step_dir: str) -> None:
        self.fs.rm_file(self.path(step_dir, COMMIT_NAME))  # invisible first
        keys = self.list_step(step_dir)
        if keys:
            self.fs.rm(keys)


def make_backend(fs: Any, root: str) -> Backend:
    """Pick the commit primitives for a filesystem."""
    return LocalBackend(fs, root) if is_local_fs(fs) else ObjectBackend(fs, root)
