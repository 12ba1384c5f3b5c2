"""A tiny real GRPO on CPU: digit-sum task, GRU policy, group advantages, clipped PG with AdamW.

Imports torch but never Ray; ``make_generation_actor`` imports Ray lazily.
"""

from rlckpt.grpo.advantages import group_advantages, grouped_advantages, with_group_advantages
from rlckpt.grpo.batch import TrainBatch
from rlckpt.grpo.dataloader import PromptLoader
from rlckpt.grpo.generation import GenerationWorker, make_generation_actor
from rlckpt.grpo.loop import run_steps
from rlckpt.grpo.policy import (
    DigitPolicy,
    PolicyConfig,
    build_policy,
    num_parameters,
    sample_group,
    sample_seed,
)
from rlckpt.grpo.task import DigitSumTask, Prompt
from rlckpt.grpo.trainer import GRPOConfig, Trainer, weights_sha256

__all__ = [
    "DigitPolicy",
    "DigitSumTask",
    "GRPOConfig",
    "GenerationWorker",
    "PolicyConfig",
    "Prompt",
    "PromptLoader",
    "TrainBatch",
    "Trainer",
    "build_policy",
    "group_advantages",
    "grouped_advantages",
    "make_generation_actor",
    "num_parameters",
    "run_steps",
    "sample_group",
    "sample_seed",
    "weights_sha256",
    "with_group_advantages",
]
