"""Group-normalized advantages: zero mean and unit (population) std within each group."""

import pytest
import torch

from rlckpt.errors import InvalidBatchError
from rlckpt.grpo.advantages import group_advantages, grouped_advantages, with_group_advantages


def test_advantages_have_zero_mean_and_unit_std():
    adv = group_advantages([0.1, 0.5, 0.9, 0.2, 0.0])
    assert adv.dtype == torch.float32
    assert float(adv.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(adv.std(correction=0)) == pytest.approx(1.0, abs=1e-4)


def test_better_reward_gets_larger_advantage():
    adv = group_advantages([0.2, 0.8, 0.5])
    assert adv[1] > adv[2] > adv[0]


def test_equal_rewards_give_zero_advantages():
    assert torch.equal(group_advantages([0.7, 0.7, 0.7]), torch.zeros(3))


def test_empty_group_is_refused():
    with pytest.raises(InvalidBatchError, match="empty"):
        group_advantages([])


def test_each_row_of_a_reward_matrix_is_normalized_alone():
    rewards = torch.tensor([[0.0, 1.0], [10.0, 30.0]])
    adv = grouped_advantages(rewards)
    torch.testing.assert_close(adv, torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]), atol=1e-5, rtol=0)


def test_rows_are_grouped_by_prompt_and_weight_version():
    rows = [
        {"prompt_id": 0, "weight_version": 0, "reward": torch.tensor([0.0])},
        {"prompt_id": 1, "weight_version": 0, "reward": torch.tensor([5.0])},
        {"prompt_id": 0, "weight_version": 0, "reward": torch.tensor([1.0])},
        {"prompt_id": 1, "weight_version": 0, "reward": torch.tensor([5.0])},
        {"prompt_id": 0, "weight_version": 1, "reward": torch.tensor([9.0])},
    ]
    adv = [float(r["advantages"]) for r in with_group_advantages(rows)]
    assert adv == pytest.approx([-1.0, 0.0, 1.0, 0.0, 0.0], abs=1e-5)
    assert "advantages" not in rows[0]  # inputs untouched
