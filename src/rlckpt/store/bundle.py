"""Bundle: a committed, checked step. Opening checks marker -> manifest digest -> listing; reads check file digests
before any byte reaches the caller (callers unpickle what they get)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO

from rlckpt.errors import CorruptBundleError, InvalidPathError, UncommittedBundleError

from .compression import copy_decompressed, decompress_bytes
from .digest import sha256_of_stream
from .manifest import CommitMarker, FileEntry, Manifest, sha256_hex
from .paths import COMMIT_NAME, MANIFEST_NAME, RESERVED_NAMES, step_dirname, validate_relpath

if TYPE_CHECKING:
    from .backends import Backend
    from .store import BundleStore

READ_BLOCK_SIZE = 16 << 20
SPOOL_MAX = 64 << 20


def _read_or_none(backend: Backend, path: str) -> bytes | None:
    try:
        return backend.read_object(path)
    except FileNotFoundError:
        return None


def read_marker_and_manifest(backend: Backend, step_path: str) -> tuple[bytes | None, bytes | None]:
    """The bytes of COMMIT and manifest.json (None when missing), as if read in that order.

    On an object store both GETs run at once (one round trip instead of two). The early manifest is
    kept only if it is there and COMMIT names its digest; otherwise it is read again after COMMIT, since
    it may predate a concurrent commit (or a delete and re-save) of the step."""
    marker_path, manifest_path = f"{step_path}/{COMMIT_NAME}", f"{step_path}/{MANIFEST_NAME}"
    if backend.local:
        marker = _read_or_none(backend, marker_path)
        return marker, (_read_or_none(backend, manifest_path) if marker is not None else None)
    with ThreadPoolExecutor(max_workers=2) as pool:
        early = pool.submit(_read_or_none, backend, manifest_path)
        marker = _read_or_none(backend, marker_path)
        manifest = early.result()
    if marker is None:
        return None, None
    try:
        named = CommitMarker.from_bytes(marker).manifest_sha256
    except (ValueError, KeyError):
        return marker, manifest  # malformed COMMIT: refused whatever the manifest is
    if manifest is None or sha256_hex(manifest) != named:
        manifest = _read_or_none(backend, manifest_path)
    return marker, manifest


def load_checked_manifest(store: BundleStore, step: int) -> Manifest:
    """Marker -> manifest digest -> manifest parse -> listing (no missing, extra or wrongly sized file).

    On an object store the listing is fetched in parallel with COMMIT and the manifest (one round trip
    for all three); that early listing is trusted only if it passes, else a fresh one decides."""
    backend = store._backend
    step_path = backend.path(step_dirname(step))
    if backend.local:
        return _checked_manifest(store, step, *read_marker_and_manifest(backend, step_path), early_listing=None)
    with ThreadPoolExecutor(max_workers=1) as pool:
        early = pool.submit(_list_sizes, store, step)
        marker_bytes, manifest_bytes = read_marker_and_manifest(backend, step_path)
        try:
            early_listing: dict[str, int] | None = early.result()
        except Exception:  # noqa: BLE001 - the fresh listing below reports whatever is wrong
            early_listing = None
    return _checked_manifest(store, step, marker_bytes, manifest_bytes, early_listing)


def _checked_manifest(
    store: BundleStore, step: int, marker_bytes: bytes | None, manifest_bytes: bytes | None, early_listing: dict[str, int] | None
) -> Manifest:
    backend, where = store._backend, f"step {step} at {store.url}"
    step_path = backend.path(step_dirname(step))
    if marker_bytes is None:
        state = "exists without COMMIT (uncommitted)" if backend.fs.exists(step_path) else "does not exist"
        raise UncommittedBundleError(f"{where}: {step_path} {state}")
    try:
        marker = CommitMarker.from_bytes(marker_bytes)
    except (ValueError, KeyError) as exc:
        raise CorruptBundleError(f"{where}: {COMMIT_NAME} is malformed: {exc}") from exc
    if marker.step != step:
        raise CorruptBundleError(f"{where}: {COMMIT_NAME} names step {marker.step}, not {step}")
    if manifest_bytes is None:
        raise CorruptBundleError(f"{where}: {MANIFEST_NAME} is missing but {COMMIT_NAME} exists")
    actual = sha256_hex(manifest_bytes)
    if actual != marker.manifest_sha256:
        raise CorruptBundleError(
            f"{where}: {MANIFEST_NAME} has sha256 {actual}, {COMMIT_NAME} names {marker.manifest_sha256}"
        )
    try:
        manifest = Manifest.from_bytes(manifest_bytes)
    except (ValueError, KeyError, InvalidPathError) as exc:
        raise CorruptBundleError(f"{where}: {MANIFEST_NAME} is invalid: {exc}") from exc
    if manifest.step != step or manifest.txid != marker.txid:
        raise CorruptBundleError(
            f"{where}: {MANIFEST_NAME} is for step {manifest.step} txid {manifest.txid}, "
            f"{COMMIT_NAME} for step {marker.step} txid {marker.txid}"
        )
    if early_listing is not None:
        try:
            check_listing(store, step, manifest, early_listing)
            return manifest
        except CorruptBundleError:
            pass  # may predate the commit (a file still uploading): decide on a fresh listing
    check_listing(store, step, manifest)
    return manifest


def _list_sizes(store: BundleStore, step: int) -> dict[str, int]:
    """relpath -> stored size of every file under step_<N>/ (one listing)."""
    step_path = store._backend.path(step_dirname(step))
    listed = store._backend.fs.find(step_path, detail=True)
    sizes: dict[str, int] = {}
    for path, info in listed.items():
        rel = path[len(step_path) + 1 :] if path.startswith(step_path + "/") else path
        sizes[rel] = int(info.get("size") or 0)
    return sizes


def check_listing(store: BundleStore, step: int, manifest: Manifest, sizes: dict[str, int] | None = None) -> None:
    """Every manifest file is present with its stored size and nothing else is in the bundle (`sizes`: a
    listing already taken, else one is taken now)."""
    if sizes is None:
        sizes = _list_sizes(store, step)
    where = f"step {step} at {store.url}"
    for rel, entry in sorted(manifest.files.items()):
        if rel not in sizes:
            raise CorruptBundleError(f"{where}: {rel} is in the manifest but missing from the bundle")
        if sizes[rel] != entry.size:
            raise CorruptBundleError(f"{where}: {rel} has {sizes[rel]} bytes, the manifest says {entry.size}")
    extra = sorted(rel for rel in sizes if rel not in manifest.files and rel not in RESERVED_NAMES)
    if extra:
        raise CorruptBundleError(f"{where}: {extra[0]} is not in the manifest (extra files: {extra})")


class Bundle:
    """Read access to one committed step; every read is digest-checked before it is returned."""

    def __init__(self, store: BundleStore, manifest: Manifest) -> None:
        self.store = store
        self.manifest = manifest
        self.step = manifest.step
        self._root = store._backend.path(step_dirname(manifest.step))

    def __repr__(self) -> str:
        return f"Bundle(step={self.step}, files={len(self.manifest.files)}, url={self.store.url!r})"

    @property
    def fs(self) -> Any:
        return self.store._backend.fs

    def _entry(self, relpath: str) -> FileEntry:
        validate_relpath(relpath)
        try:
            return self.manifest.files[relpath]
        except KeyError:
            raise FileNotFoundError(f"{relpath} is not in step {self.step} at {self.store.url}") from None

    def _corrupt(self, relpath: str, what: str) -> CorruptBundleError:
        return CorruptBundleError(f"step {self.step} at {self.store.url}: {relpath} {what}")

    def _check(self, relpath: str, entry: FileEntry, digest: str, size: int) -> None:
        if size != entry.size:
            raise self._corrupt(relpath, f"has {size} bytes, the manifest says {entry.size}")
        if digest != entry.sha256:
            raise self._corrupt(relpath, f"has sha256 {digest}, the manifest says {entry.sha256}")

    def _stream_stored(self, relpath: str, sink: Callable[[bytes], Any], progress: Callable[[int], None] | None) -> None:
        """Stream the stored bytes of `relpath` into `sink`, then check size and digest.

        Read as ranged GETs of the manifest's size, block by block: fs.open() would send a HEAD per file
        first (s3fs asks for the object's details even when given size=). A file of another size than
        the manifest's fails the size or digest check below (a shorter one returns fewer bytes, a longer
        one yields only its first entry.size bytes, which must then match the digest)."""
        entry = self._entry(relpath)
        backend = self.store._backend
        path = f"{self._root}/{relpath}"
        digest, size = hashlib.sha256(), 0
        try:
            if entry.size == 0:
                chunks: Any = [backend.read_object(path, size=0)]  # still one request: the file must exist
            else:
                chunks = (
                    backend.read_range(path, start, min(start + READ_BLOCK_SIZE, entry.size))
                    for start in range(0, entry.size, READ_BLOCK_SIZE)
                )
            for chunk in chunks:
                if not chunk:
                    break
                digest.update(chunk)
                size += len(chunk)
                sink(chunk)
                if progress is not None:
                    progress(len(chunk))
        except FileNotFoundError:
            raise self._corrupt(relpath, "is missing") from None
        self._check(relpath, entry, digest.hexdigest(), size)

    # --- reads --------------------------------------------------------------------------------
    def read_bytes(self, relpath: str) -> bytes:
        """The file's logical bytes (decompressed), after its digest was checked."""
        entry = self._entry(relpath)
        try:
            data = self.store._backend.read_object(f"{self._root}/{relpath}", size=entry.size)
        except FileNotFoundError:
            raise self._corrupt(relpath, "is missing") from None
        self._check(relpath, entry, sha256_hex(data), len(data))
        if entry.compression == "zstd":
            data = decompress_bytes(data)
        if len(data) != entry.logical_size:
            raise self._corrupt(relpath, f"decompresses to {len(data)} bytes, the manifest says {entry.logical_size}")
        return data

    def open(self, relpath: str) -> BinaryIO:
        """A readable stream of the logical bytes; the whole file is fetched and checked before it is returned."""
        entry = self._entry(relpath)
        stored = tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX)
        try:
            self._stream_stored(relpath, stored.write, None)
            stored.seek(0)
            if entry.compression != "zstd":
                return stored  # type: ignore[return-value]
            logical = tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX)
            with stored:
                copy_decompressed(stored, logical)
            logical.seek(0)
            return logical  # type: ignore[return-value]
        except BaseException:
            stored.close()
            raise

    def get_file(self, relpath: str, local_path: str | os.PathLike[str], progress: Callable[[int], None] | None = None) -> None:
        """Download `relpath` to `local_path`; the file appears there only after its digest checked out."""
        entry = self._entry(relpath)
        local_path = os.fspath(local_path)
        parent = os.path.dirname(os.path.abspath(local_path))
        os.makedirs(parent, exist_ok=True)
        part = f"{local_path}.{uuid.uuid4().hex[:8]}.part"
        try:
            self._copy_stored(relpath, part)
            self._install(relpath, entry, part, local_path, progress)
        finally:
            for leftover in (part, part + ".plain"):
                if os.path.exists(leftover):
                    os.remove(leftover)

    def _install(self, relpath: str, entry: FileEntry, part: str, local_path: str, progress: Callable[[int], None] | None) -> None:
        """Hash the fetched copy `part` (what the caller will get), decompress it if stored compressed, and
        only then rename it to `local_path`."""
        with open(part, "rb") as copied:
            digest, size = sha256_of_stream(copied, on_chunk=progress)
        self._check(relpath, entry, digest, size)
        if entry.compression == "zstd":
                plain = part + ".plain"
                with open(part, "rb") as src, open(plain, "wb") as dst:
                    size = copy_decompressed(src, dst)
                os.replace(plain, part)
                if size != entry.logical_size:
                    raise self._corrupt(relpath, f"decompresses to {size} bytes, the manifest says {entry.logical_size}")
        os.replace(part, local_path)

    def _copy_stored(self, relpath: str, part: str) -> None:
        """Copy the stored bytes to local `part` with the filesystem's own get_file (local: kernel-side copy;
        S3: one streamed GET, no HEAD, parallel ranges for big files, like a raw fsspec copy)."""
        try:
            self.fs.get_file(f"{self._root}/{relpath}", part)
        except FileNotFoundError:
            raise self._corrupt(relpath, "is missing") from None

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
        failed get_dir leaves no directory that looks complete. Returns the relpaths fetched.
        """
        local_dir = os.path.abspath(os.fspath(local_dir))
        if os.path.exists(local_dir) and (not os.path.isdir(local_dir) or os.listdir(local_dir)):
            raise FileExistsError(f"get_dir target {local_dir} exists and is not an empty directory")
        wanted = self.files_under(relpath)
        if not wanted:
            raise FileNotFoundError(f"no files under {relpath!r} in step {self.step} at {self.store.url}")
        strip = len(relpath.rstrip("/")) + 1 if relpath else 0
        staging = f"{local_dir}.partial-{uuid.uuid4().hex[:8]}"
        os.makedirs(staging)
        try:
            workers = max_workers or self.store.max_workers
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

    def verify(self, progress: Callable[[int], None] | None = None, max_workers: int | None = None) -> Manifest:
        """Re-check the listing and every file's size and sha256; raise CorruptBundleError naming the first bad file."""
        check_listing(self.store, self.step, self.manifest)
        lock = threading.Lock()

        def tick(n: int) -> None:
            if progress is not None:
                with lock:
                    progress(n)

        def one(rel: str) -> CorruptBundleError | None:
            try:
                self._stream_stored(rel, lambda _chunk: None, tick)
            except CorruptBundleError as exc:
                return exc
            return None

        names = sorted(self.manifest.files)
        workers = max_workers or self.store.max_workers
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(names) or 1))) as pool:
            errors = [e for e in pool.map(one, names) if e is not None]
        if errors:
            if len(errors) > 1:
                raise CorruptBundleError(f"{errors[0]} (and {len(errors) - 1} more bad files)") from errors[0]
            raise errors[0]
        return self.manifest
