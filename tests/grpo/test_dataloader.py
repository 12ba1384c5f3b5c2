"""PromptLoader: seeded epoch permutations and an exactly resumable position."""

import io

import pytest
import torch

from rlckpt.errors import LoaderStateError
from rlckpt.grpo.dataloader import PromptLoader
from rlckpt.grpo.task import DigitSumTask

TASK = DigitSumTask(seed=0, num_prompts=10)


def _ids(batches):
    return [[p.prompt_id for p in batch] for batch in batches]


def _take(loader, n):
    return _ids(loader.next_batch() for _ in range(n))


def test_each_epoch_visits_every_prompt_once():
    loader = PromptLoader(TASK, batch_size=5, seed=3)
    first, second = sum(_take(loader, 2), []), sum(_take(loader, 2), [])
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second  # a fresh permutation per epoch


def test_batches_are_full_and_never_repeat_a_prompt():
    batches = _take(PromptLoader(TASK, batch_size=2, seed=0), 25)
    assert all(len(b) == 2 and b[0] != b[1] for b in batches)


@pytest.mark.parametrize("batch_size", [0, 3, 11])
def test_batch_size_must_divide_the_prompt_count(batch_size):
    with pytest.raises(ValueError, match="divide the 10 prompts"):
        PromptLoader(TASK, batch_size=batch_size)


def test_same_seed_gives_same_stream_and_other_seed_differs():
    assert _take(PromptLoader(TASK, 2, seed=1), 8) == _take(PromptLoader(TASK, 2, seed=1), 8)
    assert _take(PromptLoader(TASK, 2, seed=1), 8) != _take(PromptLoader(TASK, 2, seed=2), 8)


@pytest.mark.parametrize("consumed", [0, 1, 3, 4, 7])
def test_resumed_loader_continues_the_uninterrupted_stream(consumed):
    uninterrupted = _take(PromptLoader(TASK, 2, seed=5), consumed + 9)
    first = PromptLoader(TASK, 2, seed=5)
    _take(first, consumed)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = PromptLoader(TASK, 2, seed=5)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert _take(resumed, 9) == uninterrupted[consumed:]


def test_state_dict_holds_plain_ints():
    loader = PromptLoader(TASK, 2, seed=5)
    _take(loader, 6)
    state = loader.state_dict()
    assert all(type(v) is int for v in state.values())
    assert state["epoch"] == 1 and state["position"] == 2


@pytest.mark.parametrize("field, value", [("seed", 6), ("batch_size", 5), ("num_prompts", 11)])
def test_state_from_a_different_loader_is_refused(field, value):
    state = PromptLoader(TASK, 2, seed=5).state_dict() | {field: value}
    with pytest.raises(LoaderStateError, match=field):
        PromptLoader(TASK, 2, seed=5).load_state_dict(state)


def test_out_of_range_position_is_refused():
    state = PromptLoader(TASK, 2, seed=5).state_dict() | {"position": 11}
    with pytest.raises(LoaderStateError, match="position=11"):
        PromptLoader(TASK, 2, seed=5).load_state_dict(state)
