"""In-process controller runs for fast tests: the real restore procedure and controller assembly,
with an in-process trainer (one rank, no process group: DCP saves and loads as on the ranks),
an in-process generator and the in-memory data plane instead of Ray and TransferQueue.

``run_in_process`` follows setup_single_controller's order (restore → phase ready → connect-only
client + replay buffer → ``assemble_controller``), so tests of resume logic run in well under a
second per step and check the restored index exactly as the controller actor does. A two-tier run
(``config.replicate_to``) replicates in a thread of this process (the main job: a Ray actor).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.restore import RestoredRun, restore_run
from rlckpt.checkpoint.row_copy import RowCopyWorker
from rlckpt.checkpoint.save import SaveHook
from rlckpt.controller.args import ControllerArgs, RestoredIndex
from rlckpt.controller.assemble import assemble_controller
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.connect import replay_buffer_spec
from rlckpt.controller.handles import LocalGenerator
from rlckpt.controller.loop import ControllerLoop, GenerateHook, RunSummary
from rlckpt.controller.loop_state import LOADER_STATE_FORMATS, LoopState
from rlckpt.controller.ranks.trainer_group import LocalTrainerGroup
from rlckpt.dataplane.base import DataPlaneClient
from rlckpt.dataplane.memory import InMemoryDataPlane, InMemoryStore
from rlckpt.grpo import DigitSumTask, GenerationWorker, PromptLoader
from rlckpt.tiers import BundleReplicator, ThreadReplicator, one_run


@dataclass
class InProcessRun:
    """One "process": a fresh data plane (like a fresh cluster) and what the run left behind."""

    plane: InMemoryStore = field(default_factory=InMemoryStore)
    phase: RestorePhase = field(default_factory=RestorePhase)
    summary: RunSummary | None = None
    loop: ControllerLoop | None = None
    restored: RestoredRun | None = None


@dataclass(frozen=True)
class InMemoryDataPlaneSpec:
    """The in-memory counterpart of ConnectOnlyDataPlane: another client on the same rows."""

    plane: InMemoryStore

    def connect(self) -> DataPlaneClient:
        return InMemoryDataPlane(self.plane)


async def run_in_process(
    config: TrainConfig,
    *,
    before_commit: SaveHook | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    run: InProcessRun | None = None,
    before_generate: GenerateHook | None = None,
    clock: Callable[[], float] | None = None,
) -> InProcessRun:
    """Resume (or start) ``config.run_dir`` and train to ``config.steps`` in this process.

    ``run`` (optional) is filled as the run goes, so a test can reach the loop while it runs; ``clock``
    replaces the wall clock the deadline (``config.save_by``) is planned on."""
    run = run if run is not None else InProcessRun()
    store = config.store()
    replication = config.replication
    tiers = [store] if replication is None else [store, replication.remote_store()]
    one_run(tiers)
    task = DigitSumTask(seed=config.task_seed, num_prompts=config.num_prompts)
    loader = PromptLoader(task, config.grpo.prompts_per_step, seed=config.grpo.seed)
    trainer = LocalTrainerGroup(config.grpo)  # one rank, world size 1, in threads of this process
    bootstrap = InMemoryDataPlane(run.plane)
    restored = None
    if config.fresh:
        run.phase.start_fresh()
    else:
        restored = await restore_run(
            tiers,
            trainer=trainer,
            bootstrap=bootstrap,
            phase=run.phase,
            staging_root=config.staging_dir,
            expected_rollout_order=config.rollout_order,
            loader_formats=LOADER_STATE_FORMATS,
            resume_step=config.resume_step,
        )
        run.restored = restored
    args = ControllerArgs(
        config=config,
        task=task,
        loader=loader,
        loop_state=LoopState.from_state(restored.loader_state, loader) if restored else LoopState(),
        trainer=trainer,
        generator=LocalGenerator(GenerationWorker(config.grpo, task)),
        replay=replay_buffer_spec(run.phase, partition_id=config.partition_id, group_size=config.grpo.group_size),
        restored=RestoredIndex.from_run(restored) if restored else None,
        row_copier=RowCopyWorker(InMemoryDataPlaneSpec(run.plane)),
        before_commit=before_commit,
        before_generate=before_generate,
        replicator=None
        if replication is None
        else ThreadReplicator(BundleReplicator(config.run_dir, config.storage_options, replication)),
    )
    run.phase.require_ready("the connect-only data-plane client")
    data_plane = InMemoryDataPlaneSpec(run.plane).connect()
    run.loop = await assemble_controller(
        args, store=store, data_plane=data_plane, on_event=on_event, clock=clock or time.time
    )
    run.summary = await run.loop.run()
    return run
