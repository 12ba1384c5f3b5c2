"""The controller's event loop: a rollout pump and a train pump over the replay buffer.

Rollout pump: draw a prompt batch and reserve its groups (one synchronous step, so a checkpoint
never sees a drawn prompt without its reservation) → generate → commit each group through the
replay buffer. Train pump: take the groups of step k → advantage stage (read rewards, write
``advantages`` onto the same keys) → train → remove the groups → sync weights → save every
``save_every`` steps and at the last step.

Stopping early (docs/architecture.md, Stopping): ``request_stop`` (SIGTERM through the driver) or
the deadline (``TrainConfig.save_by``) asks the run to save and stop. The train step in progress
finishes; a wait for rollouts is a safe point (nothing of the step has started); the rollout pump
draws no new batch, and what is in flight is saved as reserved groups like in any save. A save in
flight is finished first if that fits the grace period, then one final save of the step reached
commits and ``run()`` returns. The grace period bounds it all: when it runs out the final save is
aborted (nothing of it committed) and ``run()`` raises FinalSaveAbortedError. What a stop cancels is
waited for ``config.stop_abort_s`` at most: a save whose thread waits on a store that does not answer
is left behind, so that neither the grace period nor a cancel waits on the storage.

Rollout orders: ``in_order`` — batch k is generated with weights k and trained at step k (deterministic);
``async`` — batch k may be generated with weights as old as k − max_staleness while the trainer
works (bounded staleness). In both, every drawn prompt is trained exactly once, across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.row_copy import RowCopier
from rlckpt.checkpoint.save import PendingSave, SaveHook, SaveParticipants, SaveReport, start_save
from rlckpt.checkpoint.stopping import DeadlinePlan, GracePeriod, SaveTimes
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.handles import Generator, Trainer
from rlckpt.controller.loop_state import LoopState
from rlckpt.controller.stopping import StopReason, StopRequest
from rlckpt.errors import CheckpointError, FinalSaveAbortedError, SaveFailedError
from rlckpt.grpo import DigitSumTask, PromptLoader, TrainBatch, grouped_advantages, weights_sha256
from rlckpt.replay import GroupRecord, ReplayBuffer
from rlckpt.store import BundleStore
from rlckpt.tiers import ReplicationQueue, Replicator

logger = logging.getLogger(__name__)

ROW_ID_FIELDS = ("prompt_id", "sample_index", "weight_version", "draw_seq")
DEADLINE_RECHECK_S = 5.0  # the deadline is re-planned at least this often while no step ends
# Awaited by the rollout pump with a batch's step once it is drawn and reserved, before it is generated
# (end-to-end tests hold a run there to stop it "during generation").
GenerateHook = Callable[[int], Awaitable[None]]


@dataclass
class RunSummary:
    """What a run did; the CLI prints it (``--json``: one line)."""

    step: int
    policy_sha256: str
    reward: float | None
    resumed_from: int | None
    trained_draws: list[int]
    unconsumed_draws: list[int]
    drawn: int
    saves: list[dict[str, Any]]
    steps_run: int
    start_policy_sha256: str = ""  # the weights the run started from (after a restore: as loaded)
    stop_reason: StopReason = "completed"
    last_committed_step: int | None = None  # the resume point the run leaves (None: no bundle)
    replicated: list[int] = field(default_factory=list)  # steps this run replicated to the remote tier
    replication_failed: dict[int, str] = field(default_factory=dict)  # steps whose replication failed, and why


class ControllerLoop:
    """Owns nothing it builds: every collaborator is handed in (by the actor or by a test)."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        task: DigitSumTask,
        loader: PromptLoader,
        trainer: Trainer,
        generator: Generator,
        replay: ReplayBuffer,
        store: BundleStore,
        state: LoopState,
        resumed_from: int | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        before_commit: SaveHook | None = None,
        row_copier: RowCopier | None = None,
        before_generate: GenerateHook | None = None,
        clock: Callable[[], float] = time.time,
        replicator: Replicator | None = None,
    ) -> None:
        self.config = config
        self.task = task
        self.loader = loader
        self.trainer = trainer
        self.generator = generator
        self.replay = replay
        self.store = store
        self.state = state
        self.resumed_from = resumed_from
        self.on_event = on_event or (lambda event: None)
        self.gen_version = state.step
        self.trained_draws: list[int] = []
        self.saves: list[SaveReport] = []
        self.last_reward: float | None = None
        self.last_loss: float | None = None
        self._progress = asyncio.Condition()
        self.replication = self._replication(replicator)
        self.remote = None if config.replication is None else config.replication.remote_store()
        self.save_parts = SaveParticipants(
            store=store,
            policy=trainer,
            replay=replay,
            capture_loader_state=lambda: self.state.to_state(self.loader),
            rollout_order=config.rollout_order,
            staging_root=config.staging_dir,
            compress_data_plane=self._compress_data_plane(),
            reuse=self.config.reuse_unchanged,
            retention=config.retention,
            retention_holds=self._replication_holds(),
            metrics=self._metrics,
            extra_metadata={
                "task": repr(task),
                "steps_target": config.steps,
                layout.META_TRAINER_RANKS: trainer.world_size,
            },
            before_commit=before_commit,
            row_copier=row_copier,
        )
        self._save_in_flight: asyncio.Task[None] | None = None
        self._save_in_flight_step: int | None = None
        self._background_failure: SaveFailedError | None = None
        self.before_generate = before_generate
        self.clock = clock  # wall clock (unix seconds): the deadline is a wall-clock time
        self._committed_step = resumed_from  # the resume point the run would leave now
        self._save_times = SaveTimes(config.unmeasured_save_s)
        self._deadline = DeadlinePlan(config.save_by, self._save_times) if config.save_by is not None else None
        self._step_ended = asyncio.Event()  # the deadline watch re-plans at every step
        self._stop: StopRequest | None = None
        self._stop_requested = asyncio.Event()
        self._grace: GracePeriod | None = None  # on the event loop's clock, from the stop request
        self._grace_moved = asyncio.Event()  # wakes run() when the grace period is set or moved
        self._abort_by: float | None = None  # event-loop time until which cancelled work is waited for
        self._cancelled = False  # run() was cancelled: stopped at once

    def _replication(self, replicator: Replicator | None) -> ReplicationQueue | None:
        """The queue of replications to the remote tier, when the run has one (docs/tiers.md)."""
        if self.config.replicate_to is None:
            return None
        if replicator is None:
            raise CheckpointError(f"the run replicates to {self.config.replicate_to} but was given no replicator")
        return ReplicationQueue(replicator, remote_url=self.config.replicate_to, on_event=self.on_event)

    def _replication_holds(self) -> Callable[[], dict[int, str]] | None:
        """What local retention keeps while replication is on (tiers/holds.py): by what the replication worker
        last found the remote tier to hold, and the steps in flight or waiting here. Asked in retention's
        thread; it lists the local tier only (one listing: retention reads the bundles itself), so no save
        waits on the remote tier."""
        local, queue = self.store, self.replication
        if queue is None:
            return None
        return lambda: queue.holds(local.marked_steps())

    def _compress_data_plane(self) -> bool | None:
        """zstd for the data plane's files as asked; by default where they end up on an object store: the run
        dir's store, or the remote tier's (a replica carries the bytes as stored: docs/tiers.md)."""
        if self.config.compress_data_plane is None and self.remote is not None and not self.remote.is_local:
            return True
        return self.config.compress_data_plane

    def _metrics(self) -> dict[str, float]:
        """The numbers each save records in its manifest (controller.config.RUN_METRICS), once known."""
        values = {"reward": self.last_reward, "loss": self.last_loss}
        return {name: float(value) for name, value in values.items() if value is not None and math.isfinite(value)}

    def _replicate_if_due(self, step: int, last: bool) -> None:
        """After a local commit: replicate it when it is due (every K-th save period, and the last save)."""
        replication = self.config.replication
        if (
            self.replication is not None
            and replication is not None
            and replication.due(step, self.config.save_every, last)
        ):
            self.replication.submit(step)

    async def _wait_for_replication(self) -> None:
        """At the end of the run: the replication in flight (and the one waiting) finishes first, so the remote
        tier holds the run's last state. A run that is stopping waits only within its grace period."""
        if self.replication is None or not self.replication.pending():
            return
        logger.info(
            "waiting for the replication of step(s) %s to %s",
            sorted(self.replication.pending()),
            self.config.replicate_to,
        )
        await self.replication.drain()

    # --- the run ---------------------------------------------------------------------------------

    async def run(self) -> RunSummary:
        """Train until ``config.steps``; returns the summary. Saves are part of the train pump."""
        start = self.state.step
        weights, version = await self.trainer.weights()
        start_sha = weights_sha256(weights)
        await self.generator.set_weights(weights, version)
        self.gen_version = version
        if version != self.state.step:
            raise CheckpointError(f"trainer is at weight version {version}, the run state at step {self.state.step}")
        if self.replication is not None:
            self.replication.start()  # what the remote tier holds, read by the replication worker
        rollout = asyncio.create_task(self._rollout_pump(), name="rollout-pump")
        train = asyncio.create_task(self._train_pump(), name="train-pump")
        watch = asyncio.create_task(self._watch_deadline(), name="deadline-watch") if self._deadline else None
        body = asyncio.create_task(self._to_the_end(rollout, train), name="run-body")
        try:
            if await self._within_grace(body):
                body.result()  # the run's own failure, if any
            else:
                await self._grace_ran_out(body)
        except asyncio.CancelledError:  # stopped at once (the driver's second SIGTERM, Ctrl-C): a stop too
            self._cancelled = True
            raise
        finally:
            # stopped early: the train pump goes first, else it would begin the next save after the abort
            # one abort deadline for all of it (from the grace running out, or from here)
            for task in (body, watch, train):
                if task is not None:
                    task.cancel()
            await self._settle(body, watch, train, until=self._abort_deadline())
            await self._abort_save_in_flight(until=self._abort_deadline())  # only when stopped early
            rollout.cancel()
            await self._settle(rollout, until=self._abort_deadline())
            if self.replication is not None:  # a copy not committed by now stays uncommitted
                await self._settle(asyncio.ensure_future(self.replication.close()), until=self._abort_deadline())
        return RunSummary(
            step=self.state.step,
            policy_sha256=await self.trainer.policy_sha256(),
            reward=self.last_reward,
            resumed_from=self.resumed_from,
            trained_draws=self.trained_draws,
            unconsumed_draws=await self._unconsumed_draws(),
            drawn=self.state.draws,
            saves=[vars(r) for r in self.saves],
            steps_run=self.state.step - start,
            start_policy_sha256=start_sha,
            stop_reason=self._stop.reason if self._stop and self.state.step < self.config.steps else "completed",
            last_committed_step=self._committed_step,
            replicated=list(self.replication.replicated) if self.replication else [],
            replication_failed=dict(self.replication.failed) if self.replication else {},
        )

    async def _to_the_end(self, rollout: asyncio.Task[None], train: asyncio.Task[None]) -> None:
        """The run's body: the pumps until the train pump is done (or one fails), then its end."""
        done, _ = await asyncio.wait({rollout, train}, return_when=asyncio.FIRST_COMPLETED)
        if rollout in done and rollout.exception() is not None:
            raise rollout.exception()  # type: ignore[misc]
        await train
        await self._end_of_run()  # the last save commits before the run ends (rollouts still flow)

    # --- stopping early ----------------------------------------------------------------------------

    @property
    def committed_step(self) -> int | None:
        """The resume point the run would leave now (None: no bundle)."""
        return self._committed_step

    def request_stop(self, request: StopRequest, detail: str = "") -> None:
        """Save and stop at the next safe point (module doc). The first request counts; its grace
        period starts now. ``detail`` (why, in numbers) goes to the log and the run's ``stop`` event."""
        if self._stop is not None:
            return
        self._stop = request
        self._end_grace_in(request.grace_s)
        self._stop_requested.set()
        logger.warning(
            "stop requested (%s) at step %d: saving at the next safe point, %.0fs grace%s",
            request.reason,
            self.state.step,
            request.grace_s,
            f"; {detail}" if detail else "",
        )
        event = {"event": "stop", "reason": request.reason, "step": self.state.step, "grace_s": request.grace_s}
        self.on_event({**event, "detail": detail} if detail else event)

    async def _end_of_run(self) -> None:
        """The save in flight commits; a run stopped before its last step then takes its final save
        when one is needed (never twice: a save in flight of the step reached is the final save)."""
        if self._stop is None or self.state.step >= self.config.steps:
            await self._join_save_in_flight()
            await self._wait_for_replication()
            return
        await self._finish_save_in_flight_if_it_fits()
        if self._final_save_needed():
            await self._final_save(self.state.step)
        else:
            self._stop_committed()
        logger.warning(
            "stopped (%s) at step %d; resume point: %s", self._stop.reason, self.state.step, self._committed_step
        )
        await self._wait_for_replication()  # within the grace period: the local tier holds the resume point

    def _stop_committed(self) -> None:
        """The stop's "committed" phase begins: the step reached is the resume point; what is left (retention,
        the replication wait) loses nothing if it is cut short."""
        self.on_event({"event": "stop_committed", "step": self.state.step, "last_committed_step": self._committed_step})

    async def _finish_save_in_flight_if_it_fits(self) -> None:
        """The save in flight is finished first if the final save still has its estimated time in the
        grace period after it; else it is aborted (the final save holds the newer state)."""
        task, step = self._save_in_flight, self._save_in_flight_step
        if task is None or step == self.state.step:  # none, or it is the final save itself
            await self._join_save_in_flight()
            return
        budget = self._grace_left() - self._save_times.estimate()
        done, _ = await asyncio.wait({task}, timeout=max(budget, 0.0))
        if done:
            await self._join_save_in_flight()
            return
        logger.warning(
            "the save of step %d in flight does not fit the grace period before the final save of step %d "
            "(%.1fs left, a save takes %s): aborting it",
            step,
            self.state.step,
            self._grace_left(),
            self._save_times.describe(),
        )
        await self._abort_save_in_flight()
        self.on_event({"event": "save", "step": step, "save_error": "aborted: it did not fit the grace period"})

    async def _final_save(self, step: int) -> None:
        """The save of the step reached, awaited whole (the grace period bounds it up to its COMMIT);
        retention after. A failure raises SaveFailedError whatever ``save_failure`` says: there is no
        next step to go on to."""
        waits_before = len(self.replay.barrier.stats().mutation_waits)
        try:
            pending = await start_save(self.save_parts, step, upload_timing=self.config.upload_timing)
            report = await self._commit(pending)
        except Exception as exc:
            logger.error("final save of step %d failed: %s: %s", step, type(exc).__name__, exc)
            raise SaveFailedError(f"final save of step {step} to {self.store.url} failed: {exc}") from exc
        saved = self._committed(report, waits_before, last=True)
        self.on_event({"event": "save", "step": step, "reward": self.last_reward, **saved})
        self._stop_committed()
        await pending.retain()

    async def _within_grace(self, body: asyncio.Task[None]) -> bool:
        """Wait for the run's body; False when a stop's grace period runs out first."""
        while not body.done():
            self._grace_moved.clear()
            moved = asyncio.ensure_future(self._grace_moved.wait())
            timeout = None if self._grace is None else self._grace.left()
            try:
                await asyncio.wait({body, moved}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                moved.cancel()
            if not body.done() and self._grace is not None and self._grace.left() == 0:
                return False
        return True

    def _abort_deadline(self) -> float:
        """Until when the end of the run waits for what it cancelled: ``stop_abort_s`` after it first asks
        when the run is stopping (a stop request, a cancel); else (it failed) until it is over, as ever."""
        if self._stop is None and not self._cancelled:
            return math.inf
        if self._abort_by is None:
            self._abort_by = asyncio.get_running_loop().time() + self.config.stop_abort_s
        return self._abort_by

    def _end_grace_in(self, seconds: float) -> None:
        """The grace period ends ``seconds`` from now (set by a stop request)."""
        self._grace = GracePeriod(seconds, asyncio.get_running_loop().time)
        self._grace.start()
        self._grace_moved.set()

    async def _grace_ran_out(self, body: asyncio.Task[None]) -> None:
        """The grace period ended the run: its body is cancelled (the save in flight aborted). Fine if the
        final save had committed (only its retention or the replication wait was cut short), else
        FinalSaveAbortedError. A save whose storage does not answer is not waited for past ``stop_abort_s``:
        it is left behind, and ``rlckpt gc`` removes what it leaves."""
        assert self._stop is not None, "the grace period is armed by a stop request"
        body.cancel()
        left_behind = await self._settle(body, until=self._abort_deadline())
        if not self._final_save_needed():
            logger.warning("the grace period ran out; step %d needs no save", self.state.step)
            return
        last = "none" if self._committed_step is None else f"step {self._committed_step}"
        aborted = (
            f"its save was abandoned, its store not answering within {self.config.stop_abort_s:.0f}s (nothing of it "
            "is committed; `rlckpt gc` removes what it wrote)"
            if left_behind
            else "its save was aborted (nothing of it is committed)"
        )
        raise FinalSaveAbortedError(
            f"{self._stop.reason}: step {self.state.step} was not saved within the {self._stop.grace_s:.0f}s grace "
            f"period; {aborted} and the newest bundle is {last}",
            reason=self._stop.reason,
            last_committed_step=self._committed_step,
        )

    async def _settle(self, *tasks: asyncio.Future[Any] | None, until: float | None = None) -> list[str]:
        """Wait for ``tasks`` (cancelled by the caller) to end, but not past event-loop time ``until``
        (default: ``stop_abort_s`` from now; ``math.inf``: until they end): a task whose thread waits on
        storage that does not answer is left behind, to end with the process. The names of those."""
        loop = asyncio.get_running_loop()
        waiting = [task for task in tasks if task is not None and not task.done()]
        if waiting:
            until = loop.time() + self.config.stop_abort_s if until is None else until
            await asyncio.wait(waiting, timeout=None if until == math.inf else max(0.0, until - loop.time()))
        for task in tasks:
            if task is not None and task.done() and not task.cancelled():
                task.exception()  # retrieved: the outcome that matters is raised elsewhere
        left = [
            task.get_name() if isinstance(task, asyncio.Task) else repr(task) for task in waiting if not task.done()
        ]
        if left:
            logger.warning(
                "stopping: %s did not end within %.0fs; left behind", ", ".join(left), self.config.stop_abort_s
            )
        return left

    def _final_save_needed(self) -> bool:
        """The step reached is not committed yet and is not step 0 (a fresh start is the same)."""
        return self.state.step > 0 and self._committed_step != self.state.step

    def _saving(self) -> bool:
        """A save is still being written (a finished one stays in ``_save_in_flight`` until joined)."""
        return self._save_in_flight is not None and not self._save_in_flight.done()

    def _grace_left(self) -> float:
        left = None if self._grace is None else self._grace.left()
        return math.inf if left is None else left

    def _train_step_ended(self) -> None:
        """A step ended: the deadline is re-planned now (in the train pump, so a stop it calls for
        comes before the next step), and its watch wakes."""
        if self._deadline is not None:
            self._deadline.step_finished(self.clock())
            self._check_deadline(self._deadline)
        self._step_ended.set()

    def _check_deadline(self, plan: DeadlinePlan) -> bool:
        """Request the deadline's stop when the time left is what stopping costs; True once stopping."""
        if self._stop is not None:
            return True
        now, in_flight = self.clock(), self._saving()
        if not plan.due(now, in_flight):
            return False
        self.request_stop(StopRequest("deadline", self.config.grace_s), detail=plan.explain(now, in_flight))
        return True

    async def _watch_deadline(self) -> None:
        """Between steps (a long wait for rollouts, a save the train pump waits for), the deadline's
        stop still comes on time: re-planned at every step and at least every DEADLINE_RECHECK_S."""
        plan = self._deadline
        assert plan is not None
        plan.step_finished(self.clock())  # the first step is timed from the start of the run
        while True:
            self._step_ended.clear()
            if self._check_deadline(plan):
                return
            left = plan.seconds_until_stop(self.clock(), self._saving())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._step_ended.wait(), timeout=min(left, DEADLINE_RECHECK_S))

    # --- rollout pump ------------------------------------------------------------------------------

    async def _rollout_pump(self) -> None:
        cfg = self.config
        restored = [g.group_id for g in self.replay.pending_groups()]
        if restored:  # reserved before the save, never committed: generate them again
            logger.info("regenerating %d groups that were in flight at the save", len(restored))
            await self._generate_and_commit(restored)
        while True:  # runs ahead of the trainer by at most max_ahead steps; cancelled at the end
            batch_step = self.state.next_batch_step
            oldest = batch_step - cfg.max_ahead  # the oldest weights this batch may be generated with
            await self._wait(functools.partial(self._generated_with_at_least, oldest))
            if self._stop is not None:  # no new batch: what is in flight now is what the final save holds
                return
            group_ids = self._draw_and_reserve(batch_step)
            if self.before_generate is not None:
                await self.before_generate(batch_step)
            await self._generate_and_commit(group_ids)

    def _draw_and_reserve(self, batch_step: int) -> list[str]:
        """Draw one batch and reserve its groups in one synchronous step (no await inside)."""
        group_ids = []
        for prompt in self.loader.next_batch():
            gid = self.replay.reserve(weight_version=self.gen_version, target_step=batch_step)
            self.state.pending[gid] = {"draw_seq": self.state.draws, "prompt_id": prompt.prompt_id}
            self.state.draws += 1
            group_ids.append(gid)
        self.state.next_batch_step = batch_step + 1
        return group_ids

    async def _generate_and_commit(self, group_ids: Sequence[str]) -> None:
        prompts = [self.task.prompt(self.state.pending[g]["prompt_id"]) for g in group_ids]
        rows = await self.generator.generate(prompts)
        size = self.config.grpo.group_size
        for i, gid in enumerate(group_ids):
            group_rows = [
                self._to_tensors(r, self.state.pending[gid]["draw_seq"]) for r in rows[i * size : (i + 1) * size]
            ]
            version = int(group_rows[0]["weight_version"])
            await self.replay.commit(gid, group_rows, start_weight=version, end_weight=version)
            del self.state.pending[gid]  # no await since commit returned: atomic with the index update

    @staticmethod
    def _to_tensors(row: dict[str, Any], draw_seq: int) -> dict[str, torch.Tensor]:
        out = {k: row[k] for k in ("prompt", "completion", "logprobs", "reward")}
        for name in ("prompt_id", "sample_index", "weight_version"):
            out[name] = torch.tensor([int(row[name])], dtype=torch.int64)
        out["draw_seq"] = torch.tensor([draw_seq], dtype=torch.int64)
        return out

    # --- train pump --------------------------------------------------------------------------------

    async def _train_pump(self) -> None:
        cfg = self.config
        while self.state.step < cfg.steps and self._stop is None:
            self._raise_background_failure()  # an async save that failed stops the run here (save_failure=stop)
            k = self.state.step
            groups = await self._take_unless_stopped(k)
            if groups is None:
                break
            batch, draws = await self._advantage_stage(groups)
            metrics = await self.trainer.train_step(batch)
            for g in groups:
                await self.replay.remove_group(g.group_id)
            self.trained_draws.extend(draws)
            weights, version = await self.trainer.weights()
            await self.generator.set_weights(weights, version)
            async with self._progress:
                self.state.step = version
                self.gen_version = version
                self._progress.notify_all()
            self.last_reward = metrics["mean_reward"]
            self.last_loss = metrics["loss"]
            event = {"event": "step", "step": version, "reward": metrics["mean_reward"], "loss": metrics["loss"]}
            if version % cfg.save_every == 0 or version == cfg.steps:
                event.update(await self._save(version))
            self.on_event(event)
            self._train_step_ended()

    async def _take_unless_stopped(self, step: int) -> list[GroupRecord] | None:
        """The groups step ``step`` trains on, or None when a stop is requested first: waiting for
        rollouts is a safe point (nothing of the step has begun; a cancelled take takes nothing)."""
        take = asyncio.ensure_future(self.replay.take(self.config.grpo.prompts_per_step, target_step=step))
        stop = asyncio.ensure_future(self._stop_requested.wait())
        try:
            await asyncio.wait({take, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (take, stop):
                waiting.cancel()
            await asyncio.gather(take, stop, return_exceptions=True)
        if self._stop is None:
            return take.result()
        if not take.cancelled() and take.exception() is None:  # taken in the same instant: give them back
            self.replay.untake(g.group_id for g in take.result())
        return None

    async def _advantage_stage(self, groups: Sequence[Any]) -> tuple[TrainBatch, list[int]]:
        """Read rewards, write group-normalized ``advantages`` onto the same keys, read the rows back."""
        size = self.config.grpo.group_size
        rewards = (await self.replay.read_groups(groups, fields=["reward"]))["reward"].reshape(len(groups), size)
        advantages = grouped_advantages(rewards.float())
        for i, g in enumerate(groups):
            await self.replay.write_fields(g.group_id, {"advantages": advantages[i].reshape(size, 1).contiguous()})
        data = await self.replay.read_groups(groups)
        rows = []
        for i in range(len(groups) * size):
            row: dict[str, Any] = {f: data[f][i] for f in ("prompt", "completion", "logprobs", "reward", "advantages")}
            row.update({f: int(data[f][i].reshape(-1)[0]) for f in ROW_ID_FIELDS})
            rows.append(row)
        draws = sorted({row["draw_seq"] for row in rows})
        return TrainBatch.from_rows(rows), draws

    async def _save(self, step: int) -> dict[str, Any]:
        """Start the save of ``step``; the train pump waits only for its foreground (policy staging and
        the window) when saves are async, else for the whole save. At most one save is in flight: one
        that comes due while the previous is still writing waits for it (the wait is in the event)."""
        out: dict[str, Any] = {}
        if self._save_in_flight is not None:
            waited = time.perf_counter()
            await self._join_save_in_flight()
            out["save_wait_s"] = time.perf_counter() - waited
        stats = self.replay.barrier.stats()
        try:
            pending = await start_save(self.save_parts, step, upload_timing=self.config.upload_timing)
        except Exception as exc:
            return {**out, **self._save_failed(step, exc)}
        out["save_downtime_s"] = pending.foreground_s
        finish = self._finish_save(pending, len(stats.mutation_waits))
        if self.config.async_saves:
            self._save_in_flight = asyncio.create_task(self._background(finish, step), name=f"save-{step}")
            self._save_in_flight_step = step
            out["save_started"] = step
            return out
        return {**out, **await finish}

    async def _finish_save(self, pending: PendingSave, waits_before: int) -> dict[str, Any]:
        step = pending.step
        try:
            report = await self._commit(pending)
        except Exception as exc:
            return self._save_failed(step, exc)
        # recorded before retention: a stop may end the run during it
        result = self._committed(report, waits_before, last=step == self.config.steps)
        await pending.retain()
        return result

    async def _commit(self, pending: PendingSave) -> SaveReport:
        """``pending.commit()``; a cancel (a stop at once, the grace period) that came while its COMMIT
        call ran, and found it committed, still makes that step the resume point before it goes on."""
        try:
            return await pending.commit()
        except asyncio.CancelledError:
            if pending.committed:
                self._committed_step = pending.step
            raise

    def _committed(self, report: SaveReport, waits_before: int, last: bool = False) -> dict[str, Any]:
        """Record a committed save (the run's resume point, and the next save's estimate) and replicate it when
        due (`last`: the run's last save); its event fields."""
        self.saves.append(report)
        self._committed_step = report.step
        self._save_times.record(report.total_s)
        self._replicate_if_due(report.step, last)
        waits = self.replay.barrier.stats().mutation_waits[waits_before:]
        return {
            "saved": report.step,
            "save_s": report.total_s,
            "window_s": report.window_s,
            "stall_max_s": max(waits, default=0.0),
        }

    async def _background(self, finish: Awaitable[dict[str, Any]], step: int) -> None:
        """An async save's rest, beside training; its outcome is reported as its own ``save`` event."""
        try:
            result = await finish
        except SaveFailedError as exc:  # --save-failure stop: the train pump raises it at its next step
            self._background_failure = exc
            result = {"save_error": str(exc.__cause__ or exc)}
        self.on_event({"event": "save", "step": step, "reward": self.last_reward, **result})

    async def _join_save_in_flight(self) -> None:
        """Wait for the save in flight (if any) to commit or fail; a failure that stops the run raises."""
        task = self._save_in_flight
        if task is not None:
            await asyncio.shield(task)  # cancelling the waiter must not cancel the save: the abort does that
            self._save_in_flight = self._save_in_flight_step = None  # only once it ended: a stop still aborts it
        self._raise_background_failure()

    def _raise_background_failure(self) -> None:
        failure, self._background_failure = self._background_failure, None
        if failure is not None:
            raise failure

    async def _abort_save_in_flight(self, until: float | None = None) -> None:
        """The run stops early (failure, cancel, SIGTERM): the save in flight is cancelled, which aborts
        its transaction — nothing is committed and the newest committed bundle stays the resume point.
        Waited for until event-loop time ``until`` at most (default ``stop_abort_s``: its store may not answer)."""
        task, self._save_in_flight, self._save_in_flight_step = self._save_in_flight, None, None
        if task is not None and not task.done():
            logger.warning("run stopping with a save in flight: aborting it (nothing of it is committed)")
            task.cancel()
            await self._settle(task, until=until)

    def _save_failed(self, step: int, exc: BaseException) -> dict[str, Any]:
        """``--save-failure stop`` raises SaveFailedError; ``continue`` reports it and goes on."""
        logger.error("save of step %d failed: %s: %s", step, type(exc).__name__, exc)
        if self.config.save_failure == "stop":
            raise SaveFailedError(f"save of step {step} to {self.store.url} failed: {exc}") from exc
        return {"save_error": f"{type(exc).__name__}: {exc}"}

    # --- helpers -----------------------------------------------------------------------------------

    def _generated_with_at_least(self, version: int) -> bool:
        return self.gen_version >= version

    async def _wait(self, predicate: Callable[[], bool]) -> None:
        async with self._progress:
            await self._progress.wait_for(predicate)

    async def _unconsumed_draws(self) -> list[int]:
        """Draws still waiting to be trained: committed groups' rows plus reserved groups."""
        out = [v["draw_seq"] for v in self.state.pending.values()]
        committed = [g for g in self.replay.groups() if g.committed]
        if committed:
            data = await self.replay.read_groups(committed, fields=["draw_seq"])
            out.extend(int(x) for x in data["draw_seq"].reshape(-1).unique().tolist())
        return sorted(out)
