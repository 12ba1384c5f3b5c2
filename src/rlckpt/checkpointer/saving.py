"""The save protocol of a Checkpointer on one rank: steps 1-3 of checkpointer.py's module doc.

Every exchange between ranks happens on every rank whatever failed locally before it (a failure travels as a
message, never by skipping the collective), so a rank that fails never leaves the others waiting: the
foreground ends in one exchange, the background in one gather (and rank 0's broadcast of the outcome), and
``dcp.save`` between them fails on every rank at once when it fails on one (DCP's own collective errors).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlckpt.checkpoint.rank_save import StagedShards, stage_shards
from rlckpt.errors import CheckpointerError, SaveTimeoutError, ShardWriteError
from rlckpt.store import (
    BundleStore,
    BundleTransaction,
    Digest,
    Receipt,
    TransactionHandle,
    finite_metrics,
    validate_step,
)

from .config import CheckpointerConfig
from .pieces import EncodedPiece, encode_pieces, piece_path
from .ranks import RankGroup
from .record import STATE_DIR, metadata_of
from .results import SaveResult

logger = logging.getLogger(__name__)


@dataclass
class SaveInFlight:
    """One save on one rank, between its foreground and its outcome."""

    step: int
    handle: TransactionHandle
    staged: StagedShards  # the host copy of this rank's state (dropped once written)
    rank_pieces: dict[str, EncodedPiece]
    started: float
    foreground_s: float
    last: bool
    # rank 0 only: the transaction, the shared pieces and what the manifest's metadata will say
    txn: BundleTransaction | None = None
    pieces: dict[str, EncodedPiece] = field(default_factory=dict)
    rank_kinds: list[dict[str, str]] = field(default_factory=list)
    metrics: Mapping[str, float] | None = None
    user: Any = None
    # the outcome, once every rank knows it
    done: threading.Event = field(default_factory=threading.Event)
    result: SaveResult | None = None
    error: CheckpointerError | None = None
    thread: threading.Thread | None = None
    state_receipt: Receipt | None = None  # this rank's shards, written
    extra_receipt: Receipt | None = None  # this rank's own pieces, sealed
    collected: bool = False  # its outcome was handed to the caller (by wait), or settled
    lock: threading.Lock = field(default_factory=threading.Lock)
    committing: bool = False  # rank 0: COMMIT under way; from here on a timeout no longer abandons it
    abandoned: bool = False  # rank 0: a wait timed out first; the save must not commit

    def outcome(self) -> SaveResult:
        """The committed save, or its error raised."""
        if self.error is not None:
            raise self.error
        assert self.result is not None, "an outcome is a result or an error"
        return self.result


class Saver:
    """Runs saves of one rank: the foreground (caller's thread), the background (a thread, or the caller's)."""

    def __init__(self, config: CheckpointerConfig, ranks: RankGroup, store: BundleStore) -> None:
        self.config, self.ranks, self.store = config, ranks, store
        self._begin_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlckpt-begin")

    def close(self) -> None:
        self._begin_pool.shutdown(wait=False)

    # --- 1: the foreground -------------------------------------------------------------------------

    def foreground(
        self,
        step: int,
        state: Mapping[str, Any],
        *,
        extra: Mapping[str, Any] | None,
        rank_extra: Mapping[str, Any] | None,
        metrics: Mapping[str, float] | None,
        metadata: Any,
        last: bool,
    ) -> SaveInFlight:
        """Rank 0 begins the transaction while every rank stages its state and encodes its pieces; one
        exchange. A SaveInFlight on every rank, or the same CheckpointerError on every rank (nothing written)."""
        started = time.perf_counter()
        coordinator = self.ranks.is_coordinator
        begin = None
        if coordinator and _is_step(step):
            begin = self._begin_pool.submit(self.store.begin, step, replace_corrupt=True, reuse=self.config.reuse)
        local: BaseException | None = None
        staged = StagedShards(None)
        pieces: dict[str, EncodedPiece] = {}
        rank_pieces: dict[str, EncodedPiece] = {}
        try:
            validate_step(step)
            if coordinator:
                pieces = encode_pieces(extra, "extra")
                metrics = finite_metrics(metrics or {}, f"save of step {step}")  # a diverged run still saves
                metadata_of(self.ranks.world_size, {}, [], metrics, metadata)  # refused now, not at the commit
            rank_pieces = encode_pieces(rank_extra, f"rank {self.ranks.rank}'s rank_extra")
            staged = stage_shards(state)  # rlckpt train's trainer ranks stage with it too
        except Exception as exc:
            local = exc
        txn: BundleTransaction | None = None
        if begin is not None:
            try:
                txn = begin.result()
            except Exception as exc:
                local = local or exc
        mine = {
            "rank": self.ranks.rank,
            "step": step if _is_step(step) else repr(step),
            "error": None if local is None else describe(local),
            "rank_extra": {name: piece.kind for name, piece in rank_pieces.items()},
            "handle": txn.handle().to_json() if txn is not None and local is None else None,
        }
        try:
            everyone = self.ranks.all_gather(mine, self.ranks.save_group, f"beginning the save of step {step}")
        except CheckpointerError:
            abort_quietly(txn)
            raise
        problems = [f"rank {m['rank']}: {m['error']}" for m in everyone if m["error"]]
        steps = sorted({str(m["step"]) for m in everyone})
        if len(steps) > 1:
            problems.append(f"the ranks save different steps ({', '.join(steps)})")
        if problems:
            abort_quietly(txn)
            raise CheckpointerError(
                f"save of step {step} to {self.config.url} failed before anything was written: "
                f"{'; '.join(problems)}; nothing committed"
            ) from local
        return SaveInFlight(
            step=step,
            handle=TransactionHandle.from_json(everyone[0]["handle"]),
            staged=staged,
            rank_pieces=rank_pieces,
            started=started,
            foreground_s=time.perf_counter() - started,
            last=last,
            txn=txn,
            pieces=pieces,
            rank_kinds=[m["rank_extra"] for m in everyone],
            metrics=metrics,
            user=metadata,
        )

    # --- 2-3: the background -----------------------------------------------------------------------

    def background(self, save: SaveInFlight) -> None:
        """Write this rank's part, gather the receipts to rank 0, which commits or aborts, and learn the outcome
        (`save.result` or `save.error`, then `save.done`)."""
        error = self._write(save)
        receipts = [r for r in (save.state_receipt, save.extra_receipt) if r is not None]
        mine = {"rank": self.ranks.rank, "error": error, "receipts": [r.to_json() for r in receipts]}
        everyone: list[dict[str, Any]] | None = None
        group_error = None
        try:
            everyone = self.ranks.all_gather(mine, self.ranks.save_group, f"gathering the receipts of step {save.step}")
        except CheckpointerError as exc:
            group_error = str(exc)
        outcome = self._commit_or_abort(save, everyone, group_error) if self.ranks.is_coordinator else None
        if everyone is not None:
            try:
                outcome = self.ranks.broadcast(outcome, self.ranks.save_group, f"the outcome of step {save.step}")
            except CheckpointerError as exc:
                outcome = outcome if self.ranks.is_coordinator else {"error": str(exc)}
        elif not self.ranks.is_coordinator:
            outcome = {"error": f"save of step {save.step} failed: {group_error}; nothing committed"}
        assert outcome is not None
        self._learn(save, outcome)

    def _write(self, save: SaveInFlight) -> str | None:
        """This rank's part: its shards (checkpoint/rank_save.py, as `rlckpt train`'s trainer ranks write theirs:
        DCP, a collective that fails on every rank at once), then its own pieces, and on rank 0 the shared
        ones. What failed, in one line, or None."""
        try:
            save.state_receipt = save.staged.write(  # the host copy is released here, whatever happens
                save.handle,
                participant=f"rank{self.ranks.rank}",
                prefix=STATE_DIR,
                process_group=self.ranks.save_group,
                planner=self.config.save_planner,
                thread_count=self.config.dcp_thread_count,
                compression=self.config.compression,
                reuse=self.config.reuse,
            )
        except ShardWriteError as exc:
            return f"writing the state failed: {exc.failures}"
        try:
            if save.rank_pieces:
                with BundleStore.join(save.handle, f"rank{self.ranks.rank}-extra") as part:
                    for name, piece in save.rank_pieces.items():
                        part.write_bytes(piece_path(name, piece.kind, self.ranks.rank), piece.data)
                    save.extra_receipt = part.seal()
            if save.txn is not None:
                for name, piece in save.pieces.items():
                    save.txn.write_bytes(piece_path(name, piece.kind), piece.data)
        except Exception as exc:  # rank 0 learns it in the gather and aborts the whole transaction
            return describe(exc)
        return None

    def _commit_or_abort(
        self, save: SaveInFlight, everyone: list[dict[str, Any]] | None, group_error: str | None
    ) -> dict[str, Any]:
        """Rank 0: commit once when every rank succeeded (and no wait gave up on the save first), else abort."""
        txn = save.txn
        assert txn is not None, "rank 0 holds the transaction"
        problems = [group_error] if group_error else []
        problems += [f"rank {m['rank']}: {m['error']}" for m in everyone or [] if m["error"]]
        with save.lock:
            if save.abandoned:
                problems.append("a wait for it timed out first (abandoned)")
            if not problems:
                save.committing = True
        where = f"save of step {save.step} to {self.config.url}"
        if problems:
            abort_quietly(txn)
            return {"error": f"{where} failed: {'; '.join(problems)}; nothing committed"}
        assert everyone is not None
        try:
            receipts = [Receipt.from_json(r) for m in everyone for r in m["receipts"]]
            participants = {f"rank{r}" for r in range(self.ranks.world_size)}
            participants |= {f"rank{r}-extra" for r, kinds in enumerate(save.rank_kinds) if kinds}
            kinds = {name: piece.kind for name, piece in save.pieces.items()}
            meta = metadata_of(self.ranks.world_size, kinds, save.rank_kinds, save.metrics, save.user)
            manifest = txn.commit(meta, receipts=receipts, participants=participants)
        except Exception as exc:  # a refused commit aborted the transaction: nothing is published
            abort_quietly(txn)
            return {"error": f"{where} failed at its commit: {describe(exc)}; nothing committed"}
        return {
            "digest": str(Digest.of(manifest.to_bytes())),
            "bytes": manifest.total_size,
            "files": len(manifest.files),
            "total_s": time.perf_counter() - save.started,
        }

    def _learn(self, save: SaveInFlight, outcome: dict[str, Any]) -> None:
        """Record the outcome every rank learned, and wake the caller's wait."""
        if "error" in outcome:
            save.error = CheckpointerError(outcome["error"])
            logger.error("rank %d: %s", self.ranks.rank, outcome["error"])
        else:
            save.result = SaveResult(
                save.step,
                self.config.url,
                outcome["digest"],
                outcome["bytes"],
                outcome["files"],
                self.ranks.world_size,
                save.foreground_s,
                outcome["total_s"],
            )
            if self.ranks.is_coordinator:
                logger.info(
                    "saved step %d to %s: %.1f MiB in %d files by %d ranks; the caller waited %.3fs, the save "
                    "took %.3fs",
                    save.step,
                    self.config.url,
                    save.result.bytes_written / 2**20,
                    save.result.files,
                    self.ranks.world_size,
                    save.result.foreground_s,
                    save.result.total_s,
                )
        save.done.set()

    # --- a wait that gave up -----------------------------------------------------------------------

    def abandon(self, save: SaveInFlight, timeout: float | None, resume_point: int | None) -> None:
        """A wait gave up on `save`: on rank 0 it is aborted unless its COMMIT had begun (then this waits for
        that, and returns). Otherwise SaveTimeoutError."""
        with save.lock:
            committing = save.committing
            if not committing:
                save.abandoned = True
        if committing:  # its few storage calls end on their own: their outcome is the save's
            save.done.wait()
            return
        abort_quietly(save.txn)  # its thread ends on its own: the abort makes its writes fail
        if self.ranks.is_coordinator:
            raise SaveTimeoutError(
                f"the save of step {save.step} to {self.config.url} did not commit within {timeout:.1f}s: aborted "
                f"before its COMMIT (nothing of it is committed); the resume point is step {resume_point}"
            )
        raise SaveTimeoutError(
            f"rank {self.ranks.rank}: the save of step {save.step} did not finish within {timeout:.1f}s here; rank 0 "
            "aborts it unless its COMMIT began before its own timeout"
        )


def _is_step(step: object) -> bool:
    return type(step) is int and step >= 0


def describe(exc: BaseException) -> str:
    """An exception in one line: its class and message."""
    return f"{type(exc).__name__}: {exc}"


def abort_quietly(txn: BundleTransaction | None) -> None:
    """Abort `txn` (if any); a failure is logged: the error that led here is what surfaces, and gc cleans up."""
    if txn is None:
        return
    try:
        txn.abort()
    except Exception:
        logger.warning("aborting step %s failed; `rlckpt gc` removes what it left", txn.step, exc_info=True)
