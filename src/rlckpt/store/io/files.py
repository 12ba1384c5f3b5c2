"""FileWriter: streams the files of one transaction into its data root, hashing (and compressing) as they
go. The coordinator's BundleTransaction and every participant's ParticipantWriter are one each."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

from rlckpt.errors import (
    CorruptBundleError,
    InvalidPathError,
    LostWriteError,
    NewerFormatError,
    TransactionStateError,
)
from rlckpt.formats import quoted
from rlckpt.store.backends import Backend, PendingWrite
from rlckpt.store.io.buffers import READ_BUFFERS
from rlckpt.store.io.compression import DEFAULT_LEVEL, check_compression
from rlckpt.store.io.hashing_writer import HashingWriter
from rlckpt.store.io.reuse import ReuseBase, Spool, unchanged
from rlckpt.store.io.storage_errors import describe_cause, unavailable_as_store_error
from rlckpt.store.paths.path_set import PathSet
from rlckpt.store.paths.paths import COMMIT_NAME, join_relpath, step_dirname, validate_relpath
from rlckpt.store.records.manifest import COMMIT_MAX_BYTES, CommitMarker, FileEntry

log = logging.getLogger(__name__)

COPY_CHUNK = 8 << 20

# What a failed background finish may leave to the commit's listing check, by whether the file was in place.
_LEFT_TO_THE_LISTING: dict[bool, tuple[type[BaseException], ...]] = {True: (FileNotFoundError,), False: ()}


class FileWriter:
    """Writes files into the data root of transaction `txid` of `step`; `who` names the writer in errors. Given
    a `base` (reuse.py), a file whose stored bytes are the base's file of the same path is taken from it instead
    of written again."""

    def __init__(
        self,
        backend: Backend,
        url: str,
        step: int,
        txid: str,
        max_workers: int,
        who: str,
        base: ReuseBase | None = None,
    ) -> None:
        self.backend = backend
        self.url = url
        self.step = step
        self.txid = txid
        self.max_workers = max_workers
        self.who = who
        self._step_dir = step_dirname(step)
        self._data_root = backend.data_root(self._step_dir, txid)
        self._files: dict[str, FileEntry] = {}
        self.base = base
        self._reused: set[str] = set()  # the files of `_files` taken from the base
        self._open: dict[str, HashingWriter] = {}
        self._paths = PathSet()  # every name above: written or open
        self._lock = threading.Lock()
        # Kept files still being made durable (an fsync, the last requests of an upload), beside the writing and
        # hashing of the next ones.
        self._syncing: list[tuple[str, Future[None], PendingWrite]] = []
        self._sync_pool: ThreadPoolExecutor | None = None
        self._failed: tuple[str, BaseException] | None = None  # the first of those that failed
        self._state = "open"

    @contextlib.contextmanager
    def _storage(self, what: str) -> Iterator[None]:
        """Around every storage call: an unreachable store or a denied write becomes StoreUnavailableError,
        and a file of ours vanishing (an upload aborted behind our back) becomes LostWriteError."""
        try:
            with unavailable_as_store_error(self.url, f"{what} of step {self.step}"):
                yield
        except FileNotFoundError as exc:
            raise LostWriteError(
                f"step {self.step} at {self.url}: {what}: {describe_cause(exc)} "
                f"(removed behind this {self.who}'s back, e.g. an upload aborted by gc); nothing will be committed"
            ) from exc

    @property
    def files(self) -> dict[str, FileEntry]:
        """Files written so far (relpath -> entry)."""
        with self._lock:
            return dict(self._files)

    @property
    def reused(self) -> dict[str, FileEntry]:
        """The files of `files` taken from the base rather than written (relpath -> entry)."""
        with self._lock:
            return {rel: self._files[rel] for rel in sorted(self._reused)}

    def _check_open(self) -> None:
        if self._state != "open":
            raise TransactionStateError(f"{self.who} of step {self.step} (txid {self.txid}) is already {self._state}")

    def _reserve(self, relpath: str) -> None:
        """Refuse duplicates and file/directory clashes before any byte of `relpath` is written (the
        caller holds the lock). O(depth of the path), however many files were written before."""
        clash = self._paths.add(relpath)
        if clash is None:
            return
        if clash.duplicate:
            raise InvalidPathError(f"{quoted(relpath)} was already written in step {self.step}")
        if relpath.startswith(clash.other + "/"):
            raise InvalidPathError(f"{quoted(relpath)} lies under {quoted(clash.other)}, a file of step {self.step}")
        raise InvalidPathError(f"{quoted(relpath)} is a directory of other files in step {self.step}")

    def _release(self, relpath: str) -> None:
        """A write of `relpath` that failed or was discarded frees its name (the caller holds the lock)."""
        self._paths.remove(relpath)

    # --- writing --------------------------------------------------------------------------------
    def open(
        self,
        relpath: str,
        compression: str | None = None,
        level: int = DEFAULT_LEVEL,
        only_if_pays: bool = False,
        may_reuse: bool = True,
    ) -> BinaryIO:
        """A writable binary stream for `relpath`; digest computed while streaming. Close it to keep the file.
        `only_if_pays`: `compression` is tried on the file's start, and the file stored raw if it does not pay
        (its entry says which). `may_reuse=False`: written as it comes even with a base (the caller knows the
        base's file will not do, as a copy that tried `take_unchanged`)."""
        validate_relpath(relpath)
        check_compression(compression)
        with self._lock:
            self._check_open()
            if self._failed is not None:  # a file finishing in the background failed: nothing will be committed
                relpath_failed, failure = self._failed
                with self._storage(f"syncing {relpath_failed}"):
                    raise failure
            self._reserve(relpath)
            path = f"{self._data_root}/{relpath}"
            try:
                held = may_reuse and self.base is not None and relpath in self.base.files  # until known unchanged
                if held:
                    raw: Any = Spool(functools.partial(self.backend.open_write, path))
                else:
                    with self._storage(f"opening {relpath}"):
                        raw = self.backend.open_write(path)
            except BaseException:
                self._release(relpath)
                raise
            writer = HashingWriter(
                raw,
                relpath,
                self._on_close,
                compression=compression,
                level=level,
                guard=self._storage,
                only_if_pays=only_if_pays,
            )
            self._open[relpath] = writer
        return writer  # type: ignore[return-value]

    def _on_close(self, writer: HashingWriter, entry: FileEntry | None) -> None:
        with self._lock:
            self._open.pop(writer.relpath, None)
            live = self._state == "open"
        keep = entry is not None and live
        path = f"{self._data_root}/{writer.relpath}"
        durable = None
        reused = False
        try:
            with self._storage(f"{'finishing' if keep else 'discarding'} {writer.relpath}"):
                raw = writer.raw
                if isinstance(raw, Spool):
                    raw, reused = self._settle_spool(raw, writer.relpath, entry if keep else None)
                if raw is not None:
                    durable = self.backend.finish_write(raw, path, ok=keep)
        except BaseException:
            keep = False
            raise
        finally:
            with self._lock:
                if keep:
                    self._files[writer.relpath] = entry  # type: ignore[assignment]
                    if reused:
                        self._reused.add(writer.relpath)
                else:
                    self._release(writer.relpath)
        if durable is not None:
            self._in_background(writer.relpath, durable)

    def _settle_spool(self, spool: Spool, relpath: str, entry: FileEntry | None) -> tuple[Any, bool]:
        """A held file closed (`entry`) or discarded (None): (the real file to finish, or None; whether the base's
        file was taken instead). The base's file is taken when the bytes are exactly its bytes and the storage can
        share or copy it; otherwise the held bytes go to storage now."""
        if entry is not None and not spool.spilled and self._take_from_base(relpath, entry):
            spool.drop()
            return None, True
        if entry is None and spool.real is None:
            spool.drop()
            return None, False
        try:
            return spool.take_real(), False
        except BaseException:
            if spool.real is not None:
                with contextlib.suppress(Exception):
                    self.backend.finish_write(spool.real, f"{self._data_root}/{relpath}", ok=False)
            raise

    def _take_from_base(self, relpath: str, entry: FileEntry) -> bool:
        """Put the base's file `relpath` in place as this writer's, if `entry` (what this writer would store)
        is the base's entry of it and the storage shares or copies it; False: nothing is in place."""
        assert self.base is not None
        if not unchanged(entry, self.base.files, relpath):
            return False
        source = f"{self.backend.bundle_root(step_dirname(self.base.step), self.base.txid)}/{relpath}"
        target = f"{self._data_root}/{relpath}"
        if self.backend.reuse_file(source, target, entry.size):
            if not self.backend.local or self._base_still_committed():
                return True
            self.backend.remove_file(target)  # perhaps another bundle's file: the caller writes the bytes
        log.info("%s: %s of %s is gone; writing it", self.who, relpath, self.base.describe())
        return False

    def take_unchanged(self, relpath: str, entry: FileEntry) -> bool:
        """Count the base's file `relpath` as written with `entry`, without its bytes, when `entry` is the base's
        entry of it: for a writer that knows a file's digest before it has its bytes (a copy, from the source's
        manifest). Returns whether it was taken; if not, nothing is in place and the caller writes the file."""
        validate_relpath(relpath)
        if self.base is None or not unchanged(entry, self.base.files, relpath):
            return False
        with self._lock:
            self._check_open()
            self._reserve(relpath)
        taken = False
        try:
            with self._storage(f"taking {relpath} from {self.base.describe()}"):
                taken = self._take_from_base(relpath, entry)
        finally:
            with self._lock:
                if taken:
                    self._files[relpath] = entry
                    self._reused.add(relpath)
                else:
                    self._release(relpath)
        return taken

    def _base_still_committed(self) -> bool:
        """Whether the base's COMMIT still names its txid. On local disk its files lie in the step's directory,
        which another bundle of that step may take once the base is deleted: a link made before this returns
        True was to the base's own file (that directory was the base's from before this save began until now)."""
        assert self.base is not None
        marker = self.backend.read_or_none(
            self.backend.path(step_dirname(self.base.step), COMMIT_NAME), COMMIT_MAX_BYTES, COMMIT_NAME
        )
        try:
            return marker is not None and CommitMarker.from_bytes(marker).txid == self.base.txid
        except (CorruptBundleError, NewerFormatError):
            return False  # not the base's COMMIT any more, whatever it is

    def _in_background(self, relpath: str, pending: PendingWrite) -> None:
        """Make a kept file durable on the writer's finishing threads (as many as its writing threads, so that
        `put_dir` finishes as many files at once as it writes), while the caller goes on to its next file: the
        disk flushes one file, or its last parts upload, while the next is written and hashed."""
        with self._lock:
            aborted = self._state == "aborted"  # an abort came between this file's close and here
            if not aborted:
                if self._sync_pool is None:
                    self._sync_pool = ThreadPoolExecutor(
                        max_workers=self.max_workers, thread_name_prefix="rlckpt-finish"
                    )
                done = self._sync_pool.submit(pending.complete)
                self._syncing.append((relpath, done, pending))
        if aborted:
            pending.abandon()
        else:
            done.add_done_callback(functools.partial(self._note_failure, relpath, pending.in_place))

    def _note_failure(self, relpath: str, in_place: bool, done: Future[None]) -> None:
        """Remember the first file that failed to finish as `_wait_durable` would fail: the writer's next `open`
        raises it at once."""
        failure = None if done.cancelled() else done.exception()
        if failure is None or isinstance(failure, _LEFT_TO_THE_LISTING[in_place]):
            return
        with self._lock:
            if self._failed is None:
                self._failed = (relpath, failure)

    def _wait_durable(self) -> None:
        """Every kept file durable: waits for every background finish, then raises the first failure, naming the
        file (then nothing may be sealed or committed, and nothing is left in flight for the abort that
        follows). A file in place removed behind the writer's back before its fsync is left to the commit's
        listing check, which names it as every reader would; an upload that cannot complete because gc aborted
        it is a LostWriteError naming the file and the cause."""
        with self._lock:
            pending, self._syncing = self._syncing, []
        failure: BaseException | None = None
        for relpath, done, write in pending:
            try:
                with self._storage(f"syncing {relpath}"), contextlib.suppress(*_LEFT_TO_THE_LISTING[write.in_place]):
                    done.result()
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def _settle_background(self) -> None:
        """An abort: what has not begun to finish is abandoned (it will never appear), what has is waited for;
        afterwards nothing of this writer is in flight, so what the abort lists is all there is to remove."""
        with self._lock:
            pending, self._syncing = self._syncing, []
        for relpath, done, write in pending:
            try:
                if done.cancel():
                    write.abandon()
                else:
                    done.result()
            except BaseException:
                log.warning("%s: finishing %s of step %s failed during an abort", self.who, relpath, self.step)

    def write_bytes(self, relpath: str, data: bytes, compression: str | None = None) -> FileEntry:
        """Write a whole file from memory; readers see it in place when this returns (its durability may still
        be under way: local disk fsyncs in the background). A stream's file, from `open`, `put_file` or
        `put_dir`, may appear only as it finishes in the background (an S3 upload), which the seal or commit
        waits for."""
        with self.open(relpath, compression=compression) as stream:
            stream.write(data)
        self._wait_in_place(relpath)
        return self._files[relpath]

    def _wait_in_place(self, relpath: str) -> None:
        """Wait until the kept file `relpath` is in place, if finishing it in the background puts it there
        (raises, naming it, if that failed)."""
        with self._lock:
            found = [done for rel, done, pending in self._syncing if rel == relpath and not pending.in_place]
        for done in found:
            with self._storage(f"syncing {relpath}"):
                done.result()

    def put_file(self, relpath: str, local_path: str | os.PathLike[str], compression: str | None = None) -> FileEntry:
        """Copy a local file in, through a reused buffer, hashing (and compressing) each piece as it passes."""
        local_path = os.fspath(local_path)
        if not os.path.isfile(local_path):
            raise FileNotFoundError(f"put_file source {local_path} is not a file")
        with (
            open(local_path, "rb") as src,
            READ_BUFFERS.lent(COPY_CHUNK) as buf,
            self.open(relpath, compression=compression) as dst,
        ):
            while n := src.readinto(buf):
                dst.write(buf[:n])
        return self._files[relpath]

    def put_dir(
        self,
        relpath: str,
        local_dir: str | os.PathLike[str],
        compression: str | None = None,
        max_workers: int | None = None,
    ) -> dict[str, FileEntry]:
        """Copy every file under `local_dir` to `relpath/...` ('' = bundle root), many files in parallel."""
        if relpath:
            validate_relpath(relpath)
        local_dir = os.fspath(local_dir)
        if not os.path.isdir(local_dir):
            raise NotADirectoryError(f"put_dir source {local_dir} is not a directory")
        jobs: list[tuple[str, str]] = []
        for dirpath, _dirs, names in os.walk(local_dir):
            for name in sorted(names):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, local_dir).replace(os.sep, "/")
                jobs.append((join_relpath(relpath, rel), full))
        workers = max_workers or self.max_workers
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs) or 1))) as pool:
            futures = [pool.submit(self.put_file, rel, full, compression) for rel, full in jobs]
            results = [f.result() for f in futures]  # re-raises the first failure (others finish first)
        return {rel: entry for (rel, _full), entry in zip(jobs, results, strict=True)}

    # --- ending ---------------------------------------------------------------------------------
    def _close_writes(self, state: str) -> dict[str, FileEntry]:
        """Move to `state` (committing, sealing) once no file is still being written, so that no write
        can begin while the writer's files are checked and published; the files written."""
        with self._lock:
            self._check_open()
            if self._open:
                still = sorted(self._open)
                raise TransactionStateError(f"{self.who} of step {self.step}: files still open: {still}")
            self._state = state
            return dict(self._files)

    def _stop(self, state: str) -> list[HashingWriter]:
        """Move to `state` (no more writes); returns the writers still open, for the caller to discard. Files
        still finishing in the background are settled first (an abort leaves none of them in flight)."""
        with self._lock:
            self._state = state
            writers = list(self._open.values())
        self._settle_background()
        with self._lock:
            pool, self._sync_pool = self._sync_pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        return writers

    def _discard_open(self, writers: list[HashingWriter]) -> None:
        for writer in writers:
            try:
                writer.discard()
            except Exception:
                log.warning("discarding open file %s of step %s failed", writer.relpath, self.step, exc_info=True)
