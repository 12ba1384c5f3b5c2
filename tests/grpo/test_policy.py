"""Policy sampling: seeded per (seed, prompt, sample index, weight version), reproducible anywhere."""

import torch

from rlckpt.grpo.policy import PolicyConfig, build_policy, num_parameters, sample_group
from rlckpt.grpo.task import DigitSumTask

TASK = DigitSumTask(seed=0)
CONFIG = PolicyConfig.for_task(TASK)


def _sample(model, prompt_id=0, group_size=8, seed=0, version=0):
    return sample_group(model, TASK.prompt(prompt_id), group_size, seed=seed, weight_version=version)


def test_model_size_is_in_the_small_range():
    assert 2_000 <= num_parameters(build_policy(CONFIG, seed=0)) <= 300_000


def test_same_seed_builds_identical_weights():
    a, b = build_policy(CONFIG, seed=0), build_policy(CONFIG, seed=0)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_building_a_policy_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_policy(CONFIG, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_same_seed_and_version_give_the_same_tokens_and_logprobs():
    model = build_policy(CONFIG, seed=0)
    first, second = _sample(model), _sample(build_policy(CONFIG, seed=0))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_sampling_ignores_the_global_rng():
    model = build_policy(CONFIG, seed=0)
    torch.manual_seed(1)
    first = _sample(model)
    torch.manual_seed(2)
    assert torch.equal(_sample(model)[0], first[0])


def test_a_new_weight_version_draws_new_samples():
    model = build_policy(CONFIG, seed=0)
    assert not torch.equal(_sample(model, version=0)[0], _sample(model, version=1)[0])


def test_a_different_sampling_seed_draws_new_samples():
    model = build_policy(CONFIG, seed=0)
    assert not torch.equal(_sample(model, seed=0)[0], _sample(model, seed=1)[0])


def test_a_sample_does_not_depend_on_the_group_size():
    model = build_policy(CONFIG, seed=0)
    small, large = _sample(model, group_size=3), _sample(model, group_size=8)
    assert torch.equal(small[0], large[0][:3])


def test_samples_are_digits_with_matching_shapes_and_dtypes():
    completions, logprobs = _sample(build_policy(CONFIG, seed=0), group_size=5)
    assert completions.dtype == torch.int64 and completions.shape == (5, CONFIG.completion_length)
    assert logprobs.dtype == torch.float32 and logprobs.shape == (5, CONFIG.completion_length)
    assert int(completions.min()) >= 0 and int(completions.max()) <= 9
    assert bool((logprobs <= 0).all())


def test_sampled_logprobs_match_the_teacher_forced_pass():
    model = build_policy(CONFIG, seed=0)
    completions, logprobs = _sample(model)
    prompts = torch.tensor([TASK.prompt(0).tokens] * len(completions))
    with torch.no_grad():
        log_dist = torch.log_softmax(model.completion_logits(prompts, completions), dim=-1)
    forced = log_dist.gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(forced, logprobs, rtol=1e-5, atol=1e-5)
