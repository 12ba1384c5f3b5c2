"""The FSDP2 trainer on real gloo ranks (spawned processes): bit-identical steps at a fixed world size,
the same update as one unsharded process up to float order, and a checkpoint of 2 ranks that loads at
world size 1 and at world size 4 as the same full state, bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch

from rlckpt.dcp import BundleStorageReader
from rlckpt.grpo import Trainer
from support.batches import initial_weight_batches
from support.dcp_ranks import bitwise_equal, flat_tensors, full_state, run_ranks
from support.trainer_ranks import (
    CONFIG,
    SAVED_STEP,
    TASK,
    load_then_train,
    train_then_save,
    twin_trainers_then_save,
)


def test_sharded_steps_are_bit_identical_and_a_two_rank_checkpoint_loads_whole_at_world_size_1(tmp_path):
    run = str(tmp_path / "run")
    Path(run).mkdir()
    run_ranks(twin_trainers_then_save, 2, run, timeout=180)
    saved = torch.load(Path(run) / "rank0.pt", weights_only=True)
    assert saved["shas"][0] == saved["shas"][1]

    unsharded = Trainer(CONFIG)  # the whole batch in one process: the same update up to float order
    for batch in initial_weight_batches(CONFIG, TASK, SAVED_STEP):
        unsharded.train_step(batch)
    for name, tensor in unsharded.weights().items():
        torch.testing.assert_close(tensor, saved["full"][f"model.{name}"], rtol=1e-4, atol=1e-6)

    alone = Trainer(CONFIG)
    alone.load_checkpoint(BundleStorageReader(run, step=SAVED_STEP))
    assert alone.weight_version == SAVED_STEP
    assert alone.policy_sha256() == saved["shas"][0]
    assert bitwise_equal(flat_tensors(full_state(alone.model, alone.optimizer)), saved["full"]) == []
    alone.train_step(initial_weight_batches(CONFIG, TASK, SAVED_STEP + 1)[SAVED_STEP])  # and it trains on
    assert alone.weight_version == SAVED_STEP + 1


def test_a_two_rank_checkpoint_loads_at_world_size_4_as_the_same_full_state(tmp_path):
    run = str(tmp_path / "run")
    Path(run).mkdir()
    run_ranks(train_then_save, 2, run, timeout=180)
    run_ranks(load_then_train, 4, run, timeout=180)
    saved = torch.load(Path(run) / "saved.pt", weights_only=True)
    loaded = torch.load(Path(run) / "loaded.pt", weights_only=True)
    assert loaded["sha"] == saved["sha"]
    assert bitwise_equal(loaded["full"], saved["full"]) == []
    assert loaded["version"] == SAVED_STEP + 1  # it trained on at the new world size
