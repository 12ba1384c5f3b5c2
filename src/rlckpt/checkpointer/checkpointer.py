"""Checkpointer: transactional checkpoints for a trainer rlckpt does not own (torchrun, Ray actors), one per rank.

A save of step N is one bundle transaction of the run (docs/store-protocol.md) whatever the world size:

1. foreground, on every rank (what ``save()`` blocks for): rank 0 begins the transaction (the write-ahead
   intent, claiming the step) while every rank copies its state dict to host memory with DCP's stager
   (checkpoint/rank_save.py: `rlckpt train`'s trainer ranks stage and write the same way) and encodes its
   extra pieces; one exchange of the save group tells every rank whether all of that worked
   on every rank, and carries the transaction's handle (plain data) from rank 0 to the others. A failure
   on any rank (a piece that would need pickle, an out-of-memory copy, a step already committed) aborts the
   save on every rank before a byte is written; each raises the same CheckpointerError.
2. background (a thread of each rank; async by default, one save in flight): every rank ``dcp.save``s its
   staged shards into the transaction as participant ``rank<r>`` (rlckpt.dcp's BundleStorageWriter) and its
   own pieces as ``rank<r>-extra``; rank 0 writes the shared pieces through the transaction itself.
3. the receipts (JSON) are gathered to rank 0, which commits once — every participant exactly once, the
   manifest's metadata checked as a restore will read it — or aborts if any rank failed; the outcome is
   broadcast, so every rank's ``wait()`` returns the same result or raises the same error.
4. rank 0, after the commit: the remote tier's replication is queued (when due) and retention runs with its
   holds (checkpoint/retention.py, as `rlckpt train`'s; the queue: checkpointer/tiers.py), beside training.

A restore chooses on rank 0 — the newest bundle that verifies on either tier (every digest read), or a
pinned step (checkpoint/choice.py, as `rlckpt train`) — and broadcasts the choice; every rank then loads its
shards with ``dcp.load`` (DCP reshards from any world size) and its pieces, each byte digest-checked again,
nothing unpickled where code could run (pieces.py).

Every exchange between ranks happens on every rank whatever failed locally before it (a failure is carried
as a message, never by skipping the collective), so a rank that fails never leaves the others waiting.

A save that ``save()`` returned for is finished, not dropped, however the Checkpointer ends: ``close()``, a
``with`` block left normally or on an exception, or the interpreter's exit with the Checkpointer still open
(an uncaught exception in the training loop) all wait for it to commit or fail — on an error path for at most
``group_timeout_s``, then it is aborted. Only Ctrl-C (KeyboardInterrupt) leaves at once, abandoning it. What
cannot hold: a rank that died takes its part of the save with it, and the others' save fails ("rank 1 died").
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from rlckpt.checkpoint.retention import retain_after_commit
from rlckpt.checkpoint.stopping import SaveTimes
from rlckpt.errors import CheckpointerError
from rlckpt.tiers import one_run

from .config import CheckpointerConfig
from .ranks import RankGroup
from .restoring import rebuilt, restore
from .results import Restored, SaveResult
from .saving import SaveInFlight, Saver
from .tiers import BackgroundReplication

logger = logging.getLogger(__name__)


class Checkpointer:
    """Transactional checkpoints of a DCP state dict plus named extra pieces, for a trainer rlckpt does not own.

    One per rank, made at the same point of the program on every rank (it makes two gloo groups of its own
    over the default process group; without torch.distributed initialized it is one process's). Every rank
    makes the same calls in the same order: ``save``, ``wait``, ``restore``, ``close`` and
    ``SaveAndStop.should_stop`` are collectives.

        ckpt = Checkpointer("s3://bucket/run1", storage_options={...})
        restored = ckpt.restore({"train": train_state})     # None on a fresh run
        for step in range(start, steps):
            train_step()
            if (step + 1) % save_every == 0:
                ckpt.save(step + 1, {"train": train_state}, extra={"loader": loader.state_dict()})
        ckpt.close()                                         # waits for the save in flight

    See docs/trainer.md for the guarantees and every failure mode.
    """

    def __init__(self, config: CheckpointerConfig | str | os.PathLike[str], **settings: Any) -> None:
        """
        Args:
            config: a CheckpointerConfig, or the run's URL with its fields as keyword arguments
                (`Checkpointer("/nvme/run1", retention=Retention(keep_last=3))`).
        Raises:
            ValueError: settings that do not fit (CheckpointerConfig's checks); TypeError: both forms given.
            KeyFileError: a key file that cannot be used.
            RankGroupError: the Checkpointer's gloo groups could not be made.
            RunIdentityError, StoreUnavailableError, ...: rank 0 could not prepare a two-tier run (the tiers
                name two different runs; a tier unreachable): the same class on every rank.
        """
        if isinstance(config, CheckpointerConfig):
            if settings:
                raise TypeError("pass a CheckpointerConfig or keyword settings, not both")
            self.config = config
        else:
            self.config = CheckpointerConfig(url=os.fspath(config), **settings)
        self.ranks = RankGroup.of_job(self.config.group_timeout_s)
        self.save_times = SaveTimes(self.config.unmeasured_save_s)  # the deadline's estimate (SaveAndStop)
        self.tiers = self.config.tiers()  # every rank its own stores: each reads and writes on its own
        self.store = self.tiers[0]
        self.committed_step: int | None = None  # the resume point this process knows of (saved or restored)
        self._saver = Saver(self.config, self.ranks, self.store)
        self._inflight: SaveInFlight | None = None
        self._closed = False
        self._committed_saves = 0
        self._replication: BackgroundReplication | None = None
        failure: dict[str, str] | None = None
        if self.ranks.is_coordinator:
            try:
                self._replication = self._prepare_tiers()
            except Exception as exc:
                failure = {"type": type(exc).__name__, "message": str(exc)}
        failure = self.ranks.broadcast(failure, self.ranks.save_group, "preparing the run")
        if failure is not None:
            self._saver.close()
            raise rebuilt(failure, f"rank {self.ranks.rank}: the Checkpointer of {self.config.url} cannot start")
        _close_at_exit(self)  # an uncaught exception ends the interpreter with it open: the save is finished then

    def _prepare_tiers(self) -> BackgroundReplication | None:
        """Rank 0 of a two-tier run: the tiers made one run (an empty local tier takes the remote tier's run
        record), and the replication queue started."""
        replication = self.config.replication
        if replication is None:
            return None
        one_run(self.tiers)
        return BackgroundReplication(self.config.url, self.config.storage_options, replication)

    # --- what callers read -------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world_size(self) -> int:
        return self.ranks.world_size

    @property
    def saving(self) -> bool:
        """A save is being written in the background (its outcome not known yet)."""
        return self._inflight is not None and not self._inflight.done.is_set()

    @property
    def replicated(self) -> list[int]:
        """Rank 0 with a remote tier: the steps this process replicated there (else [])."""
        return self._replication.replicated if self._replication is not None else []

    @property
    def replication_failed(self) -> dict[int, str]:
        """Rank 0 with a remote tier: the steps whose replication failed, and why (else {})."""
        return self._replication.failed if self._replication is not None else {}

    # --- saving ------------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        *,
        extra: Mapping[str, Any] | None = None,
        rank_extra: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float] | None = None,
        metadata: Any = None,
        last: bool = False,
        block: bool | None = None,
    ) -> SaveResult | None:
        """Save `state` (a DCP state dict: tensors, DTensors, Stateful objects) and the extra pieces as the bundle
        of `step`. A collective: every rank calls it with the same step.

        Async (the default, `config.async_save`): returns once every rank copied its state to host memory and
        rank 0 began the transaction; the rest is written in the background while training goes on. One save
        is in flight at most: a save called while the previous one is still writing waits for it first (and
        raises its failure, with `save_failure="raise"`).

        Args:
            step: the bundle's step (an int >= 0; the same on every rank).
            state: what `dcp.save` saves, every rank its own shards; the caller may change it once this returns.
            extra: named pieces saved once, from rank 0 (dataloader position, counters): plain JSON data or
                tensors in plain containers (pieces.py); other ranks' values are not saved.
            rank_extra: named pieces of this rank (its RNG states), saved by every rank that passes them.
            metrics: numbers recorded in the manifest (rank 0's): what retention's keep_best ranks by.
            metadata: JSON data recorded in the manifest (rank 0's), handed back by `restore`.
            last: the run's last save (a stop's, the final step's): replicated to the remote tier whatever
                `replication.every` says.
            block: wait for the commit (True) or not (False); default: `not config.async_save`.
        Returns:
            The committed save when blocking, else None (`wait()` returns it).
        Raises:
            CheckpointerError: on every rank, when any rank failed before anything was written, naming the rank
                and the cause (the step already committed or held by a live writer, the store unreachable,
                ranks saving different steps, staging that failed) — nothing is committed; blocking, also
                when the save failed later. And a previous save's failure (`save_failure="raise"`).
            ExtraPieceError: (a CheckpointerError's cause) a piece that cannot be saved without pickle.
            RankGroupError: (a CheckpointerError) a rank died or did not make the same call in time.
        """
        self._check_open()
        self._settle_previous()
        save = self._saver.foreground(
            step, state, extra=extra, rank_extra=rank_extra, metrics=metrics, metadata=metadata, last=last
        )
        blocking = not self.config.async_save if block is None else block
        if blocking:
            self._background(save)
            save.collected = True
            return save.outcome()
        save.thread = threading.Thread(target=self._background, args=(save,), name=f"rlckpt-save-{step}", daemon=True)
        self._inflight = save
        save.thread.start()
        return None

    def wait(self, timeout: float | None = None) -> SaveResult | None:
        """Wait for the save in flight to commit: its result (the same on every rank), or None when no save is
        in flight (or its outcome was returned already). Call it on every rank.

        Args:
            timeout: at most this many seconds (a stop's `grace_left()`); then the save is abandoned.
        Raises:
            CheckpointerError: the save failed on some rank (named); nothing of it is committed.
            SaveTimeoutError: not committed within `timeout`: rank 0 aborts it unless its COMMIT had begun
                (then it waits for that to end and returns its result). Nothing of an aborted save is
                committed; the newest committed bundle stays the resume point.
        """
        save = self._inflight
        if save is None or save.collected:
            return None
        if not save.done.wait(timeout):
            save.collected = True
            self._saver.abandon(save, timeout, self.committed_step)
        save.collected = True
        return save.outcome()

    def _background(self, save: SaveInFlight) -> None:
        """The save's background (its thread, or the caller's when blocking), then what follows a commit."""
        self._saver.background(save)
        if save.result is None:
            return
        self.save_times.record(save.result.total_s)
        self.committed_step = save.step
        self._committed_saves += 1
        if self.ranks.is_coordinator:
            self._after_commit(save)

    def _after_commit(self, save: SaveInFlight) -> None:
        """Rank 0, after a commit: the remote tier's replication when due (every `replication.every`-th committed
        save of this process, and a `last` one), then retention with its holds."""
        replication = self._replication
        every = self.config.replication.every if self.config.replication is not None else 1
        if replication is not None and (save.last or self._committed_saves % every == 0):
            replication.submit(save.step)
        holds = None if replication is None else (lambda: replication.holds(self.store))
        retain_after_commit(self.store, self.config.retention, holds)

    def _settle_previous(self) -> None:
        """The save in flight ends before another call of the save group begins: its thread (outcome, then
        retention) is joined, and an outcome nobody collected is raised or logged (`save_failure`)."""
        save, self._inflight = self._inflight, None
        if save is None:
            return
        if save.thread is not None:
            if not save.done.is_set():
                logger.info("rank %d: waiting for the save of step %d first (one in flight)", self.rank, save.step)
            save.thread.join()
        if save.collected:
            return
        save.collected = True
        try:
            save.outcome()
        except CheckpointerError as exc:
            if self.config.save_failure == "raise":
                raise
            logger.error("rank %d: %s (save_failure=log: going on)", self.rank, exc)

    # --- restoring ---------------------------------------------------------------------------------

    def restore(self, state: Any, *, step: int | None = None) -> Restored | None:
        """Load the newest bundle that verifies on any tier (or exactly `step`) into `state`, in place: a DCP
        state dict, as for `save` (DCP reshards from the world size that saved it). A collective.

        Rank 0 chooses: a newer bundle that does not verify (a digest, its record, with a verify key its
        signature) is skipped, loudly, and listed in `Restored.skipped`; on a tie the run's tier is read before
        the remote one. Every rank then reads what it needs, each byte digest-checked again.

        Args:
            state: the state dict to load into (as for `dcp.load`; Stateful values get `load_state_dict`).
            step: restore exactly this step, or fail (no fallback).
        Returns:
            What was restored, the same on every rank but `rank_extra`, or None when no tier holds a committed
            bundle (a fresh run).
        Raises:
            CheckpointError: no committed bundle verifies; or `step` does not verify, is not committed, or is
                below newer committed bundles that the run would save over.
            BundleFormatError: the newest bundle is not a Checkpointer bundle this rlckpt reads (a newer format,
                or a run bundle of `rlckpt train`): nothing is loaded and no older one tried.
            NewerFormatError, StoreUnavailableError: as the store raises them (a newer manifest or COMMIT; a
                tier that cannot be reached).
            CheckpointerError: opening, loading or reading the pieces failed on some rank (named; the cause on
                that rank: UnsafeContentError for a piece that is not json or a tensor archive, or names a
                pickle global): `state` may be partly loaded, do not use it.
            RankGroupError: a rank died or did not make the same call in time.
        """
        self._check_open()
        self._settle_previous()
        restored = restore(self.config, self.ranks, self.tiers, state, step)
        if restored is not None:
            self.committed_step = restored.step
        return restored

    # --- ending ------------------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Wait for the save in flight (`wait(timeout)`) and its retention, then for the remote tier's
        replication within what is left of `timeout`, stop the background threads and destroy the two gloo
        groups (`RankGroup.close`). Call it on every rank before the process group is destroyed. Idempotent.

        Raises:
            what `wait` raises (the save in flight's failure or timeout); the threads are stopped anyway.
        """
        if self._closed:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self.wait(timeout)
            self._settle_previous()
            if self._replication is not None and not self._replication.drain(_left(deadline)):
                unfinished = sorted(self._replication.pending())
                logger.warning("closing with the replication of step(s) %s unfinished", unfinished)
        finally:
            self._closed = True
            _OPEN.discard(self)
            if self._replication is not None:
                self._replication.close()
            self._saver.close()
            self.ranks.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        elif issubclass(exc_type, KeyboardInterrupt):  # Ctrl-C: stop at once (abandoned unless committing)
            self._close_quietly(0, "interrupted")
        else:
            self.close_after_error(f"leaving the Checkpointer on an error ({exc_type.__name__}: {exc})")

    def close_after_error(self, why: str) -> None:
        """Close on an error path (`why`: what happened, for the log): the save in flight is finished first —
        committed, or failed — within `group_timeout_s`, and what became of it is logged; nothing raises here,
        so the error that led here is the one the caller sees. Call it on every rank that ends (the others
        close as usual): a rank that died cannot, and the others' save then fails, logged as such."""
        save = self._inflight
        step = None if save is None or save.collected else save.step
        if step is not None:
            logger.warning(
                "rank %d: %s: finishing the save of step %d first (at most %.0fs)",
                self.rank,
                why,
                step,
                self.config.group_timeout_s,
            )
        closed = self._close_quietly(self.config.group_timeout_s, why)
        if closed and save is not None and step is not None and save.result is not None:
            logger.warning("rank %d: the save of step %d committed before the Checkpointer closed", self.rank, step)

    def _close_quietly(self, timeout: float, why: str) -> bool:
        """`close(timeout)`, its failure logged rather than raised; whether it closed without one."""
        try:
            self.close(timeout=timeout)
        except Exception as exc:
            logger.error(
                "rank %d: closing the Checkpointer (%s): %s; the resume point is step %s",
                self.rank,
                why,
                exc,
                self.committed_step,
            )
            return False
        return True

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointerError(f"the Checkpointer of {self.config.url} is closed")


# The Checkpointers of this process not closed yet, closed at the interpreter's exit by `_close_open`. It runs
# as threading's shutdown begins (threading._register_atexit, CPython's hook that concurrent.futures uses
# itself): before the thread pools a save writes through refuse new work, which they do by atexit's time.
_OPEN: weakref.WeakSet[Checkpointer] = weakref.WeakSet()
_HOOKED = False
_HOOK_LOCK = threading.Lock()


def _close_at_exit(ckpt: Checkpointer) -> None:
    """Close `ckpt` at the interpreter's exit if nobody did (its save in flight finished first)."""
    global _HOOKED
    with _HOOK_LOCK:
        if not _HOOKED:
            threading._register_atexit(_close_open)  # type: ignore[attr-defined]
            _HOOKED = True
        _OPEN.add(ckpt)


def _close_open() -> None:
    """threading's shutdown: every Checkpointer still open (an uncaught exception, or no `close()`) finishes its
    save in flight, as `close_after_error` does, then closes."""
    for ckpt in list(_OPEN):
        if not ckpt._closed:
            ckpt.close_after_error("the interpreter is exiting with the Checkpointer open")


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())
