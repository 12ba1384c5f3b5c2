"""Async handles the controller loop calls: on Ray workers (the main job) or in-process (unit tests).

The loop only awaits these methods, so its one event loop never blocks on training or
generation, and tests can drive the same loop without Ray. The trainer is a group of ranks
(``trainer_group.TrainerGroupHandle`` on Ray, ``trainer_group.LocalTrainerGroup`` in-process).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlckpt.checkpoint.save import StagedPolicy
from rlckpt.grpo import GenerationWorker, Prompt, TrainBatch


class Trainer(Protocol):
    """The trainer group: data-parallel steps, rank 0's full weights, and the policy side of a save."""

    async def train_step(self, batch: TrainBatch) -> dict[str, float]: ...
    async def weights(self) -> tuple[dict[str, torch.Tensor], int]: ...
    async def policy_sha256(self) -> str: ...
    async def stage_policy(self) -> StagedPolicy: ...
    @property
    def world_size(self) -> int: ...


class Generator(Protocol):
    async def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None: ...
    async def generate(self, prompts: Sequence[Prompt]) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class GeneratorHandle:
    """A generation worker's Ray actor handle."""

    worker: Any  # ray.actor.ActorHandle of grpo.GenerationWorker

    async def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        await self.worker.set_weights.remote(weights, version)

    async def generate(self, prompts: Sequence[Prompt]) -> list[dict[str, Any]]:
        return await self.worker.generate.remote(list(prompts))


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
