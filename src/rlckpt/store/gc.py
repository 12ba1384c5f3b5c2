"""Garbage collection: retention of committed bundles and removal of what dead transactions left.

Never touched: a bundle with a COMMIT (except by retention, which keeps at least the newest), and
anything belonging to a live transaction (its intent is younger than `stale_after` and its writer
is not known dead). The listing is taken BEFORE the intents are read, so data written by a
transaction that began during gc is always covered by an intent gc has seen.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .intent import Intent
from .inventory import scan
from .paths import COMMIT_NAME, TMP_DIR, parse_step_dirname, step_dirname

if TYPE_CHECKING:
    from .store import BundleStore

log = logging.getLogger(__name__)

PROBE_GRACE = 60.0  # seconds


@dataclass
class GcReport:
    """What gc removed (or, with dry_run, would remove)."""

    dry_run: bool
    deleted_steps: list[int] = field(default_factory=list)  # committed bundles removed by retention
    kept_steps: list[int] = field(default_factory=list)  # committed bundles kept
    removed: list[str] = field(default_factory=list)  # debris paths: uncommitted prefixes, tmp dirs, intents
    aborted_uploads: list[str] = field(default_factory=list)  # keys of incomplete multipart uploads
    live: list[str] = field(default_factory=list)  # txids of live transactions left alone
    corrupt_steps: list[int] = field(default_factory=list)  # have a COMMIT but fail the marker check; untouched


def run_gc(store: BundleStore, keep_last: int | None, dry_run: bool, stale_after: float | None) -> GcReport:
    """Plan and (unless dry_run) carry out retention and debris removal."""
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
        raise ValueError(f"keep_last must be an int >= 1 (the newest bundle is never deleted), got {keep_last!r}")
    threshold = store.stale_after if stale_after is None else stale_after
    backend, fs = store._backend, store.fs
    report = GcReport(dry_run=dry_run)

    inv = scan(fs, store.root)  # listing first, intents second (see module docstring)
    intents: dict[str, Intent] = {}
    for path in inv.intents:
        intent = store.read_intent_at(path)
        intents[path] = intent if intent is not None else Intent(step=-1, txid="?", host="?", pid=-1, started=0.0)
    live = {i.step: i for i in intents.values() if i.step >= 0 and not i.is_stale(threshold)}
    report.live = sorted(i.txid for i in live.values())

    # 1. retention over valid committed bundles
    committed = sorted(s for s in inv.steps if inv.committed_marker(s))
    valid = [s for s in committed if store._marker_names_manifest(s)]
    report.corrupt_steps = [s for s in committed if s not in valid]
    doomed = valid[:-keep_last] if keep_last else []
    report.deleted_steps = doomed
    report.kept_steps = [s for s in valid if s not in doomed]
    for step in doomed:
        _do(dry_run, lambda s=step: backend.delete_bundle(step_dirname(s)))

    # 2. dead transactions: their data, then their intent
    for path, intent in sorted(intents.items()):
        if intent.step in live and live[intent.step].txid == intent.txid:
            continue
        if intent.step >= 0 and not inv.committed_marker(intent.step):
            if _still_unclaimed_or_ours(store, intent):
                if backend.local:
                    if intent.txid in inv.tmp_dirs:
                        report.removed.append(backend.path(TMP_DIR, intent.txid))
                elif inv.steps.get(intent.step):
                    report.removed.append(backend.path(step_dirname(intent.step)))
                _do(dry_run, lambda i=intent: backend.discard(step_dirname(i.step), i.txid))
        report.removed.append(path)
        _do(dry_run, lambda p=path: _rm_if_exists(fs, p))

    # 3. orphans: uncommitted step data with no intent at all; staging dirs of no live transaction
    claimed_steps = {i.step for i in intents.values()}
    for step, files in sorted(inv.steps.items()):
        if COMMIT_NAME in files or step in claimed_steps:
            continue
        report.removed.append(backend.path(step_dirname(step)))
        _do(dry_run, lambda s=step: _remove_orphan_step(store, s))
    live_txids = {i.txid for i in live.values()}
    for name in sorted(inv.tmp_dirs):
        if name in live_txids or backend.path(TMP_DIR, name) in report.removed:
            continue
        report.removed.append(backend.path(TMP_DIR, name))
        _do(dry_run, lambda n=name: _rm_if_exists(fs, backend.path(TMP_DIR, n), recursive=True))

    # probe keys a crashed probe left (a probe lives for two small PUTs; allow a minute)
    now = time.time()
    for key, mtime in sorted(inv.probes.items()):
        if mtime is None or now - mtime >= min(threshold, PROBE_GRACE):
            report.removed.append(key)
            _do(dry_run, lambda k=key: _rm_if_exists(fs, k))

    # 4. incomplete multipart uploads under the run (S3 only) of steps with no live transaction
    for key, upload_id in _multipart_uploads(store):
        rel = key[len(store.root) + 1 :] if key.startswith(store.root + "/") else key
        step = parse_step_dirname(rel.split("/", 1)[0])
        if step is not None and step in live:
            continue
        report.aborted_uploads.append(key)
        _do(dry_run, lambda k=key, u=upload_id: _abort_upload(fs, k, u))

    log.info(
        "gc of %s%s: deleted steps %s, removed %d paths, aborted %d uploads",
        store.url, " (dry run)" if dry_run else "", report.deleted_steps, len(report.removed), len(report.aborted_uploads),
    )
    return report


def _do(dry_run: bool, action: Any) -> None:
    if not dry_run:
        action()


def _rm_if_exists(fs: Any, path: str, recursive: bool = False) -> None:
    try:
        fs.rm(path, recursive=recursive)
    except FileNotFoundError:
        pass


def _still_unclaimed_or_ours(store: BundleStore, intent: Intent) -> bool:
    """Re-read the step's intent just before deleting: only act if it is still this dead one."""
    current = store.read_intent(intent.step)
    return current is None or current.txid == intent.txid


def _remove_orphan_step(store: BundleStore, step: int) -> None:
    """Uncommitted data with no intent: re-check (no COMMIT, no intent) right before deleting."""
    if store._has_commit(step) or store.read_intent(step) is not None:
        return
    backend = store._backend
    path = backend.path(step_dirname(step))
    if backend.local:
        _rm_if_exists(store.fs, path, recursive=True)
    else:
        keys = store.fs.find(path)
        if keys:
            store.fs.rm(keys)


def _multipart_uploads(store: BundleStore) -> list[tuple[str, str]]:
    """(bucket/key, upload id) of incomplete multipart uploads under the run prefix; [] off S3."""
    fs = store.fs
    if store._backend.local or not hasattr(fs, "call_s3") or not hasattr(fs, "split_path"):
        return []
    bucket, prefix, _ = fs.split_path(store.root)
    out: list[tuple[str, str]] = []
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix.rstrip("/") + "/" if prefix else ""}
    while True:
        page = fs.call_s3("list_multipart_uploads", **kwargs)
        out.extend((f"{bucket}/{u['Key']}", u["UploadId"]) for u in page.get("Uploads", []) or [])
        if not page.get("IsTruncated"):
            return out
        kwargs["KeyMarker"] = page.get("NextKeyMarker")
        kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker")


def _abort_upload(fs: Any, key: str, upload_id: str) -> None:
    bucket, path, _ = fs.split_path(key)
    fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=path, UploadId=upload_id)
