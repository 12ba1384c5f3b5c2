"""An in-process GRPO loop (no Ray, no data plane): the baseline the controller must match.

Step k: sample a prompt batch, generate groups with weights of version k, add group advantages,
train, sync the new weights to the worker. The controller's ``in_order`` rollout order does the same
through TransferQueue, so a run of this loop is the ground truth for its results.
"""

from __future__ import annotations

from rlckpt.grpo.advantages import with_group_advantages
from rlckpt.grpo.batch import TrainBatch
from rlckpt.grpo.dataloader import PromptLoader
from rlckpt.grpo.generation import GenerationWorker
from rlckpt.grpo.trainer import Trainer


def run_steps(trainer: Trainer, worker: GenerationWorker, loader: PromptLoader, steps: int) -> list[dict[str, float]]:
    """Run ``steps`` GRPO steps; returns each step's trainer metrics."""
    history: list[dict[str, float]] = []
    for _ in range(steps):
        if worker.weight_version != trainer.weight_version:
            worker.set_weights(trainer.weights(), trainer.weight_version)
        rows = worker.generate(loader.next_batch(), trainer.config.group_size)
        history.append(trainer.train_step(TrainBatch.from_rows(with_group_advantages(rows))))
        worker.set_weights(trainer.weights(), trainer.weight_version)
    return history
