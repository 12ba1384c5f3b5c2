"""Rank bodies of the sharded-trainer tests: FSDP2 GRPO trainers in a real gloo group that train, save
or load through rlckpt's DCP writer/reader and leave what they saw in `out` for the test to check.

They live in the package, not in a test module, because spawned ranks unpickle them by module name:
a test module is importable only where pytest put it on sys.path (and not in the children of a plain
`pytest` run, which uses importlib mode).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
from rlckpt.grpo import DigitSumTask, GRPOConfig, Trainer
from rlckpt.grpo.sharding import DataParallel
from support.batches import initial_weight_batches
from support.dcp_ranks import flat_tensors, full_state, process_group

CONFIG = GRPOConfig(group_size=4, prompts_per_step=4)
TASK = DigitSumTask(seed=0)
SAVED_STEP = 2


def twin_trainers_then_save(rank: int, world_size: int, port: int, out: str) -> None:
    """Two sharded trainers on the same batches (must agree bit for bit); the first saves step 2.
    Rank 0 writes both policy digests and the first one's full state to `out/rank0.pt`."""
    with process_group(rank, world_size, port) as mesh:
        parallel = DataParallel(rank, world_size, mesh)
        first, second = Trainer(CONFIG, parallel), Trainer(CONFIG, parallel)
        for batch in initial_weight_batches(CONFIG, TASK, SAVED_STEP):
            first.train_step(batch)
            second.train_step(batch)
        shas = (first.policy_sha256(), second.policy_sha256())
        dcp.save(first.checkpoint_state(), storage_writer=BundleStorageWriter(out, step=SAVED_STEP))
        full = flat_tensors(full_state(first.model, first.optimizer))
        if rank == 0:
            torch.save({"shas": shas, "full": full}, Path(out) / "rank0.pt")


def train_then_save(rank: int, world_size: int, port: int, out: str) -> None:
    """Train two steps and save step 2; rank 0 writes the policy digest and full state to `out/saved.pt`."""
    with process_group(rank, world_size, port) as mesh:
        trainer = Trainer(CONFIG, DataParallel(rank, world_size, mesh))
        for batch in initial_weight_batches(CONFIG, TASK, SAVED_STEP):
            trainer.train_step(batch)
        dcp.save(trainer.checkpoint_state(), storage_writer=BundleStorageWriter(out, step=SAVED_STEP))
        full = flat_tensors(full_state(trainer.model, trainer.optimizer))
        sha = trainer.policy_sha256()  # a collective: every rank takes part
        if rank == 0:
            torch.save({"sha": sha, "full": full}, Path(out) / "saved.pt")


def load_then_train(rank: int, world_size: int, port: int, out: str) -> None:
    """Load step 2 at this world size and train one step on; rank 0 writes the loaded digest, full
    state and the weight version after the step to `out/loaded.pt`."""
    with process_group(rank, world_size, port) as mesh:
        trainer = Trainer(CONFIG, DataParallel(rank, world_size, mesh))
        trainer.load_checkpoint(BundleStorageReader(out, step=SAVED_STEP))
        full = flat_tensors(full_state(trainer.model, trainer.optimizer))
        sha = trainer.policy_sha256()
        trainer.train_step(initial_weight_batches(CONFIG, TASK, SAVED_STEP + 1)[SAVED_STEP])
        if rank == 0:
            torch.save({"sha": sha, "full": full, "version": trainer.weight_version}, Path(out) / "loaded.pt")
