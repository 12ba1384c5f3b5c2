"""Train batches for trainer tests: generated once with a fresh trainer's initial weights, so every
call (in any process) yields the same batches and ranks can be compared bit for bit."""

from __future__ import annotations

from rlckpt.grpo import DigitSumTask, GenerationWorker, GRPOConfig, PromptLoader, TrainBatch, Trainer
from rlckpt.grpo.advantages import with_group_advantages


def initial_weight_batches(config: GRPOConfig, task: DigitSumTask, n: int) -> list[TrainBatch]:
    """``n`` batches of the task's prompts, in loader order (seed 0), generated with initial weights."""
    trainer, worker = Trainer(config), GenerationWorker(config, task)
    worker.set_weights(trainer.weights(), 0)
    loader = PromptLoader(task, config.prompts_per_step, seed=0)
    return [TrainBatch.from_rows(with_group_advantages(worker.generate(loader.next_batch()))) for _ in range(n)]
