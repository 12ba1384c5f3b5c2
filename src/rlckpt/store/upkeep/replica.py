"""Replicas: a committed bundle copied into another store as the same bundle (docs/tiers.md).

The destination's transaction runs under the source's txid, which the manifest names (on an object store a
bundle's files live under `step_<N>/<txid>/`). Its files are the source's *stored* bytes (compressed as
stored), each checked against the manifest as it is read (`Bundle.read_stored`) and hashed again as it is
written; its COMMIT and manifest.json are the source's bytes, published by the destination's own commit
(`BundleTransaction.commit_replica`: the checks of every commit, COMMIT last) once every file is in place.
No digest is made anew, so digests — and signatures, where COMMIT carries one — are the source's; the
destination takes the source's run record (`_run.json`) first, so a signed copy verifies there as the same
run's bundle.

A copy that fails or is interrupted leaves nothing committed. Run again, it takes the dead attempt's
claim over (`BundleStore.begin(txid=...)`) and keeps the files that attempt finished, each read back and
checked against the manifest first (`BundleTransaction.adopt`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass

from rlckpt.errors import BundleExistsError, CorruptBundleError, NewerFormatError, UncommittedBundleError
from rlckpt.store.bundle import Bundle
from rlckpt.store.commit.commit_check import CommitRecords
from rlckpt.store.commit.transaction import BundleTransaction
from rlckpt.store.records.manifest import FileEntry
from rlckpt.store.store import BundleStore

log = logging.getLogger(__name__)

ADOPTED = "adopted"
COPIED = "copied"
REUSED = "reused"  # taken from the destination's previous bundle (copy_bundle's `reuse`)


@dataclass(frozen=True)
class CopyReport:
    """What one copy did: the bundle (step, txid, files, stored bytes), what it read from the source and
    wrote, what it kept of an interrupted earlier copy, and how long it took."""

    step: int
    txid: str
    files: int
    bytes: int
    copied_files: int
    copied_bytes: int
    adopted_files: int
    adopted_bytes: int
    seconds: float
    already: bool = False  # the destination held this very bundle: nothing was written
    reused_files: int = 0
    reused_bytes: int = 0

    def describe(self) -> str:
        if self.already:
            return f"step {self.step} (txid {self.txid}) was already there"
        kept = f", {self.adopted_files} kept from an interrupted copy" if self.adopted_files else ""
        kept += f", {self.reused_files} unchanged taken from the previous bundle there" if self.reused_files else ""
        return (
            f"step {self.step} (txid {self.txid}): {self.files} files, {self.bytes / 2**20:.1f} MiB "
            f"({self.copied_files} copied{kept}) in {self.seconds:.2f}s"
        )


def copy_bundle(
    source: BundleStore,
    step: int,
    dest: BundleStore,
    *,
    max_workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    reuse: bool = False,
) -> CopyReport:
    """Copy committed bundle `step` of `source` into `dest` as the same bundle (module doc).

    A corrupt bundle of that step in `dest` is moved to its `_quarantine/` and replaced; the very same
    bundle already there (same COMMIT and manifest bytes) is left as it is (`already`).

    Args:
        max_workers: files copied at once (default: `dest`'s).
        progress: called with each piece's size as it is read from the source.
        reuse: a file whose entry is that of the same file of `dest`'s newest bundle below `step` is taken from
            it there (a hard link, a copy inside the server), not read from the source and sent again.
    Returns:
        What was copied.
    Raises:
        UncommittedBundleError, NewerFormatError: the source step is not a bundle this rlckpt copies.
        CorruptBundleError: a source file differs from its manifest (named); nothing is committed.
        BundleExistsError: `dest` holds another bundle of that step, or a live writer holds it there.
        RunIdentityError: `dest` is another run (its _run.json names another id than the source's).
        ReplicaError, LostWriteError: the copy does not match the manifest; nothing is committed.
        StoreUnavailableError: either store cannot be reached; nothing is committed.
    """
    started = time.perf_counter()
    records = source.records(step)
    manifest = records.manifest
    run = source.run_record()
    if run is not None:
        dest.ensure_run_record(run)  # the same run id there, so the carried COMMIT verifies as this run's
    try:
        txn = dest.begin(step, txid=manifest.txid, replace_corrupt=True, reuse=reuse)
    except BundleExistsError:
        if not _already_there(dest, step, records):
            raise  # a live writer holds the step there
        log.info("step %s (txid %s) is already at %s", step, manifest.txid, dest.url)
        return _report(records, {}, time.perf_counter() - started, already=True)
    bundle = Bundle(source.backend, source.url, manifest, max_workers or dest.max_workers)
    with txn:
        outcomes = _copy_files(bundle, txn, max_workers or dest.max_workers, progress)
        txn.commit_replica(records)
    report = _report(records, outcomes, time.perf_counter() - started)
    log.info("copied %s from %s to %s", report.describe(), source.url, dest.url)
    return report


def _copy_files(
    bundle: Bundle, txn: BundleTransaction, workers: int, progress: Callable[[int], None] | None
) -> dict[str, str]:
    """Every file of the bundle into the transaction, the largest first, `workers` at a time; relpath ->
    ADOPTED, REUSED or COPIED. The first failure cancels what has not started and is re-raised once the files under
    way have ended (the caller's abort then removes what they wrote)."""
    in_place = txn.files_in_place()
    files = sorted(bundle.manifest.files.items(), key=lambda item: (-item[1].size, item[0]))
    lock = threading.Lock()

    def tick(n: int) -> None:
        if progress is not None:
            with lock:
                progress(n)

    def one(rel: str, entry: FileEntry) -> str:
        if in_place.get(rel) == entry.size and txn.adopt(rel, entry):
            return ADOPTED
        if txn.take_unchanged(rel, entry):
            return REUSED
        with txn.open(rel, may_reuse=False) as out:  # raw: the stored bytes, hashed as they are written
            bundle.read_stored(rel, out.write, tick)
        return COPIED

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(files) or 1))) as pool:
        futures = {pool.submit(one, rel, entry): rel for rel, entry in files}
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        wait(pending)
    failed = [f for f in futures if not f.cancelled() and f.exception() is not None]
    if failed:
        raise failed[0].exception()  # type: ignore[misc]
    return {rel: future.result() for future, rel in futures.items()}


