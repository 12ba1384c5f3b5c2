"""Local disk: a staging dir per transaction, fsync, and an atomic directory rename as the commit.

Reads never follow a symlink inside the run and refuse anything that is not a regular file, so a
symlink to /dev/zero or a FIFO planted in a run cannot exhaust memory or hang a reader. Writes go
through the fsspec filesystem (tests wrap it to inject faults at every call).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import shutil
import socket
import stat
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from rlckpt.errors import (
    BundleExistsError,
    InvalidPathError,
    IrregularFileError,
    LostWriteError,
    SharedStorageError,
    StoreUnavailableError,
)

from ..inventory import DIRECTORY, FILE, ListedPath
from ..paths import COMMIT_NAME, MANIFEST_NAME, QUARANTINE_DIR, RESERVED_NAMES, TMP_DIR
from .base import READ_CHUNK, Backend, Inventory, Listing

log = logging.getLogger(__name__)


def fsync_path(path: str, directory: bool = False) -> None:
    """fsync a file or directory by path (Linux allows fsync on a read-only descriptor)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISDIR(mode):
        return DIRECTORY
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def _walk(top: str, prefix: str = "") -> Iterator[ListedPath]:
    """Every path under `top` by lstat: symlinks are reported, never followed; directories are listed too."""
    try:
        entries = list(os.scandir(top))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        rel = f"{prefix}{entry.name}"
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while we listed
        kind = _kind(st.st_mode)
        yield ListedPath(rel, kind, st.st_size if kind == FILE else 0, st.st_mtime)
        if kind == DIRECTORY:
            yield from _walk(entry.path, rel + "/")


