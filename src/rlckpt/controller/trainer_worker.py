"""TrainerWorker: the body of the trainer's Ray actor (or, in tests, an in-process object).

It holds the GRPO ``Trainer`` (weights + AdamW) and speaks in bytes and plain tensors, so the
controller can call it over Ray (``TrainerHandle``) or in a thread (``LocalTrainer``).
"""

from __future__ import annotations

import io

import torch

from rlckpt.grpo import GRPOConfig, TrainBatch, Trainer


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
