"""The storage primitives a backend provides. Everything else in the store is written against this
interface and never asks which backend it runs on: a new object store is one subclass.

Paths are full filesystem paths (`root/...`, no protocol); `root` is the run directory or prefix.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from rlckpt.errors import OversizedObjectError
from rlckpt.store.paths.paths import COMMIT_NAME, MANIFEST_NAME
from rlckpt.store.records.inventory import Inventory, ListedPath, group

# The piece of a read handed on to be hashed while it is in cache: large enough for BLAKE3's threads to
# share, small enough to stay in a core's cache.
READ_CHUNK = 4 << 20


@dataclass(frozen=True)
class Listing:
    """The files under one directory/prefix: relpath -> stored size, plus paths that are not regular files
    and (in a bundle's view of its step) files that lie outside the bundle's data but where only it may write."""

    sizes: dict[str, int]
    irregular: dict[str, str]
    strangers: tuple[str, ...] = ()


def _nothing() -> None:
    return None


class HeldFile:
    """A stored file held for several reads of its pieces (`Backend.hold`): local disk keeps one open file for
    them all; elsewhere each read is a request of its own, as `Backend.read_into` makes it."""

    def __init__(self, backend: Backend, path: str) -> None:
        self._backend = backend
        self._path = path

    def read_into(self, view: memoryview, start: int, on_chunk: Callable[[memoryview], object] | None = None) -> int:
        """`Backend.read_into` of the held file."""
        return self._backend.read_into(self._path, view, start, on_chunk)

    def peek_into(self, view: memoryview, start: int) -> int:
        """Bytes from `start` into `view` without moving what `read_into` reads next (a look at what lies ahead)."""
        return self.read_into(view, start)

    def close(self) -> None:
        """Let the file go (nothing to do unless the backend opened it)."""


@dataclass(frozen=True)
class PendingWrite:
    """What is left of a kept file once `finish_write` returned: `complete()` makes it durable (local disk: its
    fsync; S3: the last requests of its upload), run by the writer in the background beside writing and hashing
    its next files, and waited for before it seals or commits; it raises if that failed. `in_place` says whether
    readers (and a listing) see the file already, before `complete()` (local disk), or only after it (S3).
    `abandon()` is called instead when the writer aborts before `complete()` ran: the file must then never
    appear, and nothing of it may be left in flight (an abort removes what it finds right after)."""

    complete: Callable[[], None]
    abandon: Callable[[], None] = _nothing
    in_place: bool = True


@dataclass(frozen=True)
class CommitView:
    """What a reader fetched to decide whether a step is visible: the bytes of COMMIT and manifest.json
    (None when missing) and, when asked for, a listing of the step taken at about the same time."""

    marker: bytes | None
    manifest: bytes | None
    listing: Listing | None = None
    early: bool = False  # manifest/listing fetched beside COMMIT, not after it: may predate the commit


class Backend(abc.ABC):
    """One run location on one kind of storage."""

    local: ClassVar[bool] = False  # atomic directory rename (True) or marker-last in place (False)
    # a read of a few bytes costs a system call, not a request: a reader may look at a file's end before the file
    small_reads_cheap: ClassVar[bool] = False
    # a held file's consecutive reads are one request (`hold`): a reader may read a file's pieces in order
    streams_in_order: ClassVar[bool] = False

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = root

    def path(self, *parts: str) -> str:
        """A full path under the run root."""
        return "/".join([self.root, *parts])

    def rel(self, path: str) -> str:
        """The run-relative form of a full path under the root."""
        return path[len(self.root) + 1 :] if path.startswith(self.root + "/") else path

    # --- the store as a whole -----------------------------------------------------------------
    @abc.abstractmethod
    def check_reachable(self, url: str) -> None:
        """Raise StoreUnavailableError when the location cannot hold a run (no bucket, a file in the way)."""

    @abc.abstractmethod
    def create_exclusive_enforced(self) -> bool:
        """Whether the storage refuses a second create-exclusive write of one path."""

    @abc.abstractmethod
    def list_run(self) -> Iterable[ListedPath]:
        """Every path under the root, flat (one paginated LIST on object stores)."""

    def scan(self) -> Inventory:
        """The run's listing grouped by what each path belongs to."""
        return group(self.list_run(), self.root)

    # --- small objects --------------------------------------------------------------------------
    @abc.abstractmethod
    def read_capped(self, path: str, limit: int) -> bytes:
        """Up to `limit + 1` bytes of an object (FileNotFoundError if missing; IrregularFileError if it is
        not a regular file). Callers use `read_object`, which refuses the extra byte."""

    def read_object(self, path: str, limit: int, what: str) -> bytes:
        """A whole small object, refused with OversizedObjectError if larger than `limit` bytes: no object
        in a run can make a reader allocate more than its cap."""
        data = self.read_capped(path, limit)
        if len(data) > limit:
            raise OversizedObjectError(f"{path}: {what} is larger than its cap of {limit} bytes")
        return data

    @abc.abstractmethod
    def create_exclusive(self, path: str, data: bytes) -> None:
        """Write a small object whole, only if it does not exist (FileExistsError if it does). Readers never
        see it partly written."""

    def create_marker(self, path: str, data: bytes) -> None:
        """Create a small object only if it does not exist (FileExistsError if it does), without the
        durability of create_exclusive: markers coordinate live processes, and a crash leaves debris."""
        self.create_exclusive(path, data)

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether an object (or, locally, any directory entry, symlinks included) is at `path`; locally,
        nothing under a symlink is inside the run, so nothing is there."""

    @abc.abstractmethod
    def mtime(self, path: str) -> float | None:
        """The object's modification time (unix seconds, the storage's clock); FileNotFoundError if missing."""

    @abc.abstractmethod
    def remove_file(self, path: str) -> None:
        """Delete one object; FileNotFoundError if it is not there."""

    @abc.abstractmethod
    def remove_tree(self, path: str) -> None:
        """Delete everything at and under `path` (a missing path is fine); never follows a symlink."""

    def remove_listed(self, path: str, rels: Iterable[str]) -> None:
        """Delete directory/prefix `path`, whose files `rels` (relative to it) a listing just found.
        Object stores delete exactly those keys, in batches, without listing again (what appeared since
        stays for gc); local disk removes the directory."""
        self.remove_tree(path)

    # --- bundle files ---------------------------------------------------------------------------
    @abc.abstractmethod
    def list_files(self, path: str) -> Listing:
        """The files under directory/prefix `path`, relative to it (empty when it does not exist)."""

    @abc.abstractmethod
    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a stored file (fewer if it is shorter)."""

    def hold(self, path: str) -> HeldFile:
        """`path` held for reads of many small pieces in turn (a reader placing a file's items one by one)."""
        return HeldFile(self, path)

    def read_into(
        self, path: str, view: memoryview, start: int = 0, on_chunk: Callable[[memoryview], object] | None = None
    ) -> int:
        """Fill `view` with stored bytes of `path` from offset `start` (fewer at the end of the file), handing
        each piece to `on_chunk` as it lands, while it is still in cache (readers hash it there). Returns the
        bytes read. Object stores fetch the whole range in one GET; local disk reads it in place."""
        data = self.read_range(path, start, start + len(view))
        view[: len(data)] = data
        if on_chunk is not None:
            for at in range(0, len(data), READ_CHUNK):
                on_chunk(view[at : min(at + READ_CHUNK, len(data))])
        return len(data)

    def fetch_commit_view(
        self, step_dir: str, marker_limit: int, manifest_limit: int, with_listing: bool, in_order: bool = True
    ) -> CommitView:
        """COMMIT, then manifest and (optionally) the step's listing. Object stores override this to fetch
        all three in one round trip unless `in_order` is asked for."""
        marker = self.read_or_none(self.path(step_dir, COMMIT_NAME), marker_limit, COMMIT_NAME)
        if marker is None:
            return CommitView(None, None)
        manifest = self.read_or_none(self.path(step_dir, MANIFEST_NAME), manifest_limit, MANIFEST_NAME)
        listing = self.list_files(self.path(step_dir)) if with_listing else None
        return CommitView(marker, manifest, listing)

    def read_or_none(self, path: str, limit: int, what: str) -> bytes | None:
        """read_object, or None when the object does not exist."""
        try:
            return self.read_object(path, limit, what)
        except FileNotFoundError:
            return None

    # --- writing a transaction ------------------------------------------------------------------
    @abc.abstractmethod
    def data_root(self, step_dir: str, txid: str) -> str:
        """Where a transaction's files go while it runs: a staging dir (local) or its own prefix under the
        step (object stores), so that nothing written under another txid can land among its files."""

    @abc.abstractmethod
    def bundle_root(self, step_dir: str, txid: str) -> str:
        """Where the files of the bundle committed by `txid` are read from."""

    @abc.abstractmethod
    def bundle_view(self, step_listing: Listing, txid: str) -> Listing:
        """From a listing of a whole step, the files of the bundle committed by `txid`, relative to its
        bundle root, with whatever else an intact bundle cannot hold as strangers (manifest and COMMIT
        excluded). Data of other transactions of the step (zombies, dead writers) is not the bundle's."""

    def foreign_data(self, inv: Inventory, step: int, owner: str | None) -> list[str]:
        """Paths of data in `step` that belong to no transaction but `owner` (debris for gc); none where
        a step's directory only ever appears whole (local disk)."""
        return []

    @abc.abstractmethod
    def transaction_data(self, step_dir: str, txid: str | None) -> str | None:
        """Where a (possibly dead) transaction's files are, or None when that cannot be known (an unreadable
        intent names no txid, and a local staging dir is named by txid)."""

    def check_joinable(self, step_dir: str, txid: str, who: str) -> None:
        """Raise SharedStorageError if a participant here cannot write into the transaction's data root
        (on object stores nothing needs to be shared)."""
        return None

    @abc.abstractmethod
    def prepare_step(self, step_dir: str, txid: str) -> bool:
        """Called once the step is claimed: True if it is already committed; otherwise make the data root
        ready (remove a dead writer's leftovers, which the claim now makes ours)."""

    def staged_sizes(self, inv: Inventory, step: int, txid: str) -> dict[str, int]:
        """The files a running transaction has written so far, from a run inventory (for `ls`)."""
        return dict(inv.steps.get(step, {}))

    @abc.abstractmethod
    def open_write(self, path: str) -> Any:
        """A writable binary file that publishes nothing until finish_write(ok=True)."""

    @abc.abstractmethod
    def finish_write(self, raw: Any, path: str, ok: bool) -> PendingWrite | None:
        """Keep (ok) or discard the file opened by open_write. May return what is left to make a kept file
        durable and visible (PendingWrite), for the writer to run in the background, beside writing and
        hashing its next file, and to wait for before it seals or commits."""

    def reuse_file(self, source: str, target: str, size: int) -> bool:
        """Put the committed file `source` (of `size` bytes) at `target` in a transaction's data root without
        sending its bytes again, as the storage itself shares or copies them; False when it cannot (the
        source is gone or of another size, or the storage has no such operation), and the writer then
        writes the bytes. Nothing is left at `target` when this returns False."""
        return False

    def make_durable(self, path: str) -> None:
        """Make a file already in a transaction's data root as durable as finish_write(ok=True) makes one it
        wrote: a replica resumed keeps files a dead attempt wrote (BundleTransaction.adopt). Object stores
        have nothing to do: an object exists only once its upload completed."""
        return None

    def written_view(self, step_dir: str, txid: str) -> Listing:
        """What readers will see of the bundle once transaction `txid` commits, from a listing taken now
        where they will take theirs: the commit checks it with the readers' own listing check."""
        return self.bundle_view(self.list_files(self.path(step_dir)), txid)

    @abc.abstractmethod
    def make_visible(self, step_dir: str, txid: str, manifest: bytes, commit: bytes) -> None:
        """Write manifest and COMMIT and make the bundle visible atomically (the commit primitive)."""

    @abc.abstractmethod
    def discard(self, step_dir: str, txid: str | None) -> None:
        """Remove everything a transaction wrote (the caller holds the step's claim; nothing is committed)."""

    @abc.abstractmethod
    def delete_bundle(self, step_dir: str) -> None:
        """Delete a committed bundle so that it turns invisible first (COMMIT gone) and then disappears."""

    @abc.abstractmethod
    def quarantine(self, step_dir: str, name: str) -> str:
        """Move a committed bundle out of the step namespace to `_quarantine/<name>/` (invisible first);
        return where it went. Used for corrupt bundles, which are kept for inspection, never deleted."""

    # --- incomplete uploads (object stores that have them) ---------------------------------------
    def incomplete_uploads(self) -> list[tuple[str, str]]:
        """(key, upload id) of incomplete multipart uploads under the run; none on most backends."""
        return []

    def abort_upload(self, key: str, upload_id: str) -> None:
        """Abort one incomplete multipart upload."""
        raise NotImplementedError(f"{type(self).__name__} has no multipart uploads")
