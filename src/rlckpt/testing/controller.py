"""In-process controller runs for fast tests: the real ControllerLoop, save and restore procedures,
with in-process trainer/generator and the in-memory data plane instead of Ray and TransferQueue.

``run_in_process`` follows setup_single_controller's order (restore → phase ready → connect-only
client + replay buffer → loop), so tests of resume logic run in well under a second per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.restore import restore_run
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.handles import LocalGenerator, LocalTrainer
from rlckpt.controller.loop import ControllerLoop, LoopState, RunSummary
from rlckpt.controller.policy import TrainerWorker
from rlckpt.dataplane.memory import InMemoryDataPlane, InMemoryStore
from rlckpt.grpo import DigitSumTask, GenerationWorker, PromptLoader
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer
from rlckpt.store import BundleStore


@dataclass
class InProcessRun:
    """One "process": a fresh data plane (like a fresh cluster) and what the run left behind."""

    plane: InMemoryStore = field(default_factory=InMemoryStore)
    phase: RestorePhase = field(default_factory=RestorePhase)
    summary: RunSummary | None = None
    loop: ControllerLoop | None = None


async def run_in_process(config: TrainConfig) -> InProcessRun:
    """Resume (or start) ``config.run_dir`` and train to ``config.steps`` in this process."""
    run = InProcessRun()
    store = BundleStore(config.run_dir, config.storage_options)
    task = DigitSumTask(seed=config.task_seed, num_prompts=config.num_prompts)
    loader = PromptLoader(task, config.grpo.prompts_per_step, seed=config.grpo.seed)
    worker = TrainerWorker(config.grpo)
    bootstrap = InMemoryDataPlane(run.plane)
    restored = None
    if config.fresh:
        run.phase.start_fresh()
    else:
        restored = await restore_run(
            store, trainer=worker, bootstrap=bootstrap, phase=run.phase,
            staging_root=config.staging_dir, expected_mode=config.mode,
        )
    state = LoopState.from_state(restored.loader_state, loader) if restored else LoopState()
    run.phase.require_ready("the connect-only data-plane client")
    data_plane = InMemoryDataPlane(run.plane)
    replay = ReplayBuffer(
        data_plane, DataPlaneCheckpointBarrier(),
        partition_id=config.partition_id, group_size=config.grpo.group_size,
    )
    if restored is not None:
        replay.load_state_dict(restored.replay_state, expected_digest=restored.index_digest)
        replay.validate_inventory(await data_plane.list_sample_ids(config.partition_id))
    run.loop = ControllerLoop(
        config, task=task, loader=loader, trainer=LocalTrainer(worker),
        generator=LocalGenerator(GenerationWorker(config.grpo, task)),
        replay=replay, store=store, state=state,
        resumed_from=restored.step if restored else None,
    )
    run.summary = await run.loop.run()
    return run
