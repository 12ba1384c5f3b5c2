"""The save procedure of one run bundle, in the order of docs/architecture.md (Save).

1. begin transaction (the store records the write-ahead intent before any data byte)
2. policy weights + optimizer, staged to host memory (written beside the data plane in 4)
3. barrier window (exclusive side of DataPlaneCheckpointBarrier): capture the replay index and
   the dataloader position at one instant → ``list_sample_ids()`` must equal the index (else the
   save aborts, nothing committed) → TransferQueue snapshot into local staging → release
4. outside the window: serialize and digest the captured index and write its digest into the
   staged snapshot's metadata; ``data_plane/`` (digested, optionally zstd),
   ``train_dataloader.pt`` and ``replay_buffer_metadata.pt``
5. manifest with digests → COMMIT → retention (checkpoint/retention.py)

The dataloader position is *captured* inside the window (it is still written after it): with the
async rollout order the rollout pump draws prompts while the policy is written, and a position
captured before the window would let a prompt drawn in between be restored from the data plane
*and* drawn again after resume (docs/design-notes.md, 1).

``start_save`` is steps 1-3, the part the train pump waits for; ``PendingSave.finish`` is the
rest, which an async save runs in the background while training goes on (docs/architecture.md,
Async saves). ``save_bundle`` is both, back to back.

``upload_timing="inline"`` digests and uploads the snapshot inside the window, so finished
rollouts wait for the destination; the stall benchmark compares it with the default ``staged``
(docs/architecture.md, Upload timing).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from rlckpt.checkpoint import codec, layout
from rlckpt.checkpoint.records import RUN_BUNDLE
from rlckpt.checkpoint.retention import Holds, retain_after_commit
from rlckpt.checkpoint.row_copy import RowCopier
from rlckpt.checkpoint.staging import staging_dir
from rlckpt.dataplane.rows_snapshot import rows_metadata
from rlckpt.dataplane.snapshot_metadata import update_snapshot_metadata
from rlckpt.dataplane.threads import run_blocking
from rlckpt.errors import CheckpointError, CorruptBundleError
from rlckpt.replay import GroupRecord, IndexCapture, ReplayBuffer
from rlckpt.store import (
    METRICS_KEY,
    BundleStore,
    BundleTransaction,
    Digest,
    Manifest,
    Receipt,
    Retention,
    finite_metrics,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")

# When the data-plane snapshot is digested and uploaded: after the window (staged, the default) or
# inside it (inline, for comparison in the stall benchmark).
# pinned: only the index is captured in the window; the captured rows are copied after it, pinned.
UploadTiming = Literal["staged", "inline", "pinned"]
ROWS_PER_FILE = 32  # a pinned copy reads this many rows per request (measured sweet spot: docs/benchmarks.md)
COPY_DEPTH = 2  # batches of a pinned copy in flight at once
# Awaited with the step after every piece is written, just before COMMIT (crash tests hold a save there).
SaveHook = Callable[[int], Awaitable[None]]


class StagedPolicy(Protocol):
    """Policy state already copied to host memory, not yet written anywhere."""

    async def write(self, txn: BundleTransaction) -> list[Receipt]:
        """Write the staged state into ``txn``; the receipts of the participants that wrote it (empty
        when it was written through the transaction itself)."""
        ...

    async def discard(self) -> None:
        """Drop the staged state unwritten (the save failed before writing it)."""
        ...


class PolicyStateSource(Protocol):
    """The trainer side of a save, in two phases so training can go on while the policy is written."""

    async def stage_policy(self) -> StagedPolicy:
        """Copy the policy state to host memory; returns as soon as the trainer may step again.
        It needs no transaction, so the save begins its transaction meanwhile."""
        ...


@dataclass
class StagedBytes:
    """A policy staged as one blob of bytes, written through the transaction as ``policy.pt``."""

    data: bytes

    async def write(self, txn: BundleTransaction) -> list[Receipt]:
        await run_blocking(txn.write_bytes, layout.POLICY_FILE, self.data)
        return []

    async def discard(self) -> None:
        self.data = b""


@dataclass
class SaveParticipants:
    """Everything one save touches; built once by the controller and reused for every save."""

    store: BundleStore
    policy: PolicyStateSource
    replay: ReplayBuffer  # the data plane it indexes is the one snapshotted
    capture_loader_state: Callable[[], dict[str, Any]]
    rollout_order: str = "in_order"  # the run's (TrainConfig.rollout_order), recorded in the bundle
    staging_root: str | None = None
    compress_data_plane: bool | None = None  # None: zstd on object stores only (see data_plane_compression)
    reuse: bool = False  # files unchanged since the previous bundle are taken from it (store begin's `reuse`)
    retention: Retention | None = None  # after each commit (None, or no rule: keep all)
    # Steps retention must keep besides its rules, asked (in retention's thread) at each retention: a
    # two-tier run's bundles not yet replicated (ReplicationQueue.holds: never a call to the remote tier)
    retention_holds: Holds | None = None
    # The run's numbers at the step saved (reward, loss), recorded in the manifest for retention by metric
    metrics: Callable[[], Mapping[str, float]] | None = None
    extra_metadata: Mapping[str, Any] = field(default_factory=dict)
    before_commit: SaveHook | None = None
    row_copier: RowCopier | None = None  # for pinned saves: copies the captured rows into the transaction


@dataclass
class SaveReport:
    """What one save did and how long each part took (seconds)."""

    step: int
    manifest_digest: str  # as COMMIT names it: "<algorithm>:<hex>"
    total_s: float
    foreground_s: float  # begin + policy staging + window: what the train pump waits for in an async save
    policy_stage_s: float  # policy copied to host memory
    policy_s: float  # policy staged and written
    window_s: float
    snapshot_s: float  # TQ snapshot (with the inventory listing beside it), or the pinned rows' copy
    upload_s: float
    bytes_written: int
    group_count: int
    upload_timing: UploadTiming


async def save_bundle(parts: SaveParticipants, step: int, *, upload_timing: UploadTiming = "staged") -> SaveReport:
    """Write and commit the bundle of ``step``; on any failure nothing is committed and it re-raises."""
    pending = await start_save(parts, step, upload_timing=upload_timing)
    return await pending.finish()


async def start_save(parts: SaveParticipants, step: int, *, upload_timing: UploadTiming = "staged") -> PendingSave:
    """The foreground of a save (steps 1-3): begin the transaction while the policy is staged, then
    hold the window. When it returns the trainer may step again and rollouts commit again;
    ``finish()`` writes the rest and commits. On a failure here the transaction is aborted (nothing
    committed), the staged policy dropped, and the failure re-raised."""
    started = time.perf_counter()
    txn, policy, policy_stage_s = await _begin_beside_staging(parts, step)
    pending = PendingSave(parts, txn, step, upload_timing, started, policy, policy_stage_s)
    try:
        await pending.foreground()
    except BaseException as exc:
        await pending.fail(exc)
        raise
    return pending


async def _begin_beside_staging(parts: SaveParticipants, step: int) -> tuple[BundleTransaction, StagedPolicy, float]:
    """1: the intent recorded (a corrupt bundle at this step, one a resume fell back past, is moved
    aside) while, beside it, 2: the policy is staged to host memory (it writes nothing, so it needs
    no transaction). If either fails or the caller is cancelled, a begun transaction is aborted and
    a staged policy dropped. Returns the transaction, the staged policy and the staging seconds."""
    begin = asyncio.ensure_future(
        asyncio.to_thread(functools.partial(parts.store.begin, step, replace_corrupt=True, reuse=parts.reuse))
    )
    policy: StagedPolicy | None = None
    t = time.perf_counter()
    try:
        policy = await parts.policy.stage_policy()
        staged_s = time.perf_counter() - t
        txn = await asyncio.shield(begin)  # cancelling us must not lose a transaction begun meanwhile
    except BaseException as exc:
        begun = await _settled(begin)
        if begun is not None:
            await _abort(begun, step, exc)
        if policy is not None:
            await _discard(policy, step)
        raise
    return txn, policy, staged_s


async def _settled(task: asyncio.Future[T]) -> T | None:
    """Wait for ``task`` to end whatever happens to us meanwhile; its result, or None if it failed."""
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            continue  # a thread cannot be stopped: what it began must be cleaned up by us
        except BaseException:
            break
    if task.cancelled() or task.exception() is not None:
        return None
    return task.result()


async def _discard(policy: StagedPolicy, step: int) -> None:
    """Drop a staged policy the save will not write (logged, never raised: the failure is what surfaces)."""
    try:
        await policy.discard()
    except Exception:
        logger.warning("step %d: dropping the staged policy failed", step, exc_info=True)


@dataclass
class _DataPlanePart:
    """What step 3-4 of a save produced: the captured index and loader position, the data plane's
    files (or receipts of who wrote them), and how long the window, snapshot and upload took."""

    index: dict[str, Any]
    dp_metadata: dict[str, Any]
    loader_state: dict[str, Any]
    window_s: float
    snapshot_s: float
    upload_s: float
    receipts: list[Receipt] = field(default_factory=list)


class _Captured(Protocol):
    """The data plane's side of a save after the window: finish it, or drop it."""

    async def finish(self) -> _DataPlanePart: ...
    async def close(self) -> None: ...


