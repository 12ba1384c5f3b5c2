"""The FSDP2 trainer on real gloo ranks (spawned processes): bit-identical steps at a fixed world size,
the same update as one unsharded process up to float order, and a checkpoint of 2 ranks that loads at
world size 1 as the same full state, bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch

from rlckpt.grpo import DigitSumTask, GRPOConfig, Trainer
from rlckpt.testing.batches import initial_weight_batches
from rlckpt.testing.dcp_ranks import bitwise_equal, flat_tensors, full_state, process_group, run_ranks

CONFIG = GRPOConfig(group_size=4, prompts_per_step=4)
TASK = DigitSumTask(seed=0)


def _two_ranks(rank: int, world_size: int, port: int, out: str) -> None:
    """Two sharded trainers on the same batches (must agree bit for bit); the first saves with DCP."""
    import torch.distributed.checkpoint as dcp

    from rlckpt.dcp import BundleStorageWriter
    from rlckpt.grpo.sharding import DataParallel

    with process_group(rank, world_size, port) as mesh:
        parallel = DataParallel(rank, world_size, mesh)
        first, second = Trainer(CONFIG, parallel), Trainer(CONFIG, parallel)
        for batch in initial_weight_batches(CONFIG, TASK, 2):
            first.train_step(batch)
            second.train_step(batch)
        shas = (first.policy_sha256(), second.policy_sha256())
        dcp.save(first.checkpoint_state(), storage_writer=BundleStorageWriter(out, step=2))
        full = flat_tensors(full_state(first.model, first.optimizer))
        if rank == 0:
            torch.save({"shas": shas, "full": full}, Path(out) / "rank0.pt")


def test_sharded_steps_are_bit_identical_and_a_two_rank_checkpoint_loads_whole_at_world_size_1(tmp_path):
    from rlckpt.dcp import BundleStorageReader

    run = str(tmp_path / "run")
    Path(run).mkdir()
    run_ranks(_two_ranks, 2, run, timeout=180)
    saved = torch.load(Path(run) / "rank0.pt", weights_only=True)
    assert saved["shas"][0] == saved["shas"][1]

    unsharded = Trainer(CONFIG)  # the whole batch in one process: the same update up to float order
    for batch in initial_weight_batches(CONFIG, TASK, 2):
        unsharded.train_step(batch)
    for name, tensor in unsharded.weights().items():
        torch.testing.assert_close(tensor, saved["full"][f"model.{name}"], rtol=1e-4, atol=1e-6)

    alone = Trainer(CONFIG)
    alone.load_checkpoint(BundleStorageReader(run, step=2))
    assert alone.weight_version == 2
    assert alone.policy_sha256() == saved["shas"][0]
    assert bitwise_equal(flat_tensors(full_state(alone.model, alone.optimizer)), saved["full"]) == []
    alone.train_step(initial_weight_batches(CONFIG, TASK, 3)[2])  # and it trains on
    assert alone.weight_version == 3


def _two_ranks_save(rank: int, world_size: int, port: int, out: str) -> None:
    import torch.distributed.checkpoint as dcp

    from rlckpt.dcp import BundleStorageWriter
    from rlckpt.grpo.sharding import DataParallel

    with process_group(rank, world_size, port) as mesh:
        trainer = Trainer(CONFIG, DataParallel(rank, world_size, mesh))
        for batch in initial_weight_batches(CONFIG, TASK, 2):
            trainer.train_step(batch)
        dcp.save(trainer.checkpoint_state(), storage_writer=BundleStorageWriter(out, step=2))
        full = flat_tensors(full_state(trainer.model, trainer.optimizer))
        sha = trainer.policy_sha256()  # a collective: every rank takes part
        if rank == 0:
            torch.save({"sha": sha, "full": full}, Path(out) / "saved.pt")


def _four_ranks_load(rank: int, world_size: int, port: int, out: str) -> None:
    from rlckpt.dcp import BundleStorageReader
    from rlckpt.grpo.sharding import DataParallel

    with process_group(rank, world_size, port) as mesh:
        trainer = Trainer(CONFIG, DataParallel(rank, world_size, mesh))
        trainer.load_checkpoint(BundleStorageReader(out, step=2))
        full = flat_tensors(full_state(trainer.model, trainer.optimizer))
        sha = trainer.policy_sha256()
        trainer.train_step(initial_weight_batches(CONFIG, TASK, 3)[2])  # and it trains on at the new world size
        if rank == 0:
            torch.save({"sha": sha, "full": full, "version": trainer.weight_version}, Path(out) / "loaded.pt")


def test_a_two_rank_checkpoint_loads_at_world_size_4_as_the_same_full_state(tmp_path):
    run = str(tmp_path / "run")
    Path(run).mkdir()
    run_ranks(_two_ranks_save, 2, run, timeout=180)
    run_ranks(_four_ranks_load, 4, run, timeout=180)
    saved = torch.load(Path(run) / "saved.pt", weights_only=True)
    loaded = torch.load(Path(run) / "loaded.pt", weights_only=True)
    assert loaded["sha"] == saved["sha"]
    assert bitwise_equal(loaded["full"], saved["full"]) == []
    assert loaded["version"] == 3
