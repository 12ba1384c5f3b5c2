"""The trainer side (the reference's ``TQPolicy``): its Ray worker and the bootstrap data-plane client.

``TQPolicy`` lives on the driver: it starts TransferQueue (bootstrap client, which owns it) and
the trainer worker. The controller actor only gets a ``TrainerHandle`` (see handles.py).
"""

from __future__ import annotations

import io
import logging
from typing import Any

import torch

from rlckpt.controller.handles import TrainerHandle
from rlckpt.dataplane.tq_client import TransferQueueClient
from rlckpt.grpo import GRPOConfig, TrainBatch, Trainer

logger = logging.getLogger(__name__)


class TrainerWorker:
    """Ray actor body holding the GRPO ``Trainer`` (weights + AdamW)."""

    def __init__(self, config: GRPOConfig) -> None:
        self.trainer = Trainer(config)

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return self.trainer.train_step(batch)

    def weights(self) -> tuple[dict[str, torch.Tensor], int]:
        return self.trainer.weights(), self.trainer.weight_version

    def policy_sha256(self) -> str:
        return self.trainer.policy_sha256()

    def state_bytes(self) -> bytes:
        buffer = io.BytesIO()
        self.trainer.save_state(buffer)
        return buffer.getvalue()

    def load_state_bytes(self, data: bytes) -> None:
        self.trainer.load_state(io.BytesIO(data))  # torch.load(weights_only=True) inside


class TQPolicy:
    """Driver-side trainer: builds the worker and the bootstrap client (which starts TransferQueue)."""

    def __init__(self, config: GRPOConfig, tq_config: dict[str, Any]) -> None:
        import ray

        self.worker = ray.remote(TrainerWorker).options(num_cpus=0, name=None).remote(config)
        self.data_plane = TransferQueueClient(tq_config, bootstrap=True)
        logger.info("trainer worker and TransferQueue (bootstrap client) started")

    def load_state_bytes(self, data: bytes) -> None:
        """Load verified weights + optimizer bytes into the worker (blocking; driver only)."""
        import ray

        ray.get(self.worker.load_state_bytes.remote(data))

    def handle(self) -> TrainerHandle:
        return TrainerHandle(self.worker)
