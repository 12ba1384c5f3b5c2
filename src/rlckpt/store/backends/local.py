"""Local disk: a staging dir per transaction, fsync, and an atomic directory rename as the commit.

Nothing here follows a symlink inside the run: every read, write, rename and removal reaches its
target through directories opened beneath the run root without following one (beneath.py), and a
symlink, FIFO or device where rlckpt expects its own file or directory is refused as
IrregularFileError naming it. A symlink or FIFO planted in a run cannot exhaust or hang a reader, nor
make a writer, gc or a commit act outside the run. File contents are still written through the
fsspec filesystem (tests wrap it to inject faults at every call), on a path that opens the file this
module created and no other (`beneath.pinned_path`).
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
from rlckpt.store.backends.base import READ_CHUNK, Backend, HeldFile, Inventory, Listing, PendingWrite
from rlckpt.store.backends.beneath import (
    RunRoot,
    fsync_tree,
    kind_of,
    named,
    open_for_write,
    pinned_path,
    refusal,
    walk,
)
from rlckpt.store.paths.paths import COMMIT_NAME, MANIFEST_NAME, QUARANTINE_DIR, RESERVED_NAMES, TMP_DIR
from rlckpt.store.records.inventory import DIRECTORY, FILE, ListedPath

log = logging.getLogger(__name__)


class LocalBackend(Backend):
    """Local disk (any POSIX filesystem with atomic rename)."""

    local = True
    small_reads_cheap = True
    streams_in_order = True

    def __init__(self, fs: Any, root: str) -> None:
        super().__init__(fs, root)
        self._run = RunRoot(root)

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
        try:
            with self._run.directory(self.root) as fd:
                return iter(list(walk(fd)))
        except (FileNotFoundError, NotADirectoryError):
            return iter(())

    # --- safe reads ---------------------------------------------------------------------------
    def _open_regular(self, path: str) -> int:
        """A read-only fd of `path`, reached beneath the root without following symlinks, and only if it is
        a regular file (O_NONBLOCK: opening a FIFO cannot hang)."""
        try:
            with self._run.parent(path) as (fd, name):
                leaf = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except NotADirectoryError:
            raise FileNotFoundError(errno.ENOENT, f"{path} does not exist") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise refusal(path, "symlink") from None
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                raise FileNotFoundError(errno.ENOENT, f"{path} does not exist") from None
            raise named(exc, path) from None
        mode = os.fstat(leaf).st_mode
        if not stat.S_ISREG(mode):
            os.close(leaf)
            raise IrregularFileError(f"{path} is a {kind_of(mode)}, not a regular file")
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

    def hold(self, path: str) -> HeldFile:
        """One open file (reached as every read reaches it) for all the reads of its pieces: no path walk each."""
        return _OpenFile(self, path, self._open_regular(path))

    def list_files(self, path: str) -> Listing:
        sizes: dict[str, int] = {}
        irregular: dict[str, str] = {}
        try:
            with self._run.directory(path) as fd:
                for item in walk(fd):
                    if item.kind == FILE:
                        sizes[item.rel] = item.size
                    elif item.kind != DIRECTORY:
                        irregular[item.rel] = item.kind
        except (FileNotFoundError, NotADirectoryError):
            return Listing({}, {})
        except IrregularFileError:  # the directory itself, or one above it, is a symlink (or worse)
            return Listing({}, {"": self._kind_at(path) or "symlink"})
        return Listing(sizes, irregular)

    def _kind_at(self, path: str) -> str | None:
        """What is at `path` (lstat, beneath the root), or None when nothing is; "symlink" when what is
        above it is one (then nothing at `path` is inside the run)."""
        try:
            with self._run.parent(path) as (fd, name):
                return kind_of(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IrregularFileError:
            return "symlink"

    # --- small objects ------------------------------------------------------------------------
    def create_exclusive(self, path: str, data: bytes) -> None:
        """Write a temp file beside `path`, fsync it, then link() it into place: link fails if `path`
        exists, and readers never see a partly written file (an O_EXCL create would be empty for a moment)."""
        with self._run.parent(path, create=True) as (dir_fd, name):
            temp = f".{name}.{uuid.uuid4().hex[:12]}.tmp"
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                raise named(exc, path) from None
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                raise named(exc, path) from None
            finally:
                os.unlink(temp, dir_fd=dir_fd)
            os.fsync(dir_fd)

    def exists(self, path: str) -> bool:
        """Whether anything is at `path` inside the run; a path under a symlink is not inside it."""
        try:
            with self._run.parent(path) as (fd, name):
                os.stat(name, dir_fd=fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError, IrregularFileError):
            return False
        return True

    def mtime(self, path: str) -> float | None:
        with self._run.parent(path) as (fd, name):
            return os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime

    def remove_file(self, path: str) -> None:
        with self._run.parent(path) as (fd, name):
            try:
                os.unlink(name, dir_fd=fd)
            except OSError as exc:
                raise named(exc, path) from None

    def remove_tree(self, path: str) -> None:
        """Remove `path` and what is under it; a symlink there is removed, not followed (rmtree by descriptor)."""
        try:
            with self._run.parent(path) as (fd, name):
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass

    @contextlib.contextmanager
    def _new_file(self, path: str) -> Iterator[tuple[int, str]]:
        """(write descriptor, pinned path) of regular file `path`, created empty beneath the root: fsspec
        writes it through the pinned path, which cannot lead anywhere else."""
        with self._run.parent(path, create=True) as (dir_fd, name):
            fd = open_for_write(dir_fd, name, path)
        try:
            yield fd, pinned_path(fd)
        finally:
            os.close(fd)

    def _fsync_file(self, path: str) -> None:
        fd = self._open_regular(path)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

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
        try:
            with self._run.directory(staging):
                pass
        except (FileNotFoundError, NotADirectoryError):
            raise SharedStorageError(
                f"{who} on host {socket.gethostname()} cannot see the staging dir {staging} of {step_dir} "
                f"(txid {txid}): on local disk every participant must share the coordinator's filesystem "
                "(NFS, Lustre, ...); use an object store (s3://...) when they do not"
            ) from None

    def prepare_step(self, step_dir: str, txid: str) -> bool:
        """A symlink (or FIFO, ...) in the step's place counts as committed: a corrupt bundle, refused
        unless the caller moves it aside (`replace_corrupt`), and never followed to decide."""
        final = self.path(step_dir)
        kind = self._kind_at(final)
        if kind not in (None, FILE, DIRECTORY) or self.exists(f"{final}/{COMMIT_NAME}"):
            return True
        if kind is not None:  # a step dir without COMMIT is debris; the claim makes it ours
            log.warning("removing %s: no COMMIT, and this transaction holds the step's claim", final)
            self.remove_tree(final)
        with self._run.directory(self.data_root(step_dir, txid), create=True):
            pass
        return False

    def staged_sizes(self, inv: Inventory, step: int, txid: str) -> dict[str, int]:
        return dict(inv.tmp_dirs.get(txid, {}))

    def written_view(self, step_dir: str, txid: str) -> Listing:
        return self.bundle_view(self.list_files(self.data_root(step_dir, txid)), txid)  # renamed into place whole

    def create_marker(self, path: str, data: bytes) -> None:
        """O_EXCL: the name appears at once, atomically; no temp file, no fsync (markers need no durability)."""
        with self._run.parent(path, create=True) as (dir_fd, name):
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                raise named(exc, path) from None
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
        with self._nothing_in_the_way(path), self._new_file(path) as (_fd, pinned):
            return self.fs.open(pinned, "wb")

    def finish_write(self, raw: Any, path: str, ok: bool) -> PendingWrite | None:
        raw.close()
        if ok:
            return PendingWrite(complete=functools.partial(self._fsync_file, path))
        with contextlib.suppress(FileNotFoundError):
            self.remove_file(path)
        return None

    def reuse_file(self, source: str, target: str, size: int) -> bool:
        """A hard link to the source's inode: the bytes are stored once for both bundles, and each name keeps
        them for as long as its bundle does (deleting the older bundle unlinks its name only). The source is
        opened beneath the root (a symlink or a non-regular file is not taken) and linked through that open
        descriptor, so what is linked is the file that was checked. Its data is durable already (fsynced when
        its bundle committed); the new name becomes durable with the staging dir's fsync at commit."""
        try:
            fd = self._open_regular(source)
        except (FileNotFoundError, IrregularFileError):
            return False
        try:
            if os.fstat(fd).st_size != size:
                return False
            with self._nothing_in_the_way(target), self._run.parent(target, create=True) as (dir_fd, name):
                with contextlib.suppress(FileNotFoundError):  # a dead attempt's file there (a replica resumed)
                    os.unlink(name, dir_fd=dir_fd)
                try:  # linkat(2) of the open file (its /proc/self/fd link, followed) into the pinned directory
                    os.link(pinned_path(fd), name, dst_dir_fd=dir_fd, follow_symlinks=True)
                except OSError as exc:
                    if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOENT, errno.ENOTSUP):
                        return False  # another filesystem, no hard links here, too many links: write it
                    raise named(exc, target) from None
            return True
        finally:
            os.close(fd)

    def make_durable(self, path: str) -> None:
        """fsync: a file is written in place here, and one a dead writer left may never have been synced."""
        self._fsync_file(path)

    def make_visible(self, step_dir: str, txid: str, manifest: bytes, commit: bytes) -> None:
        staging = self.data_root(step_dir, txid)
        try:
            with self._run.directory(staging) as staging_fd:
                for name, data in ((MANIFEST_NAME, manifest), (COMMIT_NAME, commit)):
                    with self._new_file(f"{staging}/{name}") as (fd, pinned):
                        self.fs.pipe_file(pinned, data)
                        os.fsync(fd)
                fsync_tree(staging_fd)
        except (FileNotFoundError, NotADirectoryError):
            raise LostWriteError(
                f"{step_dir}: staging dir {staging} is gone (removed by gc?); nothing committed"
            ) from None
        final = self.path(step_dir)
        try:
            self._rename(staging, final)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                raise BundleExistsError(f"{final} already exists: another writer committed this step") from exc
            raise

    def _rename(self, source: str, target: str, create_target_dir: bool = False) -> None:
        """rename(2) between two directories beneath the root, each reached without following a symlink; the
        target's directory is fsynced (the new name is durable), and the source's when it differs."""
        with (
            self._run.parent(source) as (src_fd, src_name),
            self._run.parent(target, create=create_target_dir) as (dst_fd, dst_name),
        ):
            try:
                os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as exc:
                raise named(exc, f"{source} -> {target}") from exc
            os.fsync(dst_fd)
            if not os.path.samestat(os.fstat(src_fd), os.fstat(dst_fd)):
                os.fsync(src_fd)

    def discard(self, step_dir: str, txid: str | None) -> None:
        staging = self.transaction_data(step_dir, txid)
        if staging is not None:
            self.remove_tree(staging)

    def delete_bundle(self, step_dir: str) -> None:
        doomed = self.path(TMP_DIR, f"delete-{uuid.uuid4().hex}")
        self._rename(self.path(step_dir), doomed, create_target_dir=True)  # atomic: invisible at once
        self.remove_tree(doomed)

    def quarantine(self, step_dir: str, name: str) -> str:
        target = self.path(QUARANTINE_DIR, name)
        self._rename(self.path(step_dir), target, create_target_dir=True)  # atomic: the step is free, the bundle kept
        return target


class _OpenFile(HeldFile):
    """A stored file held open: each read is one preadv (a READ_CHUNK at a time) on its fd."""

    def __init__(self, backend: Backend, path: str, fd: int) -> None:
        super().__init__(backend, path)
        self._fd: int | None = fd

    def read_into(self, view: memoryview, start: int, on_chunk: Callable[[memoryview], object] | None = None) -> int:
        if self._fd is None:
            raise ValueError("read of a held file after it was let go")
        return _read_chunks(self._fd, view, start, on_chunk)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


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
