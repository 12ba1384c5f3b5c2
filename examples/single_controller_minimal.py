"""A NeMo-RL-style single controller checkpointed by rlckpt's save and restore procedures, in one process.

    python examples/single_controller_minimal.py --run-dir /tmp/sc-run

The controller owns a replay buffer (rlckpt's ReplayBuffer: an index of which rows form which prompt group, no
tensors) over a data plane (any DataPlaneClient: TransferQueue in production, the in-memory adapter here),
and a trainer. It implements the two protocols the procedures call:

- `PolicyStateSource` (save): `stage_policy()` copies the policy to host memory and returns a `StagedPolicy`
  whose `write(txn)` writes it into the bundle's transaction — here with DCP, joined as participant rank0
  (a real trainer group: one participant per rank, each writing its own shards);
- `TrainerStateSink` (restore): `load_policy(location)` loads the policy of a verified bundle.

`save_bundle` captures the replay index and the dataloader position in one barrier window
(DataPlaneCheckpointBarrier: every data-plane write of the replay buffer is a `mutation()`, the capture the
`checkpoint()`), snapshots the data plane, and commits policy, dataplane rows, index and position as one bundle.
`restore_run`, in a new "cluster" (an empty data plane), verifies every piece, loads the policy, puts the rows
back into the untouched data plane, and only then may the connect-only client and the replay buffer be
built (RestorePhase asserts the order). docs/trainer.md walks through it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.restore import PolicyLocation, restore_run
from rlckpt.checkpoint.save import SaveParticipants, save_bundle
from rlckpt.dataplane import InMemoryDataPlane, InMemoryStore
from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer
from rlckpt.store import BundleStore, BundleTransaction, Receipt

GROUP_SIZE, GROUPS_PER_STEP, PARTITION = 4, 2, "rollouts"


@dataclass
class StagedDCP:
    """The policy copied to host memory (DCP's stager), written into a transaction as participant rank0."""

    state: dict[str, Any]

    async def write(self, txn: BundleTransaction) -> list[Receipt]:
        writer = BundleStorageWriter(txn.handle(), participant="rank0", prefix=layout.POLICY_DIR)
        await asyncio.to_thread(dcp.save, self.state, storage_writer=writer)
        assert writer.receipt is not None
        return [writer.receipt]

    async def discard(self) -> None:
        self.state = {}


class Policy:
    """A linear 'policy' and its AdamW: the trainer side of save_bundle and restore_run."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = nn.Linear(8, 8)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)

    def train(self, rows: dict[str, torch.Tensor]) -> None:
        loss = (self.model(rows["features"]).sum(-1, keepdim=True) * rows["reward"]).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def state(self) -> dict[str, Any]:
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optimizer}

    async def stage_policy(self) -> StagedDCP:  # PolicyStateSource
        return StagedDCP(BlockingAsyncStager().stage(self.state()))

    async def load_policy(self, location: PolicyLocation) -> None:  # TrainerStateSink
        store = BundleStore(location.url, location.storage_options, verify_key=location.verify_key)
        state = self.state()
        reader = BundleStorageReader(store, step=location.step, prefix=location.prefix)
        await asyncio.to_thread(dcp.load, state, storage_reader=reader)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


@dataclass
class Controller:
    """The single controller: the replay buffer over the data plane, the trainer and the prompt position."""

    store: BundleStore
    replay: ReplayBuffer
    policy: Policy
    loader: dict[str, int] = field(default_factory=lambda: {"position": 0})

    async def generate(self, step: int) -> None:
        """Rollouts for `step`: each group reserved, then its rows committed (a barrier mutation)."""
        for _ in range(GROUPS_PER_STEP):
            gid = self.replay.reserve(weight_version=step, target_step=step)
            g = torch.Generator().manual_seed(self.loader["position"])
            rows = [{"features": torch.randn(8, generator=g), "reward": torch.rand(1, generator=g)} for _ in range(4)]
            self.loader["position"] += 1
            await self.replay.commit(gid, rows, start_weight=step, end_weight=step)

    async def train(self, step: int) -> None:
        groups = await self.replay.take(GROUPS_PER_STEP, target_step=step)
        self.policy.train(await self.replay.read_groups(groups))
        for group in groups:
            await self.replay.remove_group(group.group_id)

    async def save(self, step: int) -> None:
        parts = SaveParticipants(
            store=self.store,
            policy=self.policy,
            replay=self.replay,
            capture_loader_state=lambda: dict(self.loader),  # captured in the window, with the index
        )
        await save_bundle(parts, step, upload_timing="staged")


async def run(run_dir: str, storage_options: dict[str, Any] | None, steps: int) -> dict[str, Any]:
    """Train to `steps` saving every step (rollouts for the next step are in flight at each save), then
    restore the newest bundle in a fresh 'cluster' and compare."""
    store = BundleStore(run_dir, storage_options)
    plane = InMemoryStore()  # the data plane's rows ("TransferQueue")
    phase = RestorePhase()
    first = Policy(seed=0)
    assert await restore_run(store, trainer=first, bootstrap=InMemoryDataPlane(plane), phase=phase) is None
    phase.require_ready("the replay buffer")  # a fresh run: the data plane may be shared now
    controller = Controller(
        store,
        ReplayBuffer(
            InMemoryDataPlane(plane), DataPlaneCheckpointBarrier(), partition_id=PARTITION, group_size=GROUP_SIZE
        ),
        first,
    )
    await controller.generate(0)
    for step in range(steps):
        await controller.generate(step + 1)  # the rollouts run ahead of the trainer
        await controller.train(step)
        await controller.save(step + 1)

    # A new cluster: an empty data plane, a new phase, a new trainer; the bootstrap client restores.
    fresh_plane, fresh_phase, second = InMemoryStore(), RestorePhase(), Policy(seed=1)
    restored = await restore_run(store, trainer=second, bootstrap=InMemoryDataPlane(fresh_plane), phase=fresh_phase)
    assert restored is not None
    fresh_phase.require_ready("the replay buffer")  # RestoreOrderError before the restore finished
    replay = ReplayBuffer(
        InMemoryDataPlane(fresh_plane), DataPlaneCheckpointBarrier(), partition_id=PARTITION, group_size=GROUP_SIZE
    )
    replay.load_state_dict(restored.replay_state, expected_digest=restored.index_digest)
    replay.validate_inventory(await replay.data_plane.list_sample_ids(PARTITION))
    saved_rows = await controller.replay.read_groups(controller.replay.groups())
    restored_rows = await replay.read_groups(replay.groups())
    return {
        "bundles": store.steps(),
        "restored_step": restored.step,
        "restored_groups": len(replay.groups()),
        "loader": restored.loader_state,
        "rows_match": all(torch.equal(saved_rows[k], restored_rows[k]) for k in saved_rows),
        "policy_match": all(
            torch.equal(a, b) for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True)
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, metavar="URL", help="a local path or s3://bucket/prefix")
    parser.add_argument("--storage-options", type=json.loads, default=None, metavar="JSON")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    summary = asyncio.run(run(args.run_dir, args.storage_options, args.steps))
    print(json.dumps(summary, sort_keys=True))
    return 0 if summary["rows_match"] and summary["policy_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
