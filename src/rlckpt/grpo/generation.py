"""The generation worker: samples rollout rows from its own copy of the policy weights.

A plain class: the controller wraps it with ``ray.remote`` (or calls ``make_generation_actor``,
which imports Ray lazily), so importing this module never needs Ray.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rlckpt.errors import WeightsNotSetError
from rlckpt.grpo.determinism import torch_threads
from rlckpt.grpo.policy import build_policy, sample_group
from rlckpt.grpo.task import DigitSumTask, Prompt
from rlckpt.grpo.trainer import GRPOConfig


class GenerationWorker:
    """Holds a policy copy at some ``weight_version`` and turns prompts into graded rollout rows."""

    def __init__(self, config: GRPOConfig, task: DigitSumTask) -> None:
        self.config = config
        self.task = task
        self.model = build_policy(config.policy, config.seed)
        self.model.eval()
        self.weight_version: int | None = None

    def set_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Replace the policy weights; later samples are seeded with ``version``."""
        self.model.load_state_dict(dict(weights), strict=True)
        self.weight_version = int(version)

    def generate(self, prompts: Sequence[Prompt], group_size: int | None = None) -> list[dict[str, Any]]:
        """One row per (prompt, sample index), prompts in the given order, samples 0..G-1.

        Row fields: ``prompt`` int64 [P], ``completion`` int64 [L], ``logprobs`` float32 [L],
        ``reward`` float32 [1], and plain ints ``prompt_id``, ``sample_index``, ``weight_version``.
        """
        if self.weight_version is None:
            raise WeightsNotSetError("GenerationWorker.generate called before set_weights")
        size = self.config.group_size if group_size is None else group_size
        rows: list[dict[str, Any]] = []
        with torch_threads(self.config.num_threads):
            for prompt in prompts:
                completions, logprobs = sample_group(
                    self.model, prompt, size, seed=self.config.seed, weight_version=self.weight_version
                )
                prompt_tokens = torch.tensor(prompt.tokens, dtype=torch.int64)
                for index in range(size):
                    reward = self.task.reward(prompt, completions[index].tolist())
                    rows.append(
                        {
                            "prompt": prompt_tokens.clone(),
                            "completion": completions[index].clone(),
                            "logprobs": logprobs[index].clone(),
                            "reward": torch.tensor([reward], dtype=torch.float32),
                            "prompt_id": prompt.prompt_id,
                            "sample_index": index,
                            "weight_version": self.weight_version,
                        }
                    )
        return rows


def make_generation_actor(config: GRPOConfig, task: DigitSumTask, num_cpus: float = 1, **options: Any) -> Any:
    """Start a ``GenerationWorker`` as a Ray actor (imports Ray only here)."""
    import ray

    return ray.remote(GenerationWorker).options(num_cpus=num_cpus, **options).remote(config, task)
