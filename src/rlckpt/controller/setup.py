"""setup_single_controller: the driver builds every object, in the restore order of
docs/architecture.md (Restore).

1–3. ``restore_run``: newest committed bundle, every piece fetched and checked, then trainer
     state, dataloader position and TransferQueue (restored by the bootstrap client)
4. only now: the connect-only client and the replay buffer (asserted by RestorePhase)
5. the controller actor, created with the data-plane metadata read back in 3; its ``run()``
   assembles the loop and checks the restored index (``assemble_controller``)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.restore import RestoredRun, check_resume_step, restore_run
from rlckpt.checkpoint.row_copy import start_ray_row_copier
from rlckpt.checkpoint.save import SaveHook
from rlckpt.controller.actor import SingleControllerActor
from rlckpt.controller.args import ControllerArgs, RestoredIndex
from rlckpt.controller.capacity import check_cluster
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.connect import connect_only_data_plane, replay_buffer_spec
from rlckpt.controller.handles import GeneratorHandle
from rlckpt.controller.loop import GenerateHook, RunSummary
from rlckpt.controller.loop_state import LOADER_STATE_FORMATS, LoopState
from rlckpt.controller.replication import start_ray_replicator
from rlckpt.controller.stopping import StopRequest
from rlckpt.controller.trainer_rank import SavePlannerFactory
from rlckpt.controller.trainer_side import TrainerSide
from rlckpt.errors import CheckpointError
from rlckpt.grpo import DigitSumTask, PromptLoader, make_generation_actor
from rlckpt.store import BundleStore
from rlckpt.tiers import one_run

logger = logging.getLogger(__name__)

EVENT_POLL_S = 0.5  # how often the driver forwards the actor's progress events
STOP_TIMEOUT_S = 30.0  # how long an interrupted run may take to abort its save in flight


@dataclass
class SingleController:
    """What the driver holds: the actor, the trainer side (owner of TransferQueue) and the store."""

    actor: Any
    trainer_side: TrainerSide
    store: BundleStore
    restored: RestoredRun | None
    extra_actors: list[Any] = field(default_factory=list)

    def run(
        self,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        stop_request: Callable[[], StopRequest | None] | None = None,
    ) -> RunSummary:
        """Run the actor to completion, forwarding its progress events; re-raises its failure.

        ``stop_request`` is polled with the events: once it returns a request (the CLI's first SIGTERM)
        the controller is asked to save and stop, and ``on_event`` gets ``{"event": "stop_requested"}``."""
        import ray

        ref = self.actor.run.remote()
        forwarded = False
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=EVENT_POLL_S)
                request = None if forwarded or stop_request is None else stop_request()
                if request is not None:
                    ray.get(self.actor.request_stop.remote(request))
                    forwarded = True
                    if on_event:
                        on_event({"event": "stop_requested", "reason": request.reason, "grace_s": request.grace_s})
                for event in ray.get(self.actor.drain_events.remote()):
                    if on_event:
                        on_event(event)
                if ready:
                    return RunSummary(**ray.get(ref))
        except KeyboardInterrupt:  # Ctrl-C or a SIGTERM that stops at once: abort a save in flight cleanly
            self._stop_actor()
            raise

    def _stop_actor(self) -> None:
        import ray

        try:
            if ray.get(self.actor.stop.remote(), timeout=STOP_TIMEOUT_S):
                logger.info("controller stopped; a save in flight (if any) was aborted")
        except Exception as exc:  # the actor is killed next anyway; gc removes what an abort could not
            logger.warning("controller did not stop cleanly within %.0fs: %s", STOP_TIMEOUT_S, exc)

    def shutdown(self) -> None:
        """Stop the actors, then the trainer side (its ranks and TransferQueue)."""
        import ray

        for actor in [self.actor, *self.extra_actors]:
            ray.kill(actor, no_restart=True)
        self.trainer_side.shutdown()


def check_start(config: TrainConfig) -> BundleStore:
    """What a start refuses before any cluster exists: ``--fresh`` over committed bundles, a remote tier
    that cannot be reached, and a ``--resume-step`` that has newer bundles or does not open on any tier
    (``check_resume_step``). Returns the run's store. `rlckpt train` calls it before starting Ray and
    TransferQueue (≈20 s)."""
    store = _refuse_fresh_over_bundles(config)
    tiers = run_tiers(config, store)
    one_run(tiers)  # a wiped local tier takes the run's identity back from the remote one
    if config.resume_step is not None and not config.fresh:
        check_resume_step(tiers, config.resume_step)
    elif len(tiers) > 1:
        tiers[1].steps()  # StoreUnavailableError now, not after the cluster has started
    return store


def run_tiers(config: TrainConfig, store: BundleStore) -> list[BundleStore]:
    """The stores a resume looks at, in order of preference: the run dir, then the remote tier (if any)."""
    replication = config.replication
    if replication is None:
        return [store]
    return [store, replication.remote_store()]


def _refuse_fresh_over_bundles(config: TrainConfig) -> BundleStore:
    """The run's store; CheckpointError if ``--fresh`` would start over committed bundles."""
    store = config.store()
    for tier in run_tiers(config, store):
        if config.fresh and tier.steps():
            raise CheckpointError(
                f"--fresh but {tier.url} already holds committed bundles (steps {tier.steps()}); "
                "use a new run dir, or resume without --fresh"
            )
    return store


def setup_single_controller(
    config: TrainConfig,
    *,
    before_commit: SaveHook | None = None,
    save_planner: SavePlannerFactory | None = None,
    before_generate: GenerateHook | None = None,
) -> SingleController:
    """Build everything on the driver (Ray must be running); restore the newest bundle unless fresh.

    ``before_commit`` (picklable) is awaited in the controller actor before each save's COMMIT;
    ``save_planner`` (picklable) gives each trainer rank its DCP save planner; ``before_generate``
    (picklable) is awaited by the rollout pump before each batch is generated (crash and stop tests).
    """
    import ray

    started = time.perf_counter()
    store = _refuse_fresh_over_bundles(config)  # restore_run checks a --resume-step itself
    task = DigitSumTask(seed=config.task_seed, num_prompts=config.num_prompts)
    loader = PromptLoader(task, config.grpo.prompts_per_step, seed=config.grpo.seed)
    phase = RestorePhase()

    check_cluster(config.trainer_ranks, config.trainer_resources)  # in seconds, before any actor starts
    trainer_side = TrainerSide(  # trainer ranks + bootstrap client (starts TQ)
        config.grpo,
        config.tq_config,
        ranks=config.trainer_ranks,
        resources=config.trainer_resources,
        timeout_s=config.rank_timeout_s,
        save_planner=save_planner,
    )
    if config.fresh:
        phase.start_fresh()
        restored = None
    else:  # 1-3: bundle → trainer state, loader position → TQ restored by the bootstrap client
        tiers = run_tiers(config, store)
        one_run(tiers)
        restored = asyncio.run(
            restore_run(
                tiers,
                trainer=trainer_side,
                bootstrap=trainer_side.data_plane,
                phase=phase,
                staging_root=config.staging_dir,
                expected_rollout_order=config.rollout_order,
                loader_formats=LOADER_STATE_FORMATS,
                resume_step=config.resume_step,
            )
        )
    loop_state = LoopState.from_state(restored.loader_state, loader) if restored else LoopState()

    data_plane = connect_only_data_plane(phase, config.tq_config)  # 4: asserted order
    replay = replay_buffer_spec(phase, partition_id=config.partition_id, group_size=config.grpo.group_size)
    generator = make_generation_actor(config.grpo, task, num_cpus=0)

    copier = start_ray_row_copier(data_plane) if config.upload_timing == "pinned" else None
    replicator = start_ray_replicator(config)
    args = ControllerArgs(
        config=config,
        task=task,
        loader=loader,
        loop_state=loop_state,
        trainer=trainer_side.handle(),
        generator=GeneratorHandle(generator),
        replay=replay,
        restored=RestoredIndex.from_run(restored) if restored else None,
        before_commit=before_commit,
        row_copier=copier,
        before_generate=before_generate,
        replicator=replicator,
    )
    extra_actors = [generator] + ([copier.actor] if copier is not None else [])
    extra_actors += [replicator.actor] if replicator is not None else []
    actor = ray.remote(SingleControllerActor).options(num_cpus=0).remote(args, data_plane)  # 5
    seconds = time.perf_counter() - started
    logger.info("controller set up in %.1fs (%s)", seconds, f"resumed step {restored.step}" if restored else "fresh")
    return SingleController(actor, trainer_side, store, restored, extra_actors=extra_actors)
