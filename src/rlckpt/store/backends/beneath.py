"""Paths beneath a local run root, reached without following a symlink.

Whoever can write a run directory can put a symlink where rlckpt expects one of its own directories
(`_txn/`, `_tmp/<txid>/`, a directory inside a bundle). A path handed to the OS is resolved anew at
every call, so a check of it proves nothing a moment later. Here every directory beneath the root is
opened one component at a time from the root's descriptor with O_NOFOLLOW, and the operation then
names its target relative to that descriptor (openat, mkdirat, unlinkat, renameat, rmtree's dir_fd):
nothing anyone renames or symlinks meanwhile can make it act outside the run. The root itself may be
a symlink: it is the path the user chose.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Iterator

from rlckpt.errors import IrregularFileError
from rlckpt.store.records.inventory import DIRECTORY, FILE, ListedPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Where Linux shows a process's open files: `/proc/self/fd/<n>` opens the very file `n` is, by no name.
_FD_DIR = "/proc/self/fd"


def kind_of(mode: int) -> str:
    """What a stat mode is: file, directory, symlink, fifo, socket or device."""
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


def refusal(path: str, kind: str) -> IrregularFileError:
    """The one-line refusal of a path inside a run that is not what rlckpt put there."""
    if kind == "symlink":
        return IrregularFileError(f"{path} is a symlink: rlckpt never follows a symlink inside a run")
    return IrregularFileError(f"{path} is a {kind}, not a regular file or directory rlckpt made")


def named(exc: OSError, path: str) -> OSError:
    """`exc` again, naming the whole path (an *at() call names only the last component)."""
    renamed = type(exc)(exc.errno, exc.strerror, path)
    renamed.__cause__ = exc.__cause__
    return renamed


def pinned_path(fd: int) -> str:
    """A path that opens exactly the file open as `fd`, whatever is renamed or symlinked meanwhile: for code
    that only takes paths (fsspec's filesystem, which the crash tests wrap to inject faults)."""
    if not _fd_dir_mounted():
        raise OSError(errno.ENOENT, f"{_FD_DIR} is not mounted: local runs need Linux's /proc", _FD_DIR)
    return f"{_FD_DIR}/{fd}"


@functools.cache
def _fd_dir_mounted() -> bool:
    return os.path.isdir(_FD_DIR)


class RunRoot:
    """The root of one local run; full paths given to it must lie beneath the root (or be it)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _parts(self, path: str) -> list[str]:
        if path == self.root:
            return []
        if not path.startswith(self.root + "/"):
            raise ValueError(f"{path} is not beneath the run root {self.root}")
        return path[len(self.root) + 1 :].split("/")

    @contextlib.contextmanager
    def directory(self, path: str, create: bool = False) -> Iterator[int]:
        """A descriptor of directory `path` (closed after the block); with `create`, missing directories are
        made on the way. FileNotFoundError when missing, NotADirectoryError when a regular file is in the
        way, IrregularFileError when a symlink (or a FIFO, socket, device) is: each naming the component."""
        fd = self._open_root(create)
        try:
            walked = self.root
            for part in self._parts(path):
                walked = f"{walked}/{part}"
                nxt = _open_subdir(fd, part, walked, create)
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def _open_root(self, create: bool) -> int:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # following a symlink: the root is the user's path
        try:
            return os.open(self.root, flags)
        except FileNotFoundError:
            if not create:
                raise
        os.makedirs(self.root, exist_ok=True)
        return os.open(self.root, flags)

    @contextlib.contextmanager
    def parent(self, path: str, create: bool = False) -> Iterator[tuple[int, str]]:
        """(descriptor of the directory holding `path`, the last component of `path`), as `directory`."""
        head, _, name = path.rpartition("/")
        with self.directory(head, create) as fd:
            yield fd, name


def _open_subdir(fd: int, name: str, path: str, create: bool) -> int:
    """Open directory `name` in `fd` without following a symlink; with `create`, make it first if missing
    (only then: the common case, a directory that exists, costs one open)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError as exc:
        if not create:
            raise named(exc, path) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise named(exc, path) from None
        raise _not_a_directory(fd, name, path) from None
    try:
        os.mkdir(name, 0o777, dir_fd=fd)
    except FileExistsError:
        pass  # made meanwhile (by another writer, or something else, which the open below refuses)
    except OSError as exc:
        raise named(exc, path) from None
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise named(exc, path) from None
        raise _not_a_directory(fd, name, path) from None


def _not_a_directory(fd: int, name: str, path: str) -> OSError | IrregularFileError:
    """Why `name` in `fd` could not be opened as a directory: a regular file in the way (NotADirectoryError),
    or a symlink, FIFO, socket or device (refused)."""
    kind = kind_of(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    if kind == FILE:
        return NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    return refusal(path, kind)


def open_for_write(dir_fd: int, name: str, path: str) -> int:
    """A write descriptor of regular file `name` in `dir_fd`, created or emptied; a symlink, FIFO, device
    or a file with other hard links (another name for someone else's file) is refused, never written."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symlink; a FIFO nobody reads
            raise refusal(path, kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)) from None
        raise named(exc, path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        kind = kind_of(st.st_mode)
        raise refusal(path, kind) if kind != FILE else IrregularFileError(f"{path} has other hard links")
    os.ftruncate(fd, 0)
    return fd


def walk(fd: int, prefix: str = "") -> Iterator[ListedPath]:
    """Every path under directory `fd` by lstat: symlinks are reported, never followed; directories are
    listed too. A directory removed or replaced while listed is skipped."""
    with os.scandir(fd) as entries:
        found = list(entries)
    for entry in found:
        rel = f"{prefix}{entry.name}"
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        kind = kind_of(st.st_mode)
        yield ListedPath(rel, kind, st.st_size if kind == FILE else 0, st.st_mtime)
        if kind == DIRECTORY:
            try:
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    continue
                raise
            try:
                yield from walk(sub, rel + "/")
            finally:
                os.close(sub)


def fsync_tree(fd: int) -> None:
    """fsync directory `fd` and every directory beneath it (what a rename publishes must be on disk)."""
    with os.scandir(fd) as entries:
        subdirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    for name in subdirs:
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        try:
            fsync_tree(sub)
        finally:
            os.close(sub)
    os.fsync(fd)
