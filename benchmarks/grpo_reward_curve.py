"""Mean reward over steps of the tiny GRPO (in-process loop, CPU), as a markdown table.

.venv/bin/python benchmarks/grpo_reward_curve.py --steps 60 --window 5 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import time

from rlckpt.grpo import (
    DigitSumTask,
    GenerationWorker,
    GRPOConfig,
    PolicyConfig,
    PromptLoader,
    Trainer,
    num_parameters,
    run_steps,
)


def reward_curve(seed: int, steps: int) -> tuple[list[float], float, str]:
    """Per-step mean reward, wall seconds, and final policy digest for one seed."""
    task = DigitSumTask(seed=0)
    config = GRPOConfig(seed=seed, policy=PolicyConfig.for_task(task))
    trainer = Trainer(config)
    worker = GenerationWorker(config, task)
    loader = PromptLoader(task, config.prompts_per_step, seed=seed)
    start = time.perf_counter()
    history = run_steps(trainer, worker, loader, steps)
    return [m["mean_reward"] for m in history], time.perf_counter() - start, trainer.policy_sha256()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()

    task = DigitSumTask(seed=0)
    config = GRPOConfig()
    params = num_parameters(Trainer(GRPOConfig(policy=PolicyConfig.for_task(task))).model)
    print(
        f"task: {task!r}; policy params: {params}; "
        f"{config.prompts_per_step} prompts x {config.group_size} samples per step, lr {config.lr}, "
        f"{config.epochs_per_step} updates per step, clip {config.clip_eps}"
    )
    runs = {seed: reward_curve(seed, args.steps) for seed in args.seeds}
    header = "| steps | " + " | ".join(f"seed {s}" for s in args.seeds) + " |"
    print(header)
    print("|" + "---|" * (len(args.seeds) + 1))
    for lo in range(0, args.steps, args.window):
        hi = min(lo + args.window, args.steps)
        cells = [sum(runs[s][0][lo:hi]) / (hi - lo) for s in args.seeds]
        print(f"| {lo}-{hi - 1} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    for seed, (_, seconds, sha) in runs.items():
        print(f"seed {seed}: {args.steps} steps in {seconds:.2f} s, policy_sha256 {sha[:16]}…")


if __name__ == "__main__":
    main()
