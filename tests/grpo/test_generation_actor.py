"""The generation worker as a Ray actor samples exactly what it samples in-process."""

import pytest
import torch

from rlckpt.grpo.generation import GenerationWorker, make_generation_actor
from rlckpt.grpo.task import DigitSumTask
from rlckpt.grpo.trainer import GRPOConfig, Trainer

ray = pytest.importorskip("ray")


@pytest.fixture
def ray_cluster():
    """Reuse a cluster another fixture started; otherwise start a small one and stop it after."""
    if ray.is_initialized():
        yield
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_actor_rows_equal_in_process_rows(ray_cluster):
    task, config = DigitSumTask(seed=0), GRPOConfig(group_size=4)
    weights = Trainer(config).weights()
    actor = make_generation_actor(config, task)
    try:
        ray.get(actor.set_weights.remote(weights, 5))
        remote_rows = ray.get(actor.generate.remote(task.prompts[:3]))
    finally:
        ray.kill(actor)
    local = GenerationWorker(config, task)
    local.set_weights(weights, 5)
    local_rows = local.generate(task.prompts[:3])
    assert len(remote_rows) == len(local_rows) == 12
    for remote, here in zip(remote_rows, local_rows, strict=True):
        assert (remote["prompt_id"], remote["sample_index"], remote["weight_version"]) == (
            here["prompt_id"],
            here["sample_index"],
            5,
        )
        for field in ("prompt", "completion", "logprobs", "reward"):
            assert torch.equal(remote[field], here[field])