class LocalBackend(Backend):
    """Local disk (any POSIX filesystem with atomic rename)."""

    local = True

    # --- the store as a whole -----------------------------------------------------------------
    def check_reachable(self, url: str) -> None:
        parent = self.root
        while parent and not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if parent and self.root != parent and not os.path.isdir(parent):
            raise StoreUnavailableError(f"store {url} unavailable: {parent} is not a directory")
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise StoreUnavailableError(f"store {url} unavailable: {self.root} is not a directory")

    def create_exclusive_enforced(self) -> bool:
        return True  # link()/O_EXCL on a local filesystem

    def list_run(self) -> Iterator[ListedPath]:
        return _walk(self.root)

    # --- safe reads ---------------------------------------------------------------------------
    def _open_regular(self, path: str) -> int:
        """A read-only fd of `path`, opened component by component beneath the root without following
        symlinks, and only if it is a regular file (O_NONBLOCK: opening a FIFO cannot hang)."""
        parts = self.rel(path).split("/")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nxt
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise type(exc)(exc.errno, exc.strerror, path) from None  # name the whole path, not the leaf
            for depth in range(1, len(parts) + 1):  # which component stopped us: a symlink, or nothing there
                if os.path.islink(os.path.join(self.root, *parts[:depth])):
                    raise IrregularFileError(f"{path} is (or lies under) a symlink; refusing to follow it") from None
            raise FileNotFoundError(errno.ENOENT, f"{path} does not exist") from None
        finally:
            os.close(fd)
        mode = os.fstat(leaf).st_mode
        if not stat.S_ISREG(mode):
            os.close(leaf)
            raise IrregularFileError(f"{path} is a {_kind(mode)}, not a regular file")
        return leaf

    def read_capped(self, path: str, limit: int) -> bytes:
        return self.read_range(path, 0, limit + 1)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """The whole rest of the range in each pread: a regular file answers it in one, and the join of
        one chunk is that chunk, so the bytes are copied out of the page cache once."""
        fd = self._open_regular(path)
        try:
            chunks, pos = [], start
            while pos < end:
                chunk = os.pread(fd, end - pos, pos)
                if not chunk:
                    break
                chunks.append(chunk)
                pos += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def read_into(
        self, path: str, view: memoryview, start: int = 0, on_chunk: Callable[[memoryview], object] | None = None
    ) -> int:
        """Straight from the page cache into the caller's memory, a READ_CHUNK at a time."""
        fd = self._open_regular(path)
        try:
            return _read_chunks(fd, view, start, on_chunk)
        finally:
            os.close(fd)

    def list_files(self, path: str) -> Listing:
        sizes: dict[str, int] = {}
        irregular: dict[str, str] = {}
        if os.path.islink(path):
            return Listing({}, {"": "symlink"})
        for item in _walk(path):
            if item.kind == FILE:
                sizes[item.rel] = item.size
            elif item.kind != DIRECTORY:
                irregular[item.rel] = item.kind
        return Listing(sizes, irregular)

    # --- small objects ------------------------------------------------------------------------
    def create_exclusive(self, path: str, data: bytes) -> None:
        """Write a temp file beside `path`, fsync it, then link() it into place: link fails if `path`
        exists, and readers never see a partly written file (an O_EXCL create would be empty for a moment)."""
        directory, name = os.path.split(path)
        os.makedirs(directory, exist_ok=True)
        temp = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, path)
        finally:
            os.unlink(temp)
        fsync_path(directory, directory=True)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def mtime(self, path: str) -> float | None:
        return os.lstat(path).st_mtime

    def remove_file(self, path: str) -> None:
        os.unlink(path)

    def remove_tree(self, path: str) -> None:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass

    # --- writing a transaction ----------------------------------------------------------------
    def data_root(self, step_dir: str, txid: str) -> str:
        return self.path(TMP_DIR, txid)

    def bundle_root(self, step_dir: str, txid: str) -> str:
        return self.path(step_dir)  # the staging dir was renamed into place

    def bundle_view(self, step_listing: Listing, txid: str) -> Listing:
        sizes = {rel: size for rel, size in step_listing.sizes.items() if rel not in RESERVED_NAMES}
        return Listing(sizes, dict(step_listing.irregular))

    def transaction_data(self, step_dir: str, txid: str | None) -> str | None:
        return self.path(TMP_DIR, txid) if txid else None

    def check_joinable(self, step_dir: str, txid: str, who: str) -> None:
        staging = self.data_root(step_dir, txid)
        if not os.path.isdir(staging):
            raise SharedStorageError(
                f"{who} on host {socket.gethostname()} cannot see the staging dir {staging} of {step_dir} "
                f"(txid {txid}): on local disk every participant must share the coordinator's filesystem "
                "(NFS, Lustre, ...); use an object store (s3://...) when they do not"
            )

    def prepare_step(self, step_dir: str, txid: str) -> bool:
        final = self.path(step_dir)
        if os.path.lexists(os.path.join(final, COMMIT_NAME)):
            return True
        if os.path.lexists(final):  # a step dir without COMMIT is debris; the claim makes it ours
            log.warning("removing %s: no COMMIT, and this transaction holds the step's claim", final)
            self.remove_tree(final)
        os.makedirs(self.data_root(step_dir, txid))
        return False

    def staged_sizes(self, inv: Inventory, step: int, txid: str) -> dict[str, int]:
        return dict(inv.tmp_dirs.get(txid, {}))

    def written_view(self, step_dir: str, txid: str) -> Listing:
        return self.bundle_view(self.list_files(self.data_root(step_dir, txid)), txid)  # renamed into place whole

    def create_marker(self, path: str, data: bytes) -> None:
        """O_EXCL: the name appears at once, atomically; no temp file, no fsync (markers need no durability)."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _nothing_in_the_way(self, path: str) -> Iterator[None]:
        """Writers of one transaction share its staging dir: a file where this path needs a directory (or
        a directory where it needs a file) was written by another of them. That is the writers' clash,
        refused as a bad path (an object store accepts both and the commit refuses them), not an outage."""
        try:
            yield
        except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
            raise InvalidPathError(
                f"{self.rel(path)} cannot be written: another writer of this transaction wrote a file where it "
                f"needs a directory, or a directory of that name ({exc.strerror})"
            ) from None

    def open_write(self, path: str) -> Any:
        with self._nothing_in_the_way(path):
            self.fs.makedirs(self.fs._parent(path), exist_ok=True)
            return self.fs.open(path, "wb")

    def finish_write(self, raw: Any, path: str, ok: bool) -> Callable[[], None] | None:
        raw.close()
        if ok:
            return functools.partial(fsync_path, path)
        if os.path.exists(path):
            os.remove(path)
        return None

    def make_visible(self, step_dir: str, txid: str, manifest: bytes, commit: bytes) -> None:
        staging = self.data_root(step_dir, txid)
        if not os.path.isdir(staging):
            raise LostWriteError(f"{step_dir}: staging dir {staging} is gone (removed by gc?); nothing committed")
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

    def discard(self, step_dir: str, txid: str | None) -> None:
        staging = self.transaction_data(step_dir, txid)
        if staging is not None and self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)

    def delete_bundle(self, step_dir: str) -> None:
        doomed = self.path(TMP_DIR, f"delete-{uuid.uuid4().hex}")
        os.makedirs(self.path(TMP_DIR), exist_ok=True)
        os.rename(self.path(step_dir), doomed)  # atomic: invisible at once
        fsync_path(self.root, directory=True)
        self.remove_tree(doomed)

    def quarantine(self, step_dir: str, name: str) -> str:
        target = self.path(QUARANTINE_DIR, name)
        os.makedirs(self.path(QUARANTINE_DIR), exist_ok=True)
        os.rename(self.path(step_dir), target)  # atomic: the step is free and the bundle kept
        fsync_path(self.root, directory=True)
        return target


def _read_chunks(fd: int, view: memoryview, start: int, on_chunk: Callable[[memoryview], object] | None) -> int:
    """preadv into `view` a READ_CHUNK at a time, each piece handed to `on_chunk` while it is in cache."""
    pos = 0
    while pos < len(view):
        piece = view[pos : pos + READ_CHUNK]
        n = os.preadv(fd, [piece], start + pos)
        if not n:
            break
        if on_chunk is not None:
            on_chunk(piece[:n])
        pos += n
    return pos
