"""The generation worker as a Ray actor samples exactly what it samples in-process."""

import shutil
import tempfile

import pytest
import torch

from rlckpt.dataplane.ray_cluster import start_local_ray, stop_local_ray  # sets Ray env first
from rlckpt.grpo.generation import GenerationWorker, make_generation_actor
from rlckpt.grpo.task import DigitSumTask
from rlckpt.grpo.trainer import GRPOConfig, Trainer

ray = pytest.importorskip("ray")


@pytest.fixture
def ray_cluster():
    """Reuse the cluster another fixture (e.g. tq_session) started; else a private one, stopped after."""
    if ray.is_initialized():
        yield
        return
    temp_dir = tempfile.mkdtemp(prefix="rlckpt-grpo-", dir="/tmp")
    start_local_ray(temp_dir)
    try:
        yield
    finally:
        stop_local_ray()
        shutil.rmtree(temp_dir, ignore_errors=True)


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
