"""Bundle: read access to one committed, checked step. Every read checks the stored bytes' size and digest
(under the algorithm the manifest names for the file) before any byte reaches the caller (callers
unpickle what they get), and inflates zstd entries only to the manifest's logical size. Bytes are
hashed as they arrive, in one pass: no read goes over a file's bytes a second time to hash them.
Two reads hand bytes over before the check, each saying so: `read_stored` and `read_in_order` (checked
once the last piece has passed: what came before is the caller's to throw away on an error); a read in order
may also `peek` (never checked: to find where things lie in a file, not to parse as data)."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from rlckpt.errors import CorruptBundleError, UnsafeObjectError
from rlckpt.store.backends import Backend, HeldFile
from rlckpt.store.commit.commit_check import check_listing
from rlckpt.store.io.buffers import READ_BUFFERS
from rlckpt.store.io.compression import ONE_SHOT_MAX, DecompressionError, ExactDecompressor, decompress_exact
from rlckpt.store.io.digest import Digest, new_hasher
from rlckpt.store.io.storage_errors import unavailable_as_store_error
from rlckpt.store.paths.paths import step_dirname, validate_relpath
from rlckpt.store.records.manifest import CommitMarker, FileEntry, Manifest

READ_BLOCK_SIZE = 16 << 20  # a streamed read fetches this much at once (one ranged GET on object stores)
SPOOL_MAX = 64 << 20


def _spool(size: int) -> BinaryIO:
    """A temp file for `size` bytes handed to the caller, who closes it: in memory when small, straight
    on disk when larger than SPOOL_MAX (a spooled file would grow in memory first, then copy)."""
    if size > SPOOL_MAX:
        return tempfile.TemporaryFile()
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX)  # type: ignore[return-value]


class Bundle:
    """One committed step, opened by BundleStore.open (which ran the commit check). `commit` is the COMMIT
    that named its manifest (its run and signature), when the opener had it."""

    def __init__(
        self, backend: Backend, url: str, manifest: Manifest, max_workers: int, commit: CommitMarker | None = None
    ) -> None:
        self.backend = backend
        self.url = url
        self.manifest = manifest
        self.commit = commit
        self.step = manifest.step
        self.max_workers = max_workers
        self._step_dir = step_dirname(manifest.step)
        self._root = backend.bundle_root(self._step_dir, manifest.txid)

    def __repr__(self) -> str:
        return f"Bundle(step={self.step}, files={len(self.manifest.files)}, url={self.url!r})"

    def _entry(self, relpath: str) -> FileEntry:
        validate_relpath(relpath)
        try:
            return self.manifest.files[relpath]
        except KeyError:
            raise FileNotFoundError(f"{relpath} is not in step {self.step} at {self.url}") from None

    def _corrupt(self, relpath: str, what: str) -> CorruptBundleError:
        return CorruptBundleError(f"step {self.step} at {self.url}: {relpath} {what}")

    def _check(self, relpath: str, entry: FileEntry, digest: Digest, size: int) -> None:
        if size != entry.size:
            raise self._corrupt(relpath, f"has {size} bytes, the manifest says {entry.size}")
        if digest != entry.digest:
            raise self._corrupt(relpath, f"has {digest}, the manifest says {entry.digest}")

    def _stored(self, relpath: str, read: Callable[[str], Any]) -> Any:
        """Run a backend read of `relpath`'s stored object, naming the file when it is missing or unsafe, and
        the store when it cannot be reached (StoreUnavailableError, as every BundleStore method raises)."""
        try:
            with unavailable_as_store_error(self.url, f"reading {relpath} of step {self.step}"):
                return read(f"{self._root}/{relpath}")
        except FileNotFoundError:
            raise self._corrupt(relpath, "is missing") from None
        except UnsafeObjectError as exc:
            raise self._corrupt(relpath, f"cannot be read safely: {exc}") from None

    def _stream_stored(
        self, relpath: str, sink: Callable[[memoryview], Any], progress: Callable[[int], None] | None
    ) -> None:
        """Stream the stored bytes of `relpath` into `sink` a block at a time, through a reused buffer (ranged
        reads of the manifest's size, no HEAD per file), each piece hashed as it lands; then check size and
        digest. `sink` must not keep the view it is given. A file of another size fails here or in the
        listing check every open() made."""
        entry = self._entry(relpath)
        hasher = new_hasher(entry.digest.algorithm, entry.size)

        def arrived(piece: memoryview) -> None:
            hasher.update(piece)
            sink(piece)
            if progress is not None:
                progress(len(piece))

        size = 0
        with READ_BUFFERS.lent(min(entry.size, READ_BLOCK_SIZE) or 1) as block:
            for start in range(0, entry.size or 1, READ_BLOCK_SIZE):
                want = min(READ_BLOCK_SIZE, entry.size - start) or 1  # an empty file: is there a byte?
                read = functools.partial(self.backend.read_into, view=block[:want], start=start, on_chunk=arrived)
                got = self._stored(relpath, read)
                size += got
                if got < want:
                    break
        self._check(relpath, entry, Digest.of_hasher(entry.digest.algorithm, hasher), size)

    def _stream_logical(
        self, relpath: str, sink: Callable[[memoryview | bytes], Any], progress: Callable[[int], None] | None
    ) -> None:
        """The logical bytes of `relpath` into `sink`, in the one pass that hashes them (and inflates them
        alongside when stored zstd: what the sink gets before the checks end is the caller's to throw away on
        an error). A digest error is reported before a decompression error: bytes that differ from the
        manifest say more."""
        entry = self._entry(relpath)
        if entry.compression is None:
            self._stream_stored(relpath, sink, progress)
            return
        if entry.logical_size <= ONE_SHOT_MAX:  # held whole and inflated in one call, once its digest checked out
            stored = bytearray()
            self._stream_stored(relpath, stored.extend, progress)
            kind = entry.compression
            sink(self._inflate(relpath, lambda: decompress_exact(stored, entry.logical_size, kind)))
            return
        decoder = ExactDecompressor(entry.logical_size, entry.compression)
        problems: list[DecompressionError] = []

        def inflate(piece: memoryview) -> None:
            if not problems:
                try:
                    for out in decoder.feed(piece):
                        sink(out)
                except DecompressionError as exc:
                    problems.append(exc)

        self._stream_stored(relpath, inflate, progress)
        if problems:
            raise self._corrupt(relpath, str(problems[0]))
        last = self._inflate(relpath, decoder.finish)
        if last:
            sink(last)

    def _inflate(self, relpath: str, action: Callable[[], Any]) -> Any:
        """Run a decompression step, turning what the decompressor refuses into CorruptBundleError."""
        try:
            return action()
        except DecompressionError as exc:
            raise self._corrupt(relpath, str(exc)) from None

    # --- reads --------------------------------------------------------------------------------
    def read_bytes(self, relpath: str) -> bytes:
        """The file's logical bytes (decompressed), after its digest was checked. For small files (metadata,
        sidecars); `read_into` reads a large one into a reused buffer.

        Raises:
            FileNotFoundError: `relpath` is not in the manifest.
            CorruptBundleError: the stored bytes or their decompression differ from the manifest.
            StoreUnavailableError: the store cannot be reached (here and in every other read).
        """
        entry = self._entry(relpath)
        data = self._stored(relpath, lambda path: self.backend.read_range(path, 0, entry.size + 1))
        self._check(relpath, entry, Digest.of(data, entry.digest.algorithm), len(data))
        if entry.compression is not None:
            kind = entry.compression
            return self._inflate(relpath, lambda: decompress_exact(data, entry.logical_size, kind))
        return data

    def read_into(self, relpath: str, buffer: bytearray | memoryview) -> memoryview:
        """Read an uncompressed file into `buffer` (at least its size; one byte more notices a longer file),
        hashing each piece as it lands: the view of its bytes, returned after size and digest checked out.
        A buffer reused from one read to the next (`BufferPool`) spares the page faults of fresh memory.

        Raises:
            FileNotFoundError: `relpath` is not in the manifest.
            ValueError: the file is stored compressed (read it with `read_bytes` or `open`), or `buffer` is
                smaller than it.
            CorruptBundleError: the stored bytes differ from the manifest.
        """
        entry = self._uncompressed(relpath, "read_into")
        view = memoryview(buffer).cast("B")
        if len(view) < entry.size:
            raise ValueError(f"a buffer of {len(view)} bytes cannot hold {relpath} ({entry.size} bytes)")
        with InOrderRead(self, relpath, entry) as read:
            got = read.into_at_once(view[: entry.size + 1])
            read.finish()
        return view[:got]

    def read_in_order(self, relpath: str) -> InOrderRead:
        """An uncompressed file read in consecutive pieces, each into memory the caller picks as it goes (a
        reader places a tensor's bytes straight into the tensor that loads them), hashed in order; size and
        digest are checked by its `finish()`, and nothing read may be trusted before that.

        Raises:
            FileNotFoundError: `relpath` is not in the manifest.
            ValueError: the file is stored compressed.
        """
        return InOrderRead(self, relpath, self._uncompressed(relpath, "read_in_order"))

    def _uncompressed(self, relpath: str, reader: str) -> FileEntry:
        """The manifest entry of `relpath`, which `reader` reads as stored: ValueError when it is compressed."""
        entry = self._entry(relpath)
        if entry.compression is not None:
            raise ValueError(
                f"{relpath} of step {self.step} is stored {entry.compression}: {reader} takes uncompressed files"
            )
        return entry

    def read_stored(
        self, relpath: str, sink: Callable[[memoryview], Any], progress: Callable[[int], None] | None = None
    ) -> None:
        """Stream the file's stored bytes (compressed, if it is stored so) into `sink` a block at a time, each
        piece hashed as it passes; once the last piece has passed, CorruptBundleError if size or digest are
        not the manifest's (what the sink got is then the caller's to throw away). A replica copies a bundle
        this way (replica.py): every byte checked as it is read, no digest made anew. `sink` must not keep
        the view it is given.

        Raises:
            FileNotFoundError: `relpath` is not in the manifest.
            CorruptBundleError: the stored bytes differ from the manifest.
            StoreUnavailableError: the store cannot be reached.
        """
        self._stream_stored(relpath, sink, progress)

    def open(self, relpath: str) -> BinaryIO:
        """A readable stream of the logical bytes; the whole file is fetched and checked before it is returned."""
        entry = self._entry(relpath)
        logical = _spool(entry.logical_size)
        try:
            self._stream_logical(relpath, logical.write, None)
        except BaseException:
            logical.close()
            raise
        logical.seek(0)
        return logical

    def get_file(
        self, relpath: str, local_path: str | os.PathLike[str], progress: Callable[[int], None] | None = None
    ) -> None:
        """Download `relpath` to `local_path`, hashed (and inflated) as it is written; the file appears
        there only after its digest checked out."""
        self._entry(relpath)
        local_path = os.fspath(local_path)
        os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
        part = f"{local_path}.{uuid.uuid4().hex[:8]}.part"
        try:
            with open(part, "wb") as out:
                self._stream_logical(relpath, out.write, progress)
            os.replace(part, local_path)
        finally:
            if os.path.exists(part):
                os.remove(part)

    def files_under(self, relpath: str) -> list[str]:
        """Manifest relpaths under directory `relpath` ('' = all)."""
        if not relpath:
            return sorted(self.manifest.files)
        validate_relpath(relpath)
        prefix = relpath.rstrip("/") + "/"
        return sorted(p for p in self.manifest.files if p.startswith(prefix))

    def get_dir(self, relpath: str, local_dir: str | os.PathLike[str], max_workers: int | None = None) -> list[str]:
        """Download every file under `relpath` into `local_dir` (must not exist or be empty), in parallel.

        Files go to a sibling staging dir renamed into place only when all digests checked out, so a
        failed get_dir leaves no directory that looks complete.

        Returns:
            The relpaths fetched.
        Raises:
            FileExistsError: `local_dir` exists and is not an empty directory.
            FileNotFoundError: no manifest file lies under `relpath`.
            CorruptBundleError: a file is missing or differs from the manifest (names the file).
            StoreUnavailableError: the store cannot be reached.
        """
        local_dir = os.path.abspath(os.fspath(local_dir))
        if os.path.exists(local_dir) and (not os.path.isdir(local_dir) or os.listdir(local_dir)):
            raise FileExistsError(f"get_dir target {local_dir} exists and is not an empty directory")
        wanted = self.files_under(relpath)
        if not wanted:
            raise FileNotFoundError(f"no files under {relpath!r} in step {self.step} at {self.url}")
        strip = len(relpath.rstrip("/")) + 1 if relpath else 0
        staging = f"{local_dir}.partial-{uuid.uuid4().hex[:8]}"
        os.makedirs(staging)
        try:
            workers = max_workers or self.max_workers
            with ThreadPoolExecutor(max_workers=max(1, min(workers, len(wanted)))) as pool:
                futures = [pool.submit(self.get_file, rel, os.path.join(staging, rel[strip:])) for rel in wanted]
                for future in futures:
                    future.result()
            if os.path.isdir(local_dir):
                os.rmdir(local_dir)
            os.rename(staging, local_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return wanted

    def verify(
        self, progress: Callable[[int], None] | None = None, max_workers: int | None = None, under: str = ""
    ) -> Manifest:
        """Re-check the listing, every file's size and digest and, for compressed files, that they inflate
        to exactly their logical size. `under` limits the digest checks to the files below one directory
        (e.g. a restore checks `policy/` before any rank loads it; the listing is always checked whole).

        Raises:
            CorruptBundleError: naming the first bad file (and how many more there are).
            StoreUnavailableError: the store cannot be reached.
        """
        with unavailable_as_store_error(self.url, f"listing step {self.step}"):
            listing = self.backend.list_files(self.backend.path(self._step_dir))
        view = self.backend.bundle_view(listing, self.manifest.txid)
        check_listing(self.manifest, view, f"step {self.step} at {self.url}")
        lock = threading.Lock()

        def tick(n: int) -> None:
            if progress is not None:
                with lock:
                    progress(n)

        def one(rel: str) -> CorruptBundleError | None:
            try:
                self._verify_file(rel, tick)
            except CorruptBundleError as exc:
                return exc
            return None

        names = self.files_under(under)
        workers = max_workers or self.max_workers
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(names) or 1))) as pool:
            errors = [e for e in pool.map(one, names) if e is not None]
        if errors:
            if len(errors) > 1:
                raise CorruptBundleError(f"{errors[0]} (and {len(errors) - 1} more bad files)") from errors[0]
            raise errors[0]
        return self.manifest

    def _verify_file(self, relpath: str, tick: Callable[[int], None]) -> None:
        """Digest check of one file; a compressed one is inflated (into nothing) alongside."""
        self._stream_logical(relpath, lambda _piece: None, tick)


class InOrderRead:
    """One file read front to back in pieces (`Bundle.read_in_order`): `into(view)` fills `view` with the
    file's next bytes (fewer at its end), hashing them as they land; `finish()` checks that the pieces came
    to the manifest's size and digest. Give the last piece one byte more than the file has left, so a longer
    file is noticed. The file is held (local disk: open) from the first read until `finish()` or `close()`
    (use it as a context manager), so many small pieces cost a read each, not an open each."""

    def __init__(self, bundle: Bundle, relpath: str, entry: FileEntry) -> None:
        self._bundle = bundle
        self._relpath = relpath
        self._entry = entry
        self._hasher = new_hasher(entry.digest.algorithm, entry.size)
        self._file: HeldFile | None = None
        self.position = 0

    def __enter__(self) -> InOrderRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _held(self) -> HeldFile:
        if self._file is None:
            self._file = self._bundle._stored(self._relpath, self._bundle.backend.hold)
        return self._file

    def into(self, view: memoryview) -> int:
        """Read the next `len(view)` bytes (or what is left) into `view`; how many came."""
        if not len(view):
            return 0
        held = self._held()
        return self._next_into(view, lambda _path, start: held.read_into(view, start, self._hasher.update))

    def into_at_once(self, view: memoryview) -> int:
        """`into`, for a piece read in one go rather than as one of many: a read of its own, not the held file's
        (on S3, parallel ranged GETs rather than one GET's stream)."""
        if not len(view):
            return 0
        backend = self._bundle.backend
        return self._next_into(view, lambda path, start: backend.read_into(path, view, start, self._hasher.update))

    def _next_into(self, view: memoryview, read: Callable[[str, int], int]) -> int:
        """`read(path, start)` of the file's next bytes into `view` (hashed by `read`), past them afterwards."""
        start = self.position
        got = int(self._bundle._stored(self._relpath, lambda path: read(path, start)))
        self.position += got
        return got

    def peek(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the stored file, NOT checked against the manifest and not hashed: only to find
        where things lie in the file (a zip archive's directory) before its pieces are read in order; never to
        parse as data. A peek just ahead of the read's position costs no request of its own on S3 (the held
        stream reads ahead)."""
        held = self._held()
        out = bytearray(max(0, end - start))
        got = int(self._bundle._stored(self._relpath, lambda _path: held.peek_into(memoryview(out), start)))
        return bytes(out[:got])

    def finish(self) -> None:
        """CorruptBundleError unless the bytes read are the whole file as the manifest has it. Lets the file go."""
        self.close()
        digest = Digest.of_hasher(self._entry.digest.algorithm, self._hasher)
        self._bundle._check(self._relpath, self._entry, digest, self.position)

    def close(self) -> None:
        """Let the held file go (reads after this hold it again)."""
        held, self._file = self._file, None
        if held is not None:
            held.close()