class PendingSave:
    """A save between its foreground (policy staged, index captured) and its commit."""

    def __init__(
        self,
        parts: SaveParticipants,
        txn: BundleTransaction,
        step: int,
        upload_timing: UploadTiming,
        started: float,
        policy: StagedPolicy,
        policy_stage_s: float,
    ) -> None:
        self.parts, self.txn, self.step, self.upload_timing = parts, txn, step, upload_timing
        self.started = started
        self.foreground_s = 0.0
        self.policy_stage_s = policy_stage_s
        self._policy: StagedPolicy | None = policy
        self._captured: _Captured | None = None
        self._policy_written = False
        self.committed = False  # COMMIT is published: nothing can abort this save any more

    async def foreground(self) -> None:
        if self.upload_timing == "pinned":  # 3: the window
            self._captured = await _pinned_capture(self.parts, self.txn, self.step)
        else:
            self._captured = await _snapshot_capture(self.parts, self.txn, self.step, self.upload_timing)
        self.foreground_s = time.perf_counter() - self.started

    async def finish(self) -> SaveReport:
        """``commit`` then ``retain``: the rest of a save as the schedule takes it."""
        report = await self.commit()
        await self.retain()
        return report

    async def commit(self) -> SaveReport:
        """Steps 2 (write) and 4-5: the policy and the data plane written side by side, then loader,
        index, manifest and COMMIT. Nothing is committed on a failure (or a cancel), which re-raises."""
        try:
            return await self._write_and_commit()
        except BaseException as exc:
            await self.fail(exc)
            raise

    async def retain(self) -> None:
        """Retention after the commit (checkpoint/retention.py, the Checkpointer's too); it never un-commits the
        save. Separate from ``commit`` so a run that must stop within a grace period bounds the commit, not the
        clean-up."""
        if self.parts.retention is not None and self.parts.retention.deletes:
            await run_blocking(retain_after_commit, self.parts.store, self.parts.retention, self.parts.retention_holds)

    async def fail(self, cause: BaseException) -> None:
        """Drop what the foreground holds (pins, staging dir, the staged policy) and abort the transaction,
        unless it is committed already (a cancel that came while the COMMIT call ran)."""
        if self._captured is not None:
            await self._captured.close()
        if self._policy is not None and not self._policy_written:
            await _discard(self._policy, self.step)
        if self.committed:
            logger.warning("step %d: %s came after its COMMIT; the save is committed", self.step, type(cause).__name__)
            return
        await _abort(self.txn, self.step, cause)

    async def _write_and_commit(self) -> SaveReport:
        assert self._policy is not None and self._captured is not None, "finish() before foreground()"
        parts, txn, step = self.parts, self.txn, self.step
        t = time.perf_counter()

        async def write_policy() -> tuple[list[Receipt], float]:
            assert self._policy is not None
            receipts = await self._policy.write(txn)
            self._policy_written = True
            return receipts, time.perf_counter() - t

        try:
            (policy_receipts, policy_write_s), dp = await _both(write_policy(), self._captured.finish())
        finally:
            await self._captured.close()
        await run_blocking(txn.write_bytes, layout.LOADER_FILE, codec.dumps(dp.loader_state))
        await run_blocking(txn.write_bytes, layout.REPLAY_FILE, codec.dumps(dp.index))

        metadata = {
            **parts.extra_metadata,
            layout.META_FORMAT: layout.RUN_BUNDLE_FORMAT,
            layout.META_INDEX_DIGEST: dp.dp_metadata[layout.META_INDEX_DIGEST],
            layout.META_GROUP_COUNT: dp.dp_metadata[layout.META_GROUP_COUNT],
            layout.META_ROLLOUT_ORDER: parts.rollout_order,
            layout.META_UPLOAD_TIMING: self.upload_timing,
            "data_plane": dp.dp_metadata,
        }
        if parts.metrics is not None:
            metadata[METRICS_KEY] = finite_metrics(parts.metrics(), f"save of step {step}")
        _check_metadata(step, metadata)
        if parts.before_commit is not None:
            await parts.before_commit(step)
        receipts = [*policy_receipts, *dp.receipts]
        manifest = await self._publish(metadata, receipts)  # 5: COMMIT
        report = SaveReport(
            step=step,
            manifest_digest=str(Digest.of(manifest.to_bytes())),
            total_s=time.perf_counter() - self.started,
            foreground_s=self.foreground_s,
            policy_stage_s=self.policy_stage_s,
            policy_s=self.policy_stage_s + policy_write_s,
            window_s=dp.window_s,
            snapshot_s=dp.snapshot_s,
            upload_s=dp.upload_s,
            bytes_written=manifest.total_size,
            group_count=dp.dp_metadata[layout.META_GROUP_COUNT],
            upload_timing=self.upload_timing,
        )
        logger.info(
            "saved step %d: %d groups, %.1f MiB, foreground %.3fs (window %.3fs), snapshot %.3fs, upload %.3fs, "
            "total %.3fs",
            step,
            report.group_count,
            report.bytes_written / 2**20,
            report.foreground_s,
            dp.window_s,
            dp.snapshot_s,
            dp.upload_s,
            report.total_s,
        )
        return report

    async def _publish(self, metadata: dict[str, Any], receipts: list[Receipt]) -> Manifest:
        """Manifest and COMMIT, in a thread. A cancel that comes meanwhile cannot stop the thread: it
        waits for it, sets ``committed`` if the COMMIT went out, and then goes on (re-raised)."""
        call = asyncio.ensure_future(asyncio.to_thread(functools.partial(self.txn.commit, metadata, receipts=receipts)))
        try:
            manifest = await asyncio.shield(call)
        except asyncio.CancelledError:
            self.committed = await _settled(call) is not None
            raise
        self.committed = True
        return manifest


