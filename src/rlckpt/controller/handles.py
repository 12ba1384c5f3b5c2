"""Async handles the controller loop calls: on Ray workers (the main job) or in-process (unit tests).

The loop only awaits these methods, so its one event loop never blocks on training or
generation, and tests can drive the same loop without Ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlckpt.checkpoint.save import StagedBytes, StagedPolicy
from rlckpt.grpo import GenerationWorker, Prompt, TrainBatch
from rlckpt.store import BundleTransaction


class Trainer(Protocol):
    async def train_step(self, batch: TrainBatch) -> dict[str, float]: ...
    async def weights(self) -> tuple[dict[str, torch.Tensor], int]: ...
    async def policy_sha256(self) -> str: ...
    async def stage_policy(self, txn: BundleTransaction) -> StagedPolicy: ...


class Generator(Protocol):
    async def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None: ...
    async def generate(self, prompts: Sequence[Prompt]) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class TrainerHandle:
    """The trainer worker's Ray actor handle (picklable: it travels to the controller actor)."""

    worker: Any  # ray.actor.ActorHandle of controller.trainer_worker.TrainerWorker

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return await self.worker.train_step.remote(batch)

    async def weights(self) -> tuple[dict[str, torch.Tensor], int]:
        return await self.worker.weights.remote()

    async def policy_sha256(self) -> str:
        return await self.worker.policy_sha256.remote()

    async def stage_policy(self, txn: BundleTransaction) -> StagedBytes:
        """The worker's weights + optimizer as bytes, held here until the save writes them."""
        return StagedBytes(txn, await self.worker.state_bytes.remote())


@dataclass(frozen=True)
class GeneratorHandle:
    """A generation worker's Ray actor handle."""

    worker: Any  # ray.actor.ActorHandle of grpo.GenerationWorker

    async def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        await self.worker.set_weights.remote(weights, version)

    async def generate(self, prompts: Sequence[Prompt]) -> list[dict[str, Any]]:
        return await self.worker.generate.remote(list(prompts))


class LocalTrainer:
    """In-process trainer for tests: a ``TrainerWorker`` run in a thread."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return await asyncio.to_thread(self.worker.train_step, batch)

    async def weights(self) -> tuple[dict[str, torch.Tensor], int]:
        return self.worker.weights()

    async def policy_sha256(self) -> str:
        return self.worker.policy_sha256()

    async def stage_policy(self, txn: BundleTransaction) -> StagedBytes:
        return StagedBytes(txn, self.worker.state_bytes())


class LocalGenerator:
    """In-process generator for tests: a ``GenerationWorker`` run in a thread."""

    def __init__(self, worker: GenerationWorker) -> None:
        self.worker = worker
        self._lock = asyncio.Lock()  # like a Ray actor: one call at a time, weights never swapped mid-sample

    async def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        async with self._lock:
            self.worker.set_weights(weights, version)

    async def generate(self, prompts: Sequence[Prompt]) -> list[dict[str, Any]]:
        async with self._lock:
            return await asyncio.to_thread(self.worker.generate, list(prompts))
