"""BundleStore: the entry point. Writers `begin(step)`; readers `steps()`, `latest()`, `open(step)`; tools
`entries()` and `gc()`. See docs/store-protocol.md for the protocol."""

from __future__ import annotations

import logging
import os
import threading
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

from rlckpt.errors import (
    BundleExistsError,
    CorruptBundleError,
    StoreUnavailableError,
    UncommittedBundleError,
    UnsafeStoreError,
)

from .backends import make_backend
from .bundle import Bundle, load_checked_manifest, read_marker_and_manifest
from .intent import DEFAULT_STALE_AFTER, Intent
from .inventory import scan
from .location import open_location
from .manifest import CommitMarker, sha256_hex
from .paths import COMMIT_NAME, MANIFEST_NAME, TXN_DIR, step_dirname, validate_step
from .probe import create_exclusive_enforced
from .storage_errors import unavailable_as_store_error

log = logging.getLogger(__name__)

DEFAULT_MAX_WORKERS = 8


@dataclass(frozen=True)
class StoreEntry:
    """One step-like thing found in the store, for `rlckpt ls`.

    state: "committed" (COMMIT names the manifest and the listing matches it), "corrupt" (COMMIT
    present but a check failed; `detail` says which), "uncommitted" (data without COMMIT and no
    transaction: debris for gc), "writing" (a live transaction), "stale" (a transaction presumed dead).
    """

    step: int
    state: str
    size: int
    files: int
    created: str | None
    txid: str | None
    detail: str
    path: str


