"""TrainerRank: one rank of the trainer group — the body of a Ray actor (or, in tests, an in-process object).

Ranks form one gloo group (``join_group``) and hold the GRPO ``Trainer`` sharded with FSDP2 over it.
Every method that touches the weights is a collective: the group handle (``trainer_group.py``) calls it
on all ranks at once. A second gloo group is used by checkpoints only, so a save running in DCP's
background thread never interleaves its collectives with training's on the same group.

A save is two calls, as the controller's save wants it (checkpoint/save.py, ``StagedPolicy``), each the
per-rank save every writer of a run shares (checkpoint/rank_save.py, the Checkpointer's ranks call it too):

- ``stage_policy(copy)``: the rank's shards copied to host memory with DCP's own stager (what
  ``dcp.async_save`` does before it writes). It needs no transaction, so the controller begins the
  transaction meanwhile; the trainer may step again as soon as it returns.
- ``write_policy(handle, copy)``: ``dcp.save`` of that copy through a ``BundleStorageWriter`` joined to the
  transaction as participant ``rank<r>``; returns its ``Receipt`` (rank 0's includes
  ``policy/.metadata``). It runs in the actor's ``save`` concurrency group, so training calls are
  served meanwhile. ``discard_policy()`` drops a copy whose save failed before writing it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from rlckpt.checkpoint import codec, layout
from rlckpt.checkpoint.rank_save import StagedShards, stage_shards
from rlckpt.checkpoint.restore import PolicyLocation
from rlckpt.checkpoint.run_format import POLICY_WHOLE
from rlckpt.errors import ShardWriteError, TrainerGroupError
from rlckpt.grpo import GRPOConfig, TrainBatch, Trainer
from rlckpt.store import BundleStore, Receipt, TransactionHandle

logger = logging.getLogger(__name__)

# How long a gloo collective waits for a peer. A rank that dies surfaces on the others at once (its
# sockets close); this bounds only a rank that hangs.
GROUP_TIMEOUT_S = 60.0
# The DCP save planner of one rank's save at one step (None: DCP's default). Tests inject faults here.
SavePlannerFactory = Callable[[int, int], Any]


@dataclass
class _RankSave:
    """This rank's staged policy: a host-memory copy of its shards, not yet written."""

    copy: str
    staged: StagedShards


