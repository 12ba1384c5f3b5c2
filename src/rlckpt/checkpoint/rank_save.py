"""One rank's part of a save, for every writer of a run: `rlckpt train`'s trainer ranks
(controller/ranks/trainer_rank.py) and the Checkpointer's ranks (checkpointer/saving.py) call these, so a fix to
the per-rank save lands in both.

1. ``stage_shards``: the rank's state (its FSDP2 shards, its optimizer state) copied to host memory with DCP's
   own stager, what ``dcp.async_save`` does first. It needs no transaction, so the coordinator begins one
   meanwhile, and the trainer may step again as soon as it returns.
2. ``StagedShards.write``: ``dcp.save`` of that copy through a ``BundleStorageWriter`` joined to the
   transaction (its handle: plain data, from any process) as one participant, digests streamed; the rank's
   receipt goes back to the coordinator, which commits once. A collective of the process group: every rank
   calls it. Whatever fails on a rank fails it on every rank at once — DCP's collectives carry a failure in
   one rank's write to all, and a planner a rank cannot make fails DCP's first collective step there rather
   than leave the others waiting for it until the group's timeout. The failing rank's files are dropped;
   the coordinator aborts the transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.stateful import Stateful

from rlckpt.dcp import BundleStorageWriter
from rlckpt.errors import ShardedCheckpointError, ShardWriteError
from rlckpt.grpo.trainer import checkpoint_failure
from rlckpt.store import Receipt, TransactionHandle

logger = logging.getLogger(__name__)

# Makes the DCP save planner of one write (None from it: DCP's default). Called on the rank, in the write.
PlannerFactory = Callable[[], Any]


@dataclass
class StagedShards:
    """One rank's state in host memory, not yet written; ``state`` is None once written or dropped."""

    state: dict[str, Any] | None

    def write(
        self,
        handle: TransactionHandle,
        *,
        participant: str,
        prefix: str,
        process_group: Any = None,
        planner: PlannerFactory | None = None,
        thread_count: int = 1,
        compression: str | None = None,
        reuse: bool = False,
    ) -> Receipt:
        """Write the staged copy into the transaction of `handle` as `participant`, under `prefix`; a collective
        of `process_group` (None: the default group, or this process alone). The host copy is released
        whatever happens.

        Args:
            handle: the transaction's handle (from the coordinator's ``txn.handle()``).
            participant: this rank's name in the transaction's roster (``rank<r>``).
            prefix: the bundle directory of the DCP checkpoint (``policy``, ``state``).
            process_group: the group DCP's collectives run on (one apart from training's).
            planner: makes this write's DCP save planner (None: DCP's default).
            thread_count: shard files this rank writes at once.
            compression: BundleStorageWriter's: "off" (None), "auto" (on object stores) or "on".
            reuse: BundleStorageWriter's: one file per tensor chunk of 1 MiB or more, so that an unchanged one is
                taken from the bundle the coordinator's `begin(step, reuse=True)` named.
        Returns:
            This rank's receipt (the coordinator's includes ``<prefix>/.metadata``).
        Raises:
            ShardWriteError: the write failed here or on another rank (``failures``: each failing rank's
                cause, in one line), or left no receipt; this rank's files are dropped.
        """
        state, self.state = self.state, None
        try:  # the same arguments on every rank: what this refuses, every rank refuses
            writer = BundleStorageWriter(
                handle,
                participant=participant,
                prefix=prefix,
                thread_count=thread_count,
                compression=compression,
                reuse=reuse,
            )
        except Exception as exc:
            failures = f"{type(exc).__name__}: {exc}"
            raise ShardWriteError(f"{participant}: step {handle.step}: {failures}", failures=failures) from exc
        if state is None:  # this rank cannot write: it says so in DCP's first collective, as every failure here
            nothing = ShardedCheckpointError(f"{participant}: nothing staged to write (written or dropped already)")
            state, made = {}, _RefusedPlanner(nothing)
        else:
            made = _made(planner)
        try:
            dcp.save(state, storage_writer=writer, planner=made, process_group=process_group)
        except (Exception, CheckpointException) as exc:  # CheckpointException (a BaseException): every rank's
            _abort_quietly(writer)
            failures = checkpoint_failure(exc)
            raise ShardWriteError(
                f"{participant}: writing {prefix}/ of step {handle.step} failed: {failures}", failures=failures
            ) from None
        except BaseException:  # KeyboardInterrupt, SystemExit: this rank's files go, the interrupt goes on
            _abort_quietly(writer)
            raise
        receipt = writer.receipt
        if receipt is None:
            raise ShardWriteError(
                f"{participant}: writing {prefix}/ of step {handle.step} left no receipt", failures="no receipt"
            )
        return receipt

    def discard(self) -> None:
        """Drop the host copy unwritten (the save failed before writing it)."""
        self.state = None


def stage_shards(state: Mapping[str, Any]) -> StagedShards:
    """Copy `state` (what ``dcp.save`` takes: tensors, DTensors, Stateful objects) to host memory with DCP's
    stager; the caller may change its state once this returns.

    Raises:
        whatever the copy raises (out of host memory, a value DCP cannot stage).
    """
    plain = {key: value.state_dict() if isinstance(value, Stateful) else value for key, value in state.items()}
    return StagedShards(BlockingAsyncStager().stage(plain))


class _RefusedPlanner(DefaultSavePlanner):
    """The planner of a rank whose own could not be made: it fails DCP's first collective step with why, so the
    other ranks' ``dcp.save`` fails with it at once instead of waiting for this rank until the group's timeout."""

    def __init__(self, cause: Exception) -> None:
        super().__init__()
        self.cause = cause

    def set_up_planner(
        self, state_dict: Any, storage_meta: StorageMeta | None = None, is_coordinator: bool = False
    ) -> None:
        raise self.cause


def _made(factory: PlannerFactory | None) -> Any:
    """The planner `factory` makes, or one that carries its failure into DCP's collectives."""
    if factory is None:
        return None
    try:
        return factory()
    except Exception as exc:
        return _RefusedPlanner(exc)


def _abort_quietly(writer: Any) -> None:
    """Drop this rank's unsealed files; a failure to is logged (the write's failure is what surfaces)."""
    try:
        writer.abort()
    except Exception:
        logger.warning("dropping an unfinished shard write failed; `rlckpt gc` removes its files", exc_info=True)
