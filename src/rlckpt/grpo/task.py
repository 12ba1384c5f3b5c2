"""A verifiable toy task: emit L digits whose sum hits a target given in the prompt.

Token ids: 0..9 are the digits (and also the policy's action ids), ``BOS`` is 10, and the
target sum S is the single token ``TARGET_OFFSET + S``. A prompt is ``[BOS, TARGET_OFFSET + S]``.
The reward is partial credit ``max(0, 1 - |sum(digits) - S| / tolerance)``: 1.0 for an exact hit.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

NUM_DIGITS = 10
BOS = NUM_DIGITS
TARGET_OFFSET = NUM_DIGITS + 1


@dataclass(frozen=True)
class Prompt:
    """One prompt: a stable id, its token ids, and the digit sum it asks for."""

    prompt_id: int
    tokens: list[int]
    target: int


class DigitSumTask:
    """A deterministic, finite set of digit-sum prompts plus the reward that grades completions."""

    def __init__(
        self,
        seed: int = 0,
        num_prompts: int = 64,
        completion_length: int = 4,
        tolerance: float = 9.0,
    ) -> None:
        if num_prompts < 1 or completion_length < 1 or tolerance <= 0:
            raise ValueError(
                f"DigitSumTask needs num_prompts>=1, completion_length>=1, tolerance>0; got "
                f"{num_prompts}, {completion_length}, {tolerance}"
            )
        self.seed = seed
        self.num_prompts = num_prompts
        self.completion_length = completion_length
        self.tolerance = float(tolerance)
        self.max_target = (NUM_DIGITS - 1) * completion_length
        rng = random.Random(f"digit-sum-task:{seed}")
        self.prompts: list[Prompt] = [_make_prompt(i, rng.randint(0, self.max_target)) for i in range(num_prompts)]

    @property
    def vocab_size(self) -> int:
        """Number of token ids a prompt or completion can use."""
        return TARGET_OFFSET + self.max_target + 1

    @property
    def prompt_length(self) -> int:
        """Every prompt has the same length, so batches stack without padding."""
        return 2

    def prompt(self, prompt_id: int) -> Prompt:
        """The prompt with this id (ids are 0..num_prompts-1)."""
        return self.prompts[prompt_id]

    def reward(self, prompt: Prompt, completion_tokens: Sequence[int]) -> float:
        """Partial credit for how close the digit sum is to the target; 0.0 for a malformed completion."""
        tokens = [int(t) for t in completion_tokens]
        if len(tokens) != self.completion_length or any(not 0 <= t < NUM_DIGITS for t in tokens):
            return 0.0
        miss = abs(sum(tokens) - prompt.target)
        return max(0.0, 1.0 - miss / self.tolerance)

    def __repr__(self) -> str:
        return (
            f"DigitSumTask(seed={self.seed}, num_prompts={self.num_prompts}, "
            f"completion_length={self.completion_length}, tolerance={self.tolerance})"
        )


def _make_prompt(prompt_id: int, target: int) -> Prompt:
    return Prompt(prompt_id=prompt_id, tokens=[BOS, TARGET_OFFSET + target], target=target)