class TrainerRank:
    """One trainer rank: the Trainer (sharded once the group is joined) and its save in flight."""

    def __init__(
        self,
        config: GRPOConfig,
        rank: int,
        world_size: int,
        save_planner: SavePlannerFactory | None = None,
        compression: str | None = None,
        reuse: bool = False,
    ) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.save_planner = save_planner
        self.compression = compression  # BundleStorageWriter's: how the policy's shard files are stored
        self.reuse = reuse  # and whether they are laid out for reuse of unchanged ones
        self._trainer: Trainer | None = None
        self._checkpoint_group: Any = None  # a second gloo group: DCP's collectives only
        self._save: _RankSave | None = None

    # --- forming the group ---------------------------------------------------------------------

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: this node's address and a free port for the group's TCP store."""
        import ray

        address = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((address, 0))
            port = int(sock.getsockname()[1])
        return address, port

    def join_group(self, address: str, port: int, timeout_s: float = GROUP_TIMEOUT_S) -> None:
        """Join the gloo group at ``address:port`` (all ranks at once) and shard the policy over it."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from rlckpt.grpo.sharding import DataParallel

        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{address}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )
        mesh = init_device_mesh("cpu", (self.world_size,))
        self._checkpoint_group = dist.new_group(backend="gloo", timeout=timeout)
        self._trainer = Trainer(self.config, DataParallel(self.rank, self.world_size, mesh))
        logger.info("trainer rank %d of %d joined the group at %s:%d", self.rank, self.world_size, address, port)

    def start_alone(self) -> None:
        """World size 1 without a process group (the in-process test harness): a plain module."""
        if self.world_size != 1:
            raise TrainerGroupError(f"rank {self.rank} of {self.world_size} cannot start without a group")
        self._trainer = Trainer(self.config)

    def leave_group(self) -> None:
        """Destroy the process groups (best effort: the actor is about to be killed anyway)."""
        import torch.distributed as dist

        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()

    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise TrainerGroupError(f"trainer rank {self.rank}: used before it joined its group")
        return self._trainer

    # --- training (collectives: every rank, in the same order) ---------------------------------

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return self.trainer.train_step(batch)

    def weights(self) -> tuple[dict[str, Any], int] | None:
        """The full weights and their version on rank 0 (the one the generator gets); None elsewhere."""
        weights = self.trainer.weights()  # an all-gather: every rank takes part
        return (weights, self.trainer.weight_version) if self.rank == 0 else None

    def policy_sha256(self) -> str:
        return self.trainer.policy_sha256()

    def weight_version(self) -> int:
        return self.trainer.weight_version

    # --- saving ----------------------------------------------------------------------------------

    def stage_policy(self, copy: str) -> None:
        """Copy this rank's model + AdamW shards to host memory (DCP's staging, what ``async_save`` does
        first); returns once the copy is made, so the trainer may step again while it is written."""
        self.discard_policy()
        try:
            staged = stage_shards(self.trainer.checkpoint_state())
        except Exception as exc:
            raise TrainerGroupError(f"trainer rank {self.rank}: staging policy copy {copy} failed: {exc}") from exc
        self._save = _RankSave(copy, staged)

    def write_policy(self, handle: TransactionHandle, copy: str) -> Receipt:
        """Write the staged copy into the transaction with ``dcp.save`` through a ``BundleStorageWriter``
        joined as participant ``rank<r>``; its receipt. On any failure this rank's files are dropped."""
        save, self._save = self._save, None
        if save is None or save.copy != copy:
            raise TrainerGroupError(
                f"trainer rank {self.rank}: step {handle.step}: policy copy {copy} is not the one staged here "
                f"({save.copy if save else 'none'})"
            )
        planner = None if self.save_planner is None else functools.partial(self.save_planner, self.rank, handle.step)
        try:
            return save.staged.write(
                handle,
                participant=f"rank{self.rank}",
                prefix=layout.POLICY_DIR,
                process_group=self._checkpoint_group,
                planner=planner,
                compression=self.compression,
                reuse=self.reuse,
            )
        except ShardWriteError as exc:
            raise TrainerGroupError(
                f"trainer rank {self.rank}: writing the policy of step {handle.step} failed: {exc.failures}"
            ) from None

    def discard_policy(self, copy: str | None = None) -> None:
        """Drop the staged copy (``copy``, or whichever is held) that will not be written."""
        if self._save is not None and copy in (None, self._save.copy):
            logger.warning("trainer rank %d: dropping unwritten policy copy %s", self.rank, self._save.copy)
            self._save = None

    # --- restoring -------------------------------------------------------------------------------

    def load_policy(self, location: PolicyLocation) -> int:
        """Load this rank's shards of a committed bundle's policy: a DCP checkpoint (DCP reshards from any
        world size), or a whole policy in one file (run formats 1-2), which every rank reads whole and
        keeps its shard of. Returns the loaded weight version. With the location's verify key the rank opens
        only a bundle that key signed for the run, as the driver did (the bundle is read again here)."""
        store = BundleStore(
            location.url, location.storage_options, verify_key=location.verify_key, run_id=location.run_id
        )
        origin = f"step {location.step} at {location.url} ({location.prefix})"
        try:
            if location.form == POLICY_WHOLE:
                self._load_whole_policy(store, location, origin)
            else:
                self._load_dcp_policy(store, location, origin)
        except Exception as exc:
            raise TrainerGroupError(f"trainer rank {self.rank}: loading the policy of {origin} failed: {exc}") from exc
        return self.trainer.weight_version

    def _load_dcp_policy(self, store: BundleStore, location: PolicyLocation, origin: str) -> None:
        from rlckpt.dcp import BundleStorageReader

        reader = BundleStorageReader(store, step=location.step, prefix=location.prefix)
        self.trainer.load_checkpoint(reader, process_group=self._checkpoint_group, origin=origin)

    def _load_whole_policy(self, store: BundleStore, location: PolicyLocation, origin: str) -> None:
        """The file's bytes, digest-checked by the store, then loaded by ``codec.loads`` (no code from a bundle)."""
        data = store.open(location.step).read_bytes(location.prefix)
        self.trainer.load_state_dict(codec.loads(data, origin=origin), origin=origin)
