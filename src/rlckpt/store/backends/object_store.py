"""Object stores (memory://, GCS, any fsspec filesystem without renames): files are written in place under
`step_<N>/`, and COMMIT goes last as one small create-exclusive PUT. Exclusivity of the writer is
decided earlier by the step's claim (claims.py)."""

from __future__ import annotations

import errno
import logging
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fsspec.spec import AbstractBufferedFile

from rlckpt.errors import BundleExistsError
from rlckpt.store.backends.base import Backend, CommitView, Listing, PendingWrite
from rlckpt.store.io.storage_errors import is_precondition_failed
from rlckpt.store.paths.paths import COMMIT_NAME, MANIFEST_NAME, PROBE_DIR, QUARANTINE_DIR, RESERVED_NAMES, step_dirname
from rlckpt.store.records.inventory import FILE, Inventory, ListedPath

log = logging.getLogger(__name__)

# A file up to this size is written as one request (PUT): the S3 backend's part size, and the block of
# fsspec's buffered files on other object stores.
WRITE_BLOCK_SIZE = 16 << 20


def _mtime(info: dict[str, Any]) -> float | None:
    """Modification time (unix) from an fsspec info dict: `mtime`, `LastModified` (S3) or `created`."""
    for key in ("mtime", "LastModified", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        timestamp = getattr(value, "timestamp", None)
        if callable(timestamp):
            return float(timestamp())
    return None


class ObjectBackend(Backend):
    """An fsspec object store: no rename, so the commit is COMMIT written last, create-exclusively."""

    # --- the store as a whole -----------------------------------------------------------------
    def check_reachable(self, url: str) -> None:
        return None  # a generic filesystem has no container to check; the first request tells

    def create_exclusive_enforced(self) -> bool:
        """Write a fresh probe key twice with create-exclusive: enforced if the second write was refused."""
        key = self.path(PROBE_DIR, uuid.uuid4().hex)
        self.create_exclusive(key, b"probe-1")
        try:
            self.create_exclusive(key, b"probe-2")
        except FileExistsError:
            return True
        finally:
            try:
                self.remove_file(key)
            except FileNotFoundError:
                pass
        return False

    def list_run(self) -> Iterator[ListedPath]:
        return self._listed(self.root, self.root)

    def _find(self, path: str) -> dict[str, dict[str, Any]]:
        try:
            return dict(self.fs.find(path, detail=True))
        except FileNotFoundError:
            return {}

    def _listed(self, path: str, base: str) -> Iterator[ListedPath]:
        for full, info in self._find(path).items():
            if full.startswith(base + "/"):
                yield ListedPath(full[len(base) + 1 :], FILE, int(info.get("size") or 0), _mtime(info))

    # --- small objects ------------------------------------------------------------------------
    def read_capped(self, path: str, limit: int) -> bytes:
        return self.read_range(path, 0, limit + 1)

    def create_exclusive(self, path: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(path, data, mode="create")
        except Exception as exc:
            if is_precondition_failed(exc) and not isinstance(exc, FileExistsError):
                raise FileExistsError(errno.EEXIST, f"{path} exists (precondition failed)") from exc
            raise

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def mtime(self, path: str) -> float | None:
        return _mtime(self.fs.info(path))

    def remove_file(self, path: str) -> None:
        self.fs.rm_file(path)

    def remove_tree(self, path: str) -> None:
        keys = list(self._find(path))
        if keys:
            self.fs.rm(keys)

    def remove_listed(self, path: str, rels: Iterable[str]) -> None:
        keys = [f"{path}/{rel}" for rel in rels]
        if keys:
            self.fs.rm(keys)  # s3fs: one DeleteObjects per 1,000 keys; missing keys are fine

    # --- bundle files -------------------------------------------------------------------------
    def list_files(self, path: str) -> Listing:
        return Listing({item.rel: item.size for item in self._listed(path, path)}, {})

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return bytes(self.fs.cat_file(path, start=start, end=end))

    def fetch_commit_view(
        self, step_dir: str, marker_limit: int, manifest_limit: int, with_listing: bool, in_order: bool = True
    ) -> CommitView:
        """COMMIT, manifest and listing in one round trip unless `in_order`. The early manifest and listing
        may predate a commit finishing meanwhile; the commit check re-fetches them in order when they disagree."""
        if in_order:
            return super().fetch_commit_view(step_dir, marker_limit, manifest_limit, with_listing)
        with ThreadPoolExecutor(max_workers=2) as pool:
            manifest = pool.submit(self.read_or_none, self.path(step_dir, MANIFEST_NAME), manifest_limit, MANIFEST_NAME)
            listing = pool.submit(self.list_files, self.path(step_dir)) if with_listing else None
            marker = self.read_or_none(self.path(step_dir, COMMIT_NAME), marker_limit, COMMIT_NAME)
            early_manifest = manifest.result()
            early_listing = listing.result() if listing is not None else None
        if marker is None:
            return CommitView(None, None)
        return CommitView(marker, early_manifest, early_listing, early=True)

    # --- writing a transaction ----------------------------------------------------------------
    def data_root(self, step_dir: str, txid: str) -> str:
        return self.path(step_dir, txid)

    def bundle_root(self, step_dir: str, txid: str) -> str:
        return self.path(step_dir, txid)

    def bundle_view(self, step_listing: Listing, txid: str) -> Listing:
        prefix = txid + "/"
        sizes = {rel[len(prefix) :]: size for rel, size in step_listing.sizes.items() if rel.startswith(prefix)}
        strangers = tuple(sorted(rel for rel in step_listing.sizes if "/" not in rel and rel not in RESERVED_NAMES))
        return Listing(sizes, {}, strangers)

    def staged_sizes(self, inv: Inventory, step: int, txid: str) -> dict[str, int]:
        prefix = txid + "/"
        return {rel[len(prefix) :]: size for rel, size in inv.steps.get(step, {}).items() if rel.startswith(prefix)}

    def foreign_data(self, inv: Inventory, step: int, owner: str | None) -> list[str]:
        heads = {rel.split("/", 1)[0] for rel in inv.steps.get(step, {}) if "/" in rel}
        return [self.path(step_dirname(step), head) for head in sorted(heads) if head != owner]

    def transaction_data(self, step_dir: str, txid: str | None) -> str | None:
        return self.path(step_dir, txid) if txid else self.path(step_dir)

    def prepare_step(self, step_dir: str, txid: str) -> bool:
        """One LIST answers "committed?" and finds a dead writer's partial prefix, deleted under our claim.
        What lies under our own txid's prefix stays: only a dead earlier attempt of this same transaction
        (a replica resumed, see BundleStore.begin) can have written there."""
        found = list(self._find(self.path(step_dir)))
        if self.path(step_dir, COMMIT_NAME) in found:
            return True
        ours = self.path(step_dir, txid) + "/"
        leftovers = [key for key in found if not key.startswith(ours)]
        if leftovers:
            log.warning(
                "removing %d leftover objects of %s: no COMMIT, and this transaction holds the claim",
                len(leftovers),
                step_dir,
            )
            self.fs.rm(leftovers)
        return False

    def open_write(self, path: str) -> Any:
        """Opened with autocommit=False, so that nothing but finish_write(ok=True) can publish it: fsspec's
        `__del__` closes a file that is garbage-collected unfinished, which with autocommit would publish
        the partial object (e.g. a writer dropped in a reference cycle, whose finalizers run in any order)."""
        return self.fs.open(path, "wb", autocommit=False, block_size=WRITE_BLOCK_SIZE)

    def finish_write(self, raw: Any, path: str, ok: bool) -> PendingWrite | None:  # an uploaded object is durable
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
                return None
            except BaseException:
                self._discard_file(raw)
                raise
        self._discard_file(raw)
        return None

    @staticmethod
    def _discard_file(raw: Any) -> None:
        try:
            raw.discard()  # aborts a multipart upload, publishes nothing
        finally:
            raw.closed = True  # fsspec's __del__ would otherwise try to flush the discarded buffer

    def reuse_file(self, source: str, target: str, size: int) -> bool:
        """A copy made by the server (S3: CopyObject, a multipart copy above 5 GiB): no byte goes through
        the client. The source lies under its bundle's txid, which only that transaction ever wrote; one
        deleted meanwhile (retention, gc) is not copied, and the writer sends the bytes instead; a copy of another
        size than the entry's (the source replaced behind the store's back) is removed, and the bytes sent too.
        Two requests: the copy, and a HEAD of what it made."""
        try:
            self.fs.copy(source, target)
            if self.fs.info(target)["size"] == size:
                return True
        except FileNotFoundError:
            return False
        self.fs.rm_file(target)
        return False

    def make_visible(self, step_dir: str, txid: str, manifest: bytes, commit: bytes) -> None:
        try:
            self.create_exclusive(self.path(step_dir, MANIFEST_NAME), manifest)  # a loser cannot replace it
            self.create_exclusive(self.path(step_dir, COMMIT_NAME), commit)
        except FileExistsError as exc:
            raise BundleExistsError(f"{self.path(step_dir)} already has a manifest/COMMIT: another writer won") from exc

    def discard(self, step_dir: str, txid: str | None) -> None:
        """Delete the transaction's objects, and the rest of the step's too when it has no COMMIT (the
        caller holds the step, so nothing else there is alive). One LIST answers both."""
        keys = list(self._find(self.path(step_dir)))
        if self.path(step_dir, COMMIT_NAME) in keys:
            keys = [k for k in keys if txid and k.startswith(self.path(step_dir, txid) + "/")]
        if keys:
            self.fs.rm(keys)

    def delete_bundle(self, step_dir: str) -> None:
        self.fs.rm_file(self.path(step_dir, COMMIT_NAME))  # invisible first
        self.remove_tree(self.path(step_dir))

    def quarantine(self, step_dir: str, name: str) -> str:
        """Copy every object to `_quarantine/<name>/` (server-side where the store can), then delete the
        bundle COMMIT first. A crash in between leaves the bundle in place and a partial copy gc leaves alone."""
        source, target = self.path(step_dir), self.path(QUARANTINE_DIR, name)
        for full in sorted(self._find(source)):
            self.fs.copy(full, f"{target}/{full[len(source) + 1 :]}")
        self.delete_bundle(step_dir)
        return target
