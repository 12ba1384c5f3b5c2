"""End to end on CPU: reward rises, and an interrupted + resumed run equals an uninterrupted one."""

import subprocess
import sys
import textwrap

import torch

from rlckpt.grpo.dataloader import PromptLoader
from rlckpt.grpo.generation import GenerationWorker
from rlckpt.grpo.loop import run_steps
from rlckpt.grpo.task import DigitSumTask
from rlckpt.grpo.trainer import GRPOConfig, Trainer

TASK = DigitSumTask(seed=0)
CONFIG = GRPOConfig(seed=0)


def _fresh_run() -> tuple[Trainer, GenerationWorker, PromptLoader]:
    loader = PromptLoader(TASK, CONFIG.prompts_per_step, seed=0)
    return Trainer(CONFIG), GenerationWorker(CONFIG, TASK), loader


def _save(trainer: Trainer, loader: PromptLoader, path) -> None:
    trainer.save_state(path / "policy.pt")
    torch.save(loader.state_dict(), path / "train_dataloader.pt")


def _resume(path) -> tuple[Trainer, GenerationWorker, PromptLoader]:
    trainer, worker, loader = _fresh_run()
    trainer.load_state(path / "policy.pt")
    loader.load_state_dict(torch.load(path / "train_dataloader.pt", weights_only=True))
    return trainer, worker, loader


def test_mean_reward_rises_clearly_within_forty_steps():
    rewards = [m["mean_reward"] for m in run_steps(*_fresh_run(), steps=40)]
    start, end = sum(rewards[:5]) / 5, sum(rewards[-10:]) / 10
    assert end >= start + 0.25, f"reward went {start:.3f} -> {end:.3f}"


def test_resumed_run_matches_the_uninterrupted_run_bit_for_bit(tmp_path):
    uninterrupted = _fresh_run()
    run_steps(*uninterrupted, steps=8)

    first = _fresh_run()
    run_steps(*first, steps=4)
    _save(first[0], first[2], tmp_path)
    resumed = _resume(tmp_path)  # fresh worker: it gets its weights from the trainer
    history = run_steps(*resumed, steps=4)

    assert history[-1]["weight_version"] == 8
    assert resumed[0].policy_sha256() == uninterrupted[0].policy_sha256()
    assert resumed[2].state_dict() == uninterrupted[2].state_dict()


RESUME_IN_CHILD = textwrap.dedent(
    """
    import pathlib, sys, torch
    from rlckpt.grpo import DigitSumTask, GRPOConfig, GenerationWorker, PromptLoader, Trainer, run_steps
    torch.set_num_threads(2)  # the caller's thread count must not matter
    path = pathlib.Path(sys.argv[1])
    task, config = DigitSumTask(seed=0), GRPOConfig(seed=0)
    trainer, loader = Trainer(config), PromptLoader(task, config.prompts_per_step, seed=0)
    trainer.load_state(path / "policy.pt")
    loader.load_state_dict(torch.load(path / "train_dataloader.pt", weights_only=True))
    run_steps(trainer, GenerationWorker(config, task), loader, steps=3)
    print(trainer.policy_sha256())
    """
)


def test_resume_in_a_new_process_matches_the_uninterrupted_run(tmp_path):
    uninterrupted = _fresh_run()
    run_steps(*uninterrupted, steps=6)
    first = _fresh_run()
    run_steps(*first, steps=3)
    _save(first[0], first[2], tmp_path)
    child = subprocess.run(
        [sys.executable, "-c", RESUME_IN_CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == uninterrupted[0].policy_sha256()