def _already_there(dest: BundleStore, step: int, records: CommitRecords) -> bool:
    """True when `dest` holds this very bundle at `step` (the same COMMIT and manifest bytes), False when no
    bundle there reads (a live writer holds the step); BundleExistsError when it holds another bundle."""
    try:
        there = dest.records(step)
    except (UncommittedBundleError, CorruptBundleError, NewerFormatError):
        return False
    if there.marker == records.marker and there.manifest_bytes == records.manifest_bytes:
        return True
    raise BundleExistsError(
        f"step {step} at {dest.url} holds another bundle (txid {there.manifest.txid}), not a copy of this one "
        f"(txid {records.manifest.txid}); nothing copied"
    )


def _report(records: CommitRecords, outcomes: dict[str, str], seconds: float, already: bool = False) -> CopyReport:
    files = records.manifest.files
    copied = [rel for rel, how in outcomes.items() if how == COPIED]
    adopted = [rel for rel, how in outcomes.items() if how == ADOPTED]
    reused = [rel for rel, how in outcomes.items() if how == REUSED]
    return CopyReport(
        step=records.manifest.step,
        txid=records.manifest.txid,
        files=len(files),
        bytes=records.manifest.total_size,
        copied_files=len(copied),
        copied_bytes=sum(files[rel].size for rel in copied),
        adopted_files=len(adopted),
        adopted_bytes=sum(files[rel].size for rel in adopted),
        seconds=seconds,
        already=already,
        reused_files=len(reused),
        reused_bytes=sum(files[rel].size for rel in reused),
    )