def _check_metadata(step: int, metadata: dict[str, Any]) -> None:
    """Refuse to commit run-bundle metadata that restore would refuse (a rollout order it does not know,
    extra metadata over one of its keys): the save fails, not a resume long after."""
    try:
        RUN_BUNDLE.check(metadata, f"step {step}: manifest metadata")
    except CorruptBundleError as exc:
        raise CheckpointError(f"refusing to commit what no restore would read: {exc}") from exc


async def _both(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Run two awaitables side by side; when one fails the other is cancelled (and awaited) and the
    failure re-raised as it is, so nothing of the save keeps running after it has failed."""
    one, two = asyncio.ensure_future(first), asyncio.ensure_future(second)
    tasks: list[asyncio.Future[Any]] = [one, two]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error
    return one.result(), two.result()


class _SnapshotCapture:
    """Staged/inline: TransferQueue's own snapshot taken inside the window into a local staging dir;
    ``finish`` digests and uploads it (inline did that inside the window already)."""

    def __init__(self, parts: SaveParticipants, txn: BundleTransaction, step: int, timing: UploadTiming) -> None:
        self.parts, self.txn, self.step, self.timing = parts, txn, step, timing
        self._staging = contextlib.ExitStack()
        self.snapshot_dir = (
            self._staging.enter_context(staging_dir(parts.staging_root, prefix=f"rlckpt-step{step}-"))
            / layout.DATA_PLANE_DIR
        )
        self.compression = data_plane_compression(parts.store, parts.compress_data_plane)
        self.done: _DataPlanePart | None = None

    async def window(self) -> None:
        parts = self.parts
        async with parts.replay.barrier.checkpoint():  # 3: the window
            window_started = time.perf_counter()
            captured = parts.replay.capture_index()  # pointer copies; serialized after release
            loader_state = parts.capture_loader_state()  # same instant as the index: see module doc
            data_plane = parts.replay.data_plane
            t = time.perf_counter()
            stored, _ = await asyncio.gather(  # both only read; nothing can write inside the window
                data_plane.list_sample_ids(parts.replay.partition_id),
                data_plane.save_checkpoint(
                    self.snapshot_dir, metadata={"step": self.step, layout.META_ROLLOUT_ORDER: parts.rollout_order}
                ),
            )
            snapshot_s = time.perf_counter() - t
            parts.replay.validate_inventory(stored)  # a mismatch aborts the save: nothing is committed
            self.captured, self.loader_state, self.snapshot_s = captured, loader_state, snapshot_s
            if self.timing == "inline":  # digest and upload while rollouts wait (for comparison only)
                self.done = await self._upload(window_started)
            self.window_s = time.perf_counter() - window_started
        if self.done is not None:
            self.done.window_s = self.window_s

    async def _upload(self, window_started: float | None = None) -> _DataPlanePart:
        index, dp_metadata = await run_blocking(
            _finish_snapshot, self.captured, self.snapshot_dir, self.step, self.parts.rollout_order
        )
        upload_s = await _upload_snapshot(self.txn, self.snapshot_dir, self.compression)
        window_s = 0.0 if window_started is None else time.perf_counter() - window_started
        return _DataPlanePart(index, dp_metadata, self.loader_state, window_s, self.snapshot_s, upload_s)

    async def finish(self) -> _DataPlanePart:
        if self.done is None:  # 4: outside the window, off the event loop (rollouts resume at once)
            self.done = await self._upload()
            self.done.window_s = self.window_s
        return self.done

    async def close(self) -> None:
        self._staging.close()


async def _snapshot_capture(
    parts: SaveParticipants, txn: BundleTransaction, step: int, timing: UploadTiming
) -> _SnapshotCapture:
    capture = _SnapshotCapture(parts, txn, step, timing)
    try:
        await capture.window()
    except BaseException:
        await capture.close()
        raise
    return capture


class _PinnedCapture:
    """Pinned: the window was one synchronous step (index + loader captured, rows pinned); ``finish``
    copies exactly the captured rows while rollouts keep committing, unpinning as it goes, and checks
    the data plane holds no row the index cannot account for."""

    def __init__(self, parts: SaveParticipants, txn: BundleTransaction, step: int, copier: RowCopier) -> None:
        self.parts, self.txn, self.step, self.copier = parts, txn, step, copier
        self._pinned = False

    async def window(self) -> None:
        replay = self.parts.replay
        await replay.settle_removals()  # a removal already in flight finishes first; it never holds commits
        window_started = time.perf_counter()  # the window: one synchronous step, nothing awaited
        self.captured = replay.pin_capture()
        self._pinned = True
        self.loader_state = self.parts.capture_loader_state()
        self.window_s = time.perf_counter() - window_started

    async def finish(self) -> _DataPlanePart:
        replay, copier, txn = self.parts.replay, self.copier, self.txn
        t = time.perf_counter()
        await copier.begin(txn.handle(), data_plane_compression(self.parts.store, self.parts.compress_data_plane))
        try:
            with replay.observe_mutations() as raced:
                listing = asyncio.ensure_future(replay.data_plane.list_sample_ids(replay.partition_id))
                try:
                    files = await _copy_pinned_rows(replay, copier, self.captured)
                finally:
                    stored = await listing
            replay.check_no_strays(stored, self.captured, raced)  # a mismatch aborts the save
            index, dp_metadata = _index_metadata(self.captured, self.step, self.parts.rollout_order)
            receipt = await copier.seal()
        except BaseException:
            await copier.abort()
            raise
        finally:
            await self.close()
        snapshot_s = time.perf_counter() - t
        document = rows_metadata(replay.partition_id, files, dp_metadata)
        await run_blocking(txn.write_bytes, layout.DATA_PLANE_METADATA, document)
        return _DataPlanePart(index, dp_metadata, self.loader_state, self.window_s, snapshot_s, 0.0, [receipt])

    async def close(self) -> None:
        if self._pinned:
            self._pinned = False
            await self.parts.replay.end_pins()


async def _pinned_capture(parts: SaveParticipants, txn: BundleTransaction, step: int) -> _PinnedCapture:
    if parts.row_copier is None:
        raise CheckpointError(f"step {step}: a pinned save needs a row copier (SaveParticipants.row_copier)")
    capture = _PinnedCapture(parts, txn, step, parts.row_copier)
    await capture.window()
    return capture


async def _copy_pinned_rows(replay: ReplayBuffer, copier: RowCopier, captured: IndexCapture) -> list[str]:
    """One rows file per batch of captured groups (groups with the same columns, about ROWS_PER_FILE
    rows), COPY_DEPTH batches in flight (one is read while the one before is written); each batch
    is unpinned once its file is written. Returns the files, relative to ``data_plane/``."""
    files: list[str] = []
    in_flight: list[tuple[asyncio.Future[int], list[GroupRecord]]] = []
    try:
        for batch in _batches(captured.committed):
            name = f"rows-{len(files):06d}.bin"
            keys = [s for g in batch for s in g.sample_ids]
            copy = copier.copy(replay.partition_id, keys, batch[0].fields, f"{layout.DATA_PLANE_DIR}/{name}")
            in_flight.append((asyncio.ensure_future(copy), batch))
            files.append(name)
            if len(in_flight) >= COPY_DEPTH:
                await _finish_oldest(replay, in_flight)
        while in_flight:
            await _finish_oldest(replay, in_flight)
    except BaseException:
        for future, _batch in in_flight:
            future.cancel()
        await asyncio.gather(*(future for future, _batch in in_flight), return_exceptions=True)
        raise
    return files


async def _finish_oldest(replay: ReplayBuffer, in_flight: list[tuple[asyncio.Future[int], list[GroupRecord]]]) -> None:
    future, batch = in_flight[0]
    await future
    in_flight.pop(0)
    await replay.unpin(g.group_id for g in batch)


def _batches(groups: list[GroupRecord]) -> list[list[GroupRecord]]:
    """Consecutive groups with the same columns, about ROWS_PER_FILE rows per batch."""
    out: list[list[GroupRecord]] = []
    for group in groups:
        last = out[-1] if out else None
        if last and last[0].fields == group.fields and sum(len(g.sample_ids) for g in last) < ROWS_PER_FILE:
            last.append(group)
        else:
            out.append([group])
    return out


def _index_metadata(captured: IndexCapture, step: int, rollout_order: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The captured index serialized and digested, and the data-plane metadata that names its digest."""
    index = captured.state_dict()
    dp_metadata = {
        layout.META_INDEX_DIGEST: index["digest"],
        layout.META_GROUP_COUNT: len(index["groups"]),
        layout.META_ROLLOUT_ORDER: rollout_order,
        "step": step,
        "partition_id": index["partition_id"],
    }
    return index, dp_metadata


def data_plane_compression(store: BundleStore, wanted: bool | None) -> str | None:
    """zstd for ``data_plane/`` files: as asked, or by default only on object stores.

    Token ids compress ≈4× at ≈220 MiB/s, which pays against S3's ≈100 MiB/s; on local NVMe it
    only costs CPU (the save/restore benchmark measured 1.11 s with zstd vs 0.98 s without).
    """
    use = (not store.is_local) if wanted is None else wanted
    return "zstd" if use else None


def _finish_snapshot(
    captured: IndexCapture, snapshot_dir: Path, step: int, rollout_order: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Serialize and digest the captured index, and tie the staged snapshot to it by that digest."""
    index, dp_metadata = _index_metadata(captured, step, rollout_order)
    update_snapshot_metadata(snapshot_dir, dp_metadata)
    return index, dp_metadata


async def _upload_snapshot(txn: BundleTransaction, snapshot_dir: Path, compression: str | None) -> float:
    """Digest and upload the staged snapshot as ``data_plane/``; returns the seconds it took."""
    t = time.perf_counter()
    if not snapshot_dir.is_dir():
        raise CheckpointError(f"step {txn.step}: the data plane wrote no snapshot at {snapshot_dir}")
    await run_blocking(txn.put_dir, layout.DATA_PLANE_DIR, snapshot_dir, compression)
    return time.perf_counter() - t


async def _abort(txn: BundleTransaction, step: int, cause: BaseException) -> None:
    """Abort the transaction after a failure; the failure, not a cleanup problem, is what surfaces."""
    logger.error("save of step %d failed (%s: %s); aborting, nothing is committed", step, type(cause).__name__, cause)
    try:
        await run_blocking(txn.abort)
    except Exception:  # logged, not raised: gc removes what an aborted writer could not
        logger.warning("abort of step %d failed; `rlckpt gc` will remove its debris", step, exc_info=True)
