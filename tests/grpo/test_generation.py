"""GenerationWorker: graded rollout rows from a versioned copy of the weights."""

import pytest
import torch

from rlckpt.errors import WeightsNotSetError
from rlckpt.grpo.generation import GenerationWorker
from rlckpt.grpo.task import DigitSumTask
from rlckpt.grpo.trainer import GRPOConfig, Trainer

TASK = DigitSumTask(seed=0)
CONFIG = GRPOConfig(group_size=4)


def _worker(version: int = 0) -> GenerationWorker:
    worker = GenerationWorker(CONFIG, TASK)
    worker.set_weights(Trainer(CONFIG).weights(), version)
    return worker


def test_generate_before_weights_is_refused():
    with pytest.raises(WeightsNotSetError):
        GenerationWorker(CONFIG, TASK).generate(TASK.prompts[:1])


def test_rows_carry_the_data_plane_fields():
    rows = _worker(version=3).generate(TASK.prompts[:2])
    assert [(r["prompt_id"], r["sample_index"]) for r in rows] == [(p, i) for p in (0, 1) for i in range(4)]
    for row in rows:
        assert row["prompt"].dtype == torch.int64 and row["prompt"].shape == (2,)
        assert row["completion"].dtype == torch.int64 and row["completion"].shape == (4,)
        assert row["logprobs"].dtype == torch.float32 and row["logprobs"].shape == (4,)
        assert row["reward"].dtype == torch.float32 and row["reward"].shape == (1,)
        assert row["weight_version"] == 3


def test_rewards_are_the_task_reward_of_the_completion():
    for row in _worker().generate(TASK.prompts[:3]):
        prompt = TASK.prompt(row["prompt_id"])
        assert float(row["reward"]) == pytest.approx(TASK.reward(prompt, row["completion"].tolist()))


def test_two_workers_at_the_same_version_generate_identical_rows():
    a, b = _worker(version=2).generate(TASK.prompts[:3]), _worker(version=2).generate(TASK.prompts[2::-1])
    key = lambda r: (r["prompt_id"], r["sample_index"])  # noqa: E731
    for x, y in zip(sorted(a, key=key), sorted(b, key=key), strict=True):
        assert torch.equal(x["completion"], y["completion"]) and torch.equal(x["logprobs"], y["logprobs"])


def test_rows_do_not_share_storage():
    rows = _worker().generate(TASK.prompts[:1])
    rows[0]["completion"][0] = 99
    assert int(rows[1]["completion"].max()) <= 9


def test_group_size_defaults_to_the_config():
    assert len(_worker().generate(TASK.prompts[:2])) == 2 * CONFIG.group_size
    assert len(_worker().generate(TASK.prompts[:2], group_size=3)) == 6
