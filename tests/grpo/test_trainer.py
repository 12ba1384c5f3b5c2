"""Trainer: deterministic clipped PG steps, versioned weights, and exact save/load."""

import io

import pytest
import torch

from rlckpt.errors import TrainerStateError
from rlckpt.grpo.advantages import with_group_advantages
from rlckpt.grpo.batch import TrainBatch
from rlckpt.grpo.generation import GenerationWorker
from rlckpt.grpo.policy import PolicyConfig
from rlckpt.grpo.task import DigitSumTask
from rlckpt.grpo.trainer import GRPOConfig, Trainer, weights_sha256

TASK = DigitSumTask(seed=0)
CONFIG = GRPOConfig(group_size=4)


def _batch(trainer: Trainer, prompt_ids=(0, 1, 2)) -> TrainBatch:
    worker = GenerationWorker(trainer.config, TASK)
    worker.set_weights(trainer.weights(), trainer.weight_version)
    rows = worker.generate([TASK.prompt(i) for i in prompt_ids])
    return TrainBatch.from_rows(with_group_advantages(rows))


def test_same_seed_gives_same_policy_and_other_seed_differs():
    assert Trainer(CONFIG).policy_sha256() == Trainer(CONFIG).policy_sha256()
    assert Trainer(CONFIG).policy_sha256() != Trainer(GRPOConfig(seed=1, group_size=4)).policy_sha256()


def test_train_step_bumps_the_version_and_changes_the_weights():
    trainer = Trainer(CONFIG)
    before = trainer.policy_sha256()
    metrics = trainer.train_step(_batch(trainer))
    assert trainer.weight_version == 1 and metrics["weight_version"] == 1
    assert trainer.policy_sha256() != before
    assert {"loss", "mean_reward", "clip_fraction", "approx_kl", "entropy", "grad_norm"} <= metrics.keys()


def test_same_batch_gives_bit_identical_steps():
    a, b = Trainer(CONFIG), Trainer(CONFIG)
    batch = _batch(a)
    a.train_step(batch)
    b.train_step(batch)
    assert a.policy_sha256() == b.policy_sha256()


def test_zero_advantages_leave_the_loss_at_zero():
    trainer = Trainer(CONFIG)
    batch = _batch(trainer)
    batch.advantages = torch.zeros_like(batch.advantages)
    assert trainer.train_step(batch)["loss"] == 0.0


def test_weights_are_copies():
    trainer = Trainer(CONFIG)
    weights = trainer.weights()
    next(iter(weights.values())).add_(1.0)
    assert weights_sha256(weights) != trainer.policy_sha256()


def test_sha_changes_when_one_value_changes():
    weights = Trainer(CONFIG).weights()
    before = weights_sha256(weights)
    name = sorted(weights)[-1]
    weights[name].view(-1)[0] = torch.nextafter(weights[name].view(-1)[0], torch.tensor(1.0))
    assert weights_sha256(weights) != before


@pytest.mark.parametrize("to_file", [False, True])
def test_save_load_round_trip_gives_same_sha_and_same_next_step(tmp_path, to_file):
    original = Trainer(CONFIG)
    original.train_step(_batch(original, (0, 1)))
    target = tmp_path / "policy.pt" if to_file else io.BytesIO()
    original.save_state(target)
    if not to_file:
        target.seek(0)
    restored = Trainer(CONFIG)
    restored.load_state(target)
    assert restored.policy_sha256() == original.policy_sha256()
    assert restored.weight_version == original.weight_version == 1
    batch = _batch(original, (3, 4))
    original.train_step(batch)
    restored.train_step(batch)
    assert restored.policy_sha256() == original.policy_sha256()


def test_a_state_for_another_policy_shape_is_refused():
    buffer = io.BytesIO()
    Trainer(GRPOConfig(policy=PolicyConfig(hidden_dim=16))).save_state(buffer)
    buffer.seek(0)
    with pytest.raises(TrainerStateError, match="policy"):
        Trainer(CONFIG).load_state(buffer)


def test_an_unreadable_state_file_is_refused(tmp_path):
    path = tmp_path / "policy.pt"
    path.write_bytes(b"not a torch file")
    with pytest.raises(TrainerStateError, match="policy.pt"):
        Trainer(CONFIG).load_state(path)


def test_a_state_of_unknown_format_is_refused():
    state = Trainer(CONFIG).state_dict() | {"format": 99}
    with pytest.raises(TrainerStateError, match="format 99"):
        Trainer(CONFIG).load_state_dict(state)


def test_thread_count_of_the_caller_is_restored():
    trainer = Trainer(GRPOConfig(group_size=4, num_threads=1))
    previous = torch.get_num_threads()
    trainer.train_step(_batch(trainer))
    assert torch.get_num_threads() == previous