class BundleStore:
    """Transactional bundles `step_<N>/` under one run URL (local path or any fsspec URL)."""

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        fs: Any = None,
        allow_unsafe: bool = False,
        stale_after: float = DEFAULT_STALE_AFTER,
        max_workers: int = DEFAULT_MAX_WORKERS,
    ) -> None:
        """`fs` overrides the filesystem built from url+storage_options (tests wrap it to inject faults).
        `allow_unsafe` lets writes proceed (with a loud warning) on a server that ignores create-exclusive."""
        self.url = os.fspath(url)
        self.storage_options = dict(storage_options or {})
        self.allow_unsafe = allow_unsafe
        self.stale_after = stale_after
        self.max_workers = max_workers
        if fs is None:
            fs, root = open_location(self.url, self.storage_options)  # StoreConfigError on any bad input
        else:
            root = fs._strip_protocol(self.url)
        self._backend = make_backend(fs, root.rstrip("/") or root)
        self._checked = False
        self._probed = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"BundleStore({self.url!r})"

    @property
    def fs(self) -> Any:
        return self._backend.fs

    @property
    def root(self) -> str:
        return self._backend.root

    @property
    def is_local(self) -> bool:
        """True for a local-disk store (atomic rename commit), False for object stores (marker last)."""
        return bool(self._backend.local)

    # --- reachability / probe -----------------------------------------------------------------
    def _check_reachable(self) -> None:
        """Once per store: an S3-like store's bucket must exist; a local root must not be under a file."""
        if self._checked:
            return
        with unavailable_as_store_error(self.url, "checking the store"):
            if self._backend.local:
                parent = self.root
                while parent and not os.path.exists(parent):
                    parent = os.path.dirname(parent)
                if parent and self.root != parent and not os.path.isdir(parent):
                    raise StoreUnavailableError(f"store {self.url} unavailable: {parent} is not a directory")
                if os.path.exists(self.root) and not os.path.isdir(self.root):
                    raise StoreUnavailableError(f"store {self.url} unavailable: {self.root} is not a directory")
            elif hasattr(self.fs, "split_path"):
                bucket = self.fs.split_path(self.root)[0]
                try:
                    self.fs.call_s3("head_bucket", Bucket=bucket)
                except FileNotFoundError:
                    raise StoreUnavailableError(f"store {self.url} unavailable: bucket {bucket!r} does not exist") from None
        self._checked = True

    def _ensure_writable(self) -> None:
        """Probe create-exclusive once; refuse (or warn loudly if allow_unsafe) when it is not enforced."""
        self._check_reachable()
        with self._lock:
            if self._probed:
                return
            with unavailable_as_store_error(self.url, "probing create-exclusive writes"):
                enforced = create_exclusive_enforced(self._backend)
            if not enforced:
                msg = (
                    f"store {self.url} does not enforce create-exclusive writes (If-None-Match: *): "
                    "two writers of one step could both commit"
                )
                if not self.allow_unsafe:
                    raise UnsafeStoreError(msg + "; pass allow_unsafe=True to write anyway")
                log.warning("UNSAFE: %s (allow_unsafe=True)", msg)
                warnings.warn(f"UNSAFE: {msg}", RuntimeWarning, stacklevel=3)
            self._probed = True

    # --- intents ------------------------------------------------------------------------------
    def _intent_path(self, step: int) -> str:
        return self._backend.path(TXN_DIR, f"{step_dirname(step)}.json")

    def read_intent(self, step: int) -> Intent | None:
        """The intent of a transaction on `step`, or None."""
        try:
            data = self._backend.read_object(self._intent_path(step))
        except FileNotFoundError:
            return None
        try:
            return Intent.from_bytes(data)
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable intent %s; treating it as stale", self._intent_path(step))
            return Intent(step=step, txid="?", host="?", pid=-1, started=0.0)

    def _release_intent(self, step: int, txid: str, committed: bool = False) -> None:
        """Remove our own intent (best effort: gc removes what is left).

        `committed`: the step has a COMMIT, so the intent is deleted without reading it first. Any other
        transaction's intent there (one that took over ours as stale) belongs to a writer that cannot
        commit any more (create-exclusive manifest/COMMIT; its claim re-check fails), so deleting it
        unseen is harmless. Without a COMMIT the intent is read first: it may hold a live writer's claim."""
        try:
            if committed:
                self.fs.rm_file(self._intent_path(step))
                return
            current = self.read_intent(step)
            if current is not None and current.txid == txid:
                self.fs.rm_file(self._intent_path(step))
        except FileNotFoundError:
            pass
        except Exception:  # noqa: BLE001 - leftover intent is harmless; gc removes it
            log.warning("could not remove intent of step %s (txid %s)", step, txid, exc_info=True)

    def _check_still_owner(self, step: int, txid: str) -> None:
        """Just before publishing: our intent must still be ours (not taken over by gc or another writer)."""
        current = self.read_intent(step)
        if current is None or current.txid != txid:
            who = current.describe() if current else "nobody (intent removed, e.g. by gc)"
            raise BundleExistsError(f"step {step} at {self.url}: txid {txid} lost its claim; now held by {who}")

    def _has_commit(self, step: int) -> bool:
        return bool(self.fs.exists(self._backend.path(step_dirname(step), COMMIT_NAME)))

    def _claim(self, step: int, txid: str) -> None:
        """Record the intent create-exclusively; take over a stale one once; else BundleExistsError."""
        intent = Intent.new(step, txid)
        for attempt in range(2):
            try:
                self._backend.create_exclusive(self._intent_path(step), intent.to_bytes())
                return
            except FileExistsError:
                holder = self.read_intent(step)
                if holder is None and attempt == 0:
                    continue  # released between our write and read: try again
                if self._has_commit(step):
                    raise BundleExistsError(f"step {step} at {self.url} is already committed") from None
                if holder is None or attempt == 1 or not holder.is_stale(self.stale_after):
                    who = holder.describe() if holder else "another writer"
                    raise BundleExistsError(f"step {step} at {self.url} is being written by {who}") from None
                log.warning("taking over step %s at %s from dead transaction %s", step, self.url, holder.describe())
                self._backend.discard(step_dirname(step), holder.txid)
                self.fs.rm_file(self._intent_path(step))
            except FileNotFoundError as exc:
                raise StoreUnavailableError(f"store {self.url} unavailable: {exc}") from exc

    # --- writing ------------------------------------------------------------------------------
    def begin(self, step: int) -> BundleTransaction:
        """Start the save of `step`: intent recorded (claiming the step) before any data byte.

        COMMIT is checked once, after the claim (a writer may commit until we hold it; a check before
        the claim would only save an intent PUT+DELETE when the step is already committed). On an
        object store one LIST of the step answers "committed?" and finds a dead writer's leftovers."""
        from .transaction import BundleTransaction

        validate_step(step)
        self._ensure_writable()
        txid = uuid.uuid4().hex
        with unavailable_as_store_error(self.url, f"beginning step {step}"):
            self._claim(step, txid)
            committed = False
            try:
                if self._backend.local:
                    committed = self._has_commit(step)
                    if not committed:
                        os.makedirs(self._backend.data_root(step_dirname(step), txid), exist_ok=True)
                else:
                    leftovers = self._backend.list_step(step_dirname(step))
                    committed = self._backend.path(step_dirname(step), COMMIT_NAME) in leftovers
                    if leftovers and not committed:
                        self.fs.rm(leftovers)  # a dead writer's partial prefix: we hold the claim
                if committed:
                    raise BundleExistsError(f"step {step} at {self.url} is already committed")
            except BaseException:
                self._release_intent(step, txid, committed=committed)
                raise
        log.info("began step %s (txid %s) at %s", step, txid, self.url)
        return BundleTransaction(self, step, txid)

    # --- reading ------------------------------------------------------------------------------
    def _marker_names_manifest(self, step: int) -> bool:
        """Invariant 1's cheap check: COMMIT parses and names the sha256 of the manifest beside it."""
        marker_bytes, manifest_bytes = read_marker_and_manifest(self._backend, self._backend.path(step_dirname(step)))
        if marker_bytes is None or manifest_bytes is None:
            return False
        try:
            marker = CommitMarker.from_bytes(marker_bytes)
        except (ValueError, KeyError):
            return False
        return marker.step == step and sha256_hex(manifest_bytes) == marker.manifest_sha256

    def steps(self) -> list[int]:
        """Committed steps, ascending (COMMIT present and naming the manifest's digest)."""
        self._check_reachable()
        with unavailable_as_store_error(self.url, "listing steps"):
            inv = scan(self.fs, self.root)
            return sorted(s for s in inv.steps if inv.committed_marker(s) and self._marker_names_manifest(s))

    def latest(self) -> int | None:
        """The newest committed step, or None when there is none."""
        steps = self.steps()
        return steps[-1] if steps else None

    def open(self, step: int) -> Bundle:
        """A checked Bundle (marker -> manifest digest -> listing); Uncommitted/CorruptBundleError otherwise."""
        validate_step(step)
        self._check_reachable()
        with unavailable_as_store_error(self.url, f"opening step {step}"):
            return Bundle(self, load_checked_manifest(self, step))

    def entries(self) -> list[StoreEntry]:
        """Every step-like thing in the store with its state, ascending by step."""
        self._check_reachable()
        with unavailable_as_store_error(self.url, "listing entries"):
            inv = scan(self.fs, self.root)
            intents = {i.step: i for i in (self.read_intent_at(p) for p in inv.intents) if i is not None}
            out: list[StoreEntry] = []
            for step in sorted(set(inv.steps) | set(intents)):
                out.append(self._entry(step, inv.steps.get(step, {}), intents.get(step), inv))
            return out

    def read_intent_at(self, path: str) -> Intent | None:
        """Parse the intent stored at `path` (None if gone or unreadable)."""
        try:
            return Intent.from_bytes(self._backend.read_object(path))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None

    def _entry(self, step: int, files: dict[str, int], intent: Intent | None, inv: Any) -> StoreEntry:
        path = self._backend.path(step_dirname(step))
        if intent is not None and COMMIT_NAME not in files:
            staged = inv.tmp_dirs.get(intent.txid, {}) if self._backend.local else files
            size = sum(staged.values())
            state = "stale" if intent.is_stale(self.stale_after) else "writing"
            created = _iso(intent.started)
            return StoreEntry(step, state, size, len(staged), created, intent.txid, intent.describe(), path)
        data_files = {k: v for k, v in files.items() if k not in (COMMIT_NAME, MANIFEST_NAME)}
        if COMMIT_NAME not in files:
            return StoreEntry(step, "uncommitted", sum(files.values()), len(data_files), None, None, "no COMMIT", path)
        try:
            manifest = load_checked_manifest(self, step)
        except (CorruptBundleError, UncommittedBundleError) as exc:
            return StoreEntry(step, "corrupt", sum(files.values()), len(data_files), None, None, str(exc), path)
        return StoreEntry(
            step, "committed", manifest.total_size, len(manifest.files), manifest.created, manifest.txid, "", path
        )

    # --- maintenance --------------------------------------------------------------------------
    def gc(self, keep_last: int | None = None, dry_run: bool = False, stale_after: float | None = None) -> GcReport:
        """Remove debris of dead transactions and (with keep_last) old committed bundles; see gc.py."""
        from .gc import run_gc

        self._check_reachable()
        with unavailable_as_store_error(self.url, "collecting garbage"):
            return run_gc(self, keep_last=keep_last, dry_run=dry_run, stale_after=stale_after)


def _iso(ts: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


from .gc import GcReport  # noqa: E402  (re-export for the signature)
from .transaction import BundleTransaction  # noqa: E402
