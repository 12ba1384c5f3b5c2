"""DigitSumTask: a finite deterministic prompt set and a partial-credit reward."""

import pytest

from rlckpt.grpo.task import BOS, TARGET_OFFSET, DigitSumTask


@pytest.fixture
def task() -> DigitSumTask:
    return DigitSumTask(seed=0, num_prompts=32, completion_length=4, tolerance=9.0)


def test_exact_digit_sum_earns_full_reward(task):
    prompt = task.prompt(0)
    digits = _digits_summing_to(prompt.target, 4)
    assert task.reward(prompt, digits) == 1.0


def test_reward_falls_linearly_with_distance_from_target(task):
    prompt = next(p for p in task.prompts if 3 <= p.target <= 30)
    off_by_three = _digits_summing_to(prompt.target - 3, 4)
    assert task.reward(prompt, off_by_three) == pytest.approx(1.0 - 3 / 9.0)


def test_reward_is_zero_beyond_tolerance(task):
    prompt = next(p for p in task.prompts if p.target >= 10)
    assert task.reward(prompt, [0, 0, 0, 0]) == 0.0


@pytest.mark.parametrize("completion", [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3, BOS], [1, 2, -1, 3]])
def test_malformed_completion_earns_nothing(task, completion):
    assert task.reward(task.prompt(0), completion) == 0.0


def test_prompt_set_is_deterministic_for_a_seed(task):
    again = DigitSumTask(seed=0, num_prompts=32, completion_length=4, tolerance=9.0)
    assert again.prompts == task.prompts


def test_different_seeds_give_different_targets():
    first = [p.target for p in DigitSumTask(seed=0).prompts]
    second = [p.target for p in DigitSumTask(seed=1).prompts]
    assert first != second


def test_prompts_encode_their_target_and_ids_are_indices(task):
    for index, prompt in enumerate(task.prompts):
        assert prompt.prompt_id == index
        assert prompt.tokens == [BOS, TARGET_OFFSET + prompt.target]
        assert 0 <= prompt.target <= task.max_target
        assert max(prompt.tokens) < task.vocab_size


def test_invalid_task_settings_are_refused():
    with pytest.raises(ValueError, match="num_prompts"):
        DigitSumTask(num_prompts=0)


def _digits_summing_to(total: int, length: int) -> list[int]:
    digits = []
    for _ in range(length):
        digit = min(9, total)
        digits.append(digit)
        total -= digit
    assert total == 0
    return digits
