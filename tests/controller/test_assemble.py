"""The restored index is checked where the controller is assembled, for the actor and the harness alike.

A bundle whose index is consistent with itself can still disagree with the data-plane snapshot it
was restored with; each such disagreement must stop the controller before its pumps start.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.controller.actor import SingleControllerActor
from rlckpt.controller.args import ControllerArgs, RestoredIndex
from rlckpt.controller.assemble import assemble_controller
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.connect import ReplayBufferSpec, replay_buffer_spec
from rlckpt.controller.handles import LocalGenerator
from rlckpt.controller.loop_state import LoopState
from rlckpt.controller.ranks.trainer_group import LocalTrainerGroup
from rlckpt.dataplane.memory import InMemoryDataPlane, InMemoryStore
from rlckpt.errors import InventoryMismatchError, ReplayStateError
from rlckpt.grpo import DigitSumTask, GenerationWorker, GRPOConfig, PromptLoader
from rlckpt.store import BundleStore
from support.controller import InMemoryDataPlaneSpec, run_in_process

SMALL = GRPOConfig(group_size=4, prompts_per_step=4)


def _config(run_dir: str, steps: int) -> TrainConfig:
    return TrainConfig(run_dir=run_dir, steps=steps, save_every=2, grpo=SMALL)


def _copy_with_snapshot_group_count(source: BundleStore, target: BundleStore, step: int, delta: int) -> None:
    """A buggy writer: bundle ``step`` of ``source`` again into ``target``, its snapshot claiming
    ``delta`` more groups than its index holds (every digest is valid)."""
    bundle = source.open(step)
    with target.begin(step) as txn:
        for rel in bundle.manifest.files:
            data = bundle.read_bytes(rel)
            if rel == layout.DATA_PLANE_METADATA:
                document = json.loads(data)
                document["user_metadata"][layout.META_GROUP_COUNT] += delta
                data = json.dumps(document).encode()
            txn.write_bytes(rel, data)
        txn.commit(dict(bundle.manifest.metadata))


def test_the_harness_refuses_an_index_whose_group_count_differs_from_the_snapshot(tmp_path):
    source, target = str(tmp_path / "source"), str(tmp_path / "target")
    asyncio.run(run_in_process(_config(source, 2)))
    _copy_with_snapshot_group_count(BundleStore(source), BundleStore(target), 2, delta=1)
    with pytest.raises(ReplayStateError, match="the data-plane snapshot says"):
        asyncio.run(run_in_process(_config(target, 4)))


# --- the controller actor's checks of the restored index -------------------------------------------


def _replay_spec(partition: str = "rollouts") -> ReplayBufferSpec:
    phase = RestorePhase()
    phase.start_fresh()
    return replay_buffer_spec(phase, partition_id=partition, group_size=SMALL.group_size)


def _saved_index(plane: InMemoryStore) -> dict:
    """Two committed groups and one reserved group in ``plane``, and the index that describes them."""

    async def main():
        replay = _replay_spec().build(InMemoryDataPlane(plane))
        for seed in range(2):
            gid = replay.reserve(weight_version=2, target_step=2)
            rows = [{"reward": torch.tensor([float(seed)])} for _ in range(SMALL.group_size)]
            await replay.commit(gid, rows, start_weight=2, end_weight=2)
        replay.reserve(weight_version=2, target_step=3)
        return replay.metadata_state_dict()

    return asyncio.run(main())


def _args(tmp_path, state: dict, *, partition: str = "rollouts", **restored) -> ControllerArgs:
    config = TrainConfig(run_dir=str(tmp_path / "run"), steps=4, grpo=SMALL, partition_id=partition)
    task = DigitSumTask(seed=0, num_prompts=16)
    index = {"step": 2, "index_digest": state["digest"], "group_count": len(state["groups"]), **restored}
    return ControllerArgs(
        config=config,
        task=task,
        loader=PromptLoader(task, SMALL.prompts_per_step),
        loop_state=LoopState(step=2, next_batch_step=3),
        trainer=LocalTrainerGroup(SMALL),
        generator=LocalGenerator(GenerationWorker(SMALL, task)),
        replay=_replay_spec(partition),
        restored=RestoredIndex(replay_state=state, **index),
    )


def _run_actor(args: ControllerArgs, plane: InMemoryStore):
    return asyncio.run(SingleControllerActor(args, InMemoryDataPlaneSpec(plane)).run())


def test_a_matching_restored_index_is_loaded_without_writing_to_the_data_plane(tmp_path):
    plane = InMemoryStore()
    state = _saved_index(plane)
    data_plane = InMemoryDataPlane(plane)
    args = _args(tmp_path, state)
    loop = asyncio.run(assemble_controller(args, store=BundleStore(args.config.run_dir), data_plane=data_plane))
    assert loop.replay.metadata_state_dict() == state
    assert loop.resumed_from == 2
    assert not data_plane.touched


def test_the_actor_refuses_an_index_whose_digest_differs_from_the_snapshots(tmp_path):
    plane = InMemoryStore()
    args = _args(tmp_path, _saved_index(plane), index_digest="0" * 64)
    with pytest.raises(ReplayStateError, match="expected digest"):
        _run_actor(args, plane)


def test_the_actor_refuses_an_index_saved_for_another_partition(tmp_path):
    plane = InMemoryStore()
    args = _args(tmp_path, _saved_index(plane), partition="elsewhere")
    with pytest.raises(ReplayStateError, match="partition"):
        _run_actor(args, plane)


def test_the_actor_refuses_an_index_whose_group_count_differs_from_the_snapshots(tmp_path):
    plane = InMemoryStore()
    state = _saved_index(plane)
    args = _args(tmp_path, state, group_count=len(state["groups"]) - 1)
    with pytest.raises(ReplayStateError, match="the data-plane snapshot says 2"):
        _run_actor(args, plane)


def test_the_actor_refuses_an_index_naming_rows_the_data_plane_lacks(tmp_path):
    plane = InMemoryStore()
    state = _saved_index(plane)
    lost = state["groups"][0]["sample_ids"][1]
    asyncio.run(InMemoryDataPlane(plane).clear_samples("rollouts", [lost]))
    with pytest.raises(InventoryMismatchError, match=lost):
        _run_actor(_args(tmp_path, state), plane)
