"""Deterministic shuffled prompt batches over epochs, with an exactly resumable position."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from rlckpt.errors import LoaderStateError
from rlckpt.formats import Field, Int, Record
from rlckpt.grpo.task import DigitSumTask, Prompt

# A PromptLoader's position: no number of its own, it is versioned by the record that holds it (the loader
# state of train_dataloader.pt, controller/loop_state.py).
PROMPT_LOADER = Record(
    "dataloader position",
    None,
    (
        Field("epoch", Int(minimum=0), "epochs completed"),
        Field("position", Int(minimum=0), "how many prompts of this epoch's permutation were drawn"),
        Field("seed", Int(), "the seed of every epoch's permutation"),
        Field("batch_size", Int(minimum=1), "prompts per batch"),
        Field("num_prompts", Int(minimum=1), "the task's prompt count"),
    ),
    LoaderStateError,
    version_key=None,
    writer="`rlckpt.grpo.PromptLoader.state_dict`",
)


class PromptLoader:
    """Endless batches of prompts: each epoch is a seeded permutation of the task's prompts.

    ``batch_size`` must divide the number of prompts: batches are then full, never straddle an
    epoch, and never hold a prompt twice (two groups of one prompt at one weight version would
    sample identical completions). The position is (epoch, index in that epoch's permutation);
    saving and loading it continues the stream exactly.
    """

    def __init__(self, task: DigitSumTask, batch_size: int, seed: int = 0) -> None:
        if batch_size < 1 or task.num_prompts % batch_size:
            raise ValueError(
                f"PromptLoader batch_size must be >= 1 and divide the {task.num_prompts} prompts, got {batch_size}"
            )
        self.task = task
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order: list[int] = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.task.num_prompts))
        random.Random(f"prompt-loader:{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list[Prompt]:
        """The next ``batch_size`` prompts, advancing the position."""
        batch: list[Prompt] = []
        while len(batch) < self.batch_size:
            if self.position == len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            batch.append(self.task.prompt(self._order[self.position]))
            self.position += 1
        return batch

    def __iter__(self) -> Iterator[list[Prompt]]:
        return self

    def __next__(self) -> list[Prompt]:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Plain ints only, so it round-trips through ``torch.load(weights_only=True)`` or JSON."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "num_prompts": self.task.num_prompts,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position.

        Raises:
            LoaderStateError: a field missing, of another type or unknown (named), or a state from a
                different seed, batch size or task.
        """
        PROMPT_LOADER.check(state)
        expected = {"seed": self.seed, "batch_size": self.batch_size, "num_prompts": self.task.num_prompts}
        found = {key: state.get(key) for key in expected}
        if found != expected:
            raise LoaderStateError(f"dataloader state was saved for {found}, this loader is {expected}")
        epoch, position = state["epoch"], state["position"]
        if position > self.task.num_prompts:
            raise LoaderStateError(f"dataloader state has invalid epoch={epoch} position={position}")
        self.epoch, self.position = epoch, position
        self._order = self._permutation(epoch)
