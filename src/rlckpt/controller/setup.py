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
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.connect import connect_only_data_plane, replay_buffer_spec
from rlckpt.controller.handles import GeneratorHandle
from rlckpt.controller.loop import GenerateHook, RunSummary
from rlckpt.controller.loop_state import LOADER_STATE_FORMATS, LoopState
from rlckpt.controller.ranks.capacity import check_cluster
from rlckpt.controller.ranks.trainer_rank import SavePlannerFactory
from rlckpt.controller.ranks.trainer_side import TrainerSide
from rlckpt.controller.replication import start_ray_replicator
from rlckpt.controller.stopping import ABORT_WAIT_S, DRIVER_WAIT_S, StopOutcome, StopRequest
from rlckpt.errors import CheckpointError, FinalSaveAbortedError
from rlckpt.grpo import DigitSumTask, PromptLoader, make_generation_actor
from rlckpt.store import BundleStore
from rlckpt.tiers import one_run

logger = logging.getLogger(__name__)

EVENT_POLL_S = 0.5  # how often the driver forwards the actor's progress events
RPC_WAIT_S = 5.0  # how long the driver waits for a call to the actor that must answer at once
STOP_TIMEOUT_S = ABORT_WAIT_S + RPC_WAIT_S  # how long an interrupted run may take to abort its save in flight


@dataclass
class SingleController:
    """What the driver holds: the actor, the trainer side (owner of TransferQueue) and the store."""

    actor: Any
    trainer_side: TrainerSide
    store: BundleStore
    restored: RestoredRun | None
    extra_actors: list[Any] = field(default_factory=list)
    give_up_after_s: float = DRIVER_WAIT_S  # past a stop's grace: the driver stops waiting for the actor
    last_committed_step: int | None = None  # the resume point as the run's events tell it
    _stopped: StopOutcome | None = None

    def __post_init__(self) -> None:
        if self.restored is not None:
            self.last_committed_step = self.restored.step

    def run(
        self,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        stop_request: Callable[[], StopRequest | None] | None = None,
    ) -> RunSummary:
        """Run the actor to completion, forwarding its progress events; re-raises its failure.

        ``stop_request`` is polled with the events: once it returns a request (the CLI's first SIGTERM)
        the controller is asked to save and stop, and ``on_event`` gets ``{"event": "stop_requested"}``.
        No call waits on the actor: if it has not ended ``give_up_after_s`` after the stop's grace
        period (its loop blocked, its process gone), FinalSaveAbortedError names the newest step its
        events reported committed. A KeyboardInterrupt (Ctrl-C, a SIGTERM that stops at once) stops
        the run at once (``stop_at_once``) and is re-raised."""
        import ray

        ref = self.actor.run.remote()
        events = self.actor.drain_events.remote()
        give_up_at: float | None = None
        request: StopRequest | None = None
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=EVENT_POLL_S)
                if request is None and stop_request is not None and (request := stop_request()) is not None:
                    self.actor.request_stop.remote(request)  # not waited for: the actor answers when it can
                    give_up_at = time.monotonic() + request.grace_s + self.give_up_after_s
                    self._forward(
                        {"event": "stop_requested", "reason": request.reason, "grace_s": request.grace_s}, on_event
                    )
                if ray.wait([events], timeout=0)[0]:
                    for event in ray.get(events):
                        self._forward(event, on_event)
                    events = self.actor.drain_events.remote()
                if ready:
                    for pending in (events, self.actor.drain_events.remote()):  # the last ones
                        for event in ray.get(pending, timeout=RPC_WAIT_S):
                            self._forward(event, on_event)
                    return RunSummary(**ray.get(ref))
                if give_up_at is not None and request is not None and time.monotonic() > give_up_at:
                    raise self._gave_up(request)
        except KeyboardInterrupt:  # Ctrl-C or a SIGTERM that stops at once: abort a save in flight cleanly
            self.stop_at_once()
            raise

    def _forward(self, event: dict[str, Any], on_event: Callable[[dict[str, Any]], None] | None) -> None:
        if "saved" in event:
            self.last_committed_step = event["saved"]
        if on_event:
            on_event(event)

    def _gave_up(self, request: StopRequest) -> FinalSaveAbortedError:
        last = "none" if self.last_committed_step is None else f"step {self.last_committed_step}"
        logger.error("the controller did not end its stop within its grace period + %.0fs", self.give_up_after_s)
        return FinalSaveAbortedError(
            f"{request.reason}: the run did not end within its {request.grace_s:.0f}s grace period + "
            f"{self.give_up_after_s:.0f}s; it was stopped without its final save and the newest bundle is {last}",
            reason=request.reason,
            last_committed_step=self.last_committed_step,
        )

    def stop_at_once(self) -> StopOutcome:
        """Cancel the run (a save in flight is aborted) and say what it leaves, as the actor tells it (at
        most STOP_TIMEOUT_S); asked again, the same answer. An actor that does not answer leaves the step
        reached unknown (``step`` None)."""
        import ray

        if self._stopped is None:
            try:
                left = ray.get(self.actor.stop.remote(), timeout=STOP_TIMEOUT_S)
                self._stopped = StopOutcome(step=left["step"], last_committed_step=left["last_committed_step"])
                logger.info("controller stopped at step %s; a save in flight (if any) was aborted", left["step"])
            except Exception as exc:  # the actor is killed next anyway; gc removes what an abort could not
                logger.warning("controller did not stop cleanly within %.0fs: %s", STOP_TIMEOUT_S, exc)
                self._stopped = StopOutcome(step=None, last_committed_step=self.last_committed_step)
        return self._stopped

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
        compression=config.compress_policy,
        reuse=config.reuse_unchanged,
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
