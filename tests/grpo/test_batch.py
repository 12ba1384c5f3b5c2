"""TrainBatch: rows plus advantages stacked in a fixed order, malformed rows refused."""

import random

import pytest
import torch

from rlckpt.errors import InvalidBatchError
from rlckpt.grpo.advantages import with_group_advantages
from rlckpt.grpo.batch import TrainBatch
from rlckpt.grpo.generation import GenerationWorker
from rlckpt.grpo.task import DigitSumTask
from rlckpt.grpo.trainer import GRPOConfig, Trainer

TASK = DigitSumTask(seed=0)


@pytest.fixture(scope="module")
def rows():
    config = GRPOConfig(group_size=4)
    worker = GenerationWorker(config, TASK)
    worker.set_weights(Trainer(config).weights(), 0)
    return with_group_advantages(worker.generate(TASK.prompts[:3]))


def test_rows_stack_into_typed_tensors(rows):
    batch = TrainBatch.from_rows(rows)
    assert len(batch) == 12
    assert batch.prompts.shape == (12, 2) and batch.completions.shape == (12, 4)
    assert batch.rewards.dtype == batch.advantages.dtype == torch.float32


def test_row_order_does_not_change_the_batch(rows):
    shuffled = list(rows)
    random.Random(0).shuffle(shuffled)
    a, b = TrainBatch.from_rows(rows), TrainBatch.from_rows(shuffled)
    for name in ("prompts", "completions", "old_logprobs", "rewards", "advantages"):
        assert torch.equal(getattr(a, name), getattr(b, name))


def test_row_without_advantages_is_refused(rows):
    bad = [dict(r) for r in rows]
    del bad[2]["advantages"]
    with pytest.raises(InvalidBatchError, match="row 2 lacks.*advantages"):
        TrainBatch.from_rows(bad)


def test_ragged_completions_are_refused(rows):
    bad = [dict(r) for r in rows]
    bad[0]["completion"] = torch.tensor([1, 2], dtype=torch.int64)
    with pytest.raises(InvalidBatchError, match="do not stack"):
        TrainBatch.from_rows(bad)


def test_wrong_dtype_is_refused(rows):
    batch = TrainBatch.from_rows(rows)
    with pytest.raises(InvalidBatchError, match="old_logprobs"):
        TrainBatch(batch.prompts, batch.completions, batch.old_logprobs.double(), batch.rewards, batch.advantages)


def test_empty_rows_are_refused():
    with pytest.raises(InvalidBatchError, match="no rows"):
        TrainBatch.from_rows([])
