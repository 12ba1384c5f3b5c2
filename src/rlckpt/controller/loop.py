"""The controller's event loop: a rollout pump and a train pump over the replay buffer.

Rollout pump: draw a prompt batch and reserve its groups (one synchronous step, so a checkpoint
never sees a drawn prompt without its reservation) → generate → commit each group through the
replay buffer. Train pump: take the groups of step k → advantage stage (read rewards, write
``advantages`` onto the same keys) → train → remove the groups → sync weights → save every
``save_every`` steps and at the last step.

Rollout orders: ``in_order`` — batch k is generated with weights k and trained at step k (deterministic);
``async`` — batch k may be generated with weights as old as k − max_staleness while the trainer
works (bounded staleness). In both, every drawn prompt is trained exactly once, across restarts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.row_copy import RowCopier
from rlckpt.checkpoint.save import PendingSave, SaveHook, SaveParticipants, SaveReport, start_save
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.handles import Generator, Trainer
from rlckpt.controller.loop_state import LoopState
from rlckpt.errors import CheckpointError
from rlckpt.grpo import DigitSumTask, PromptLoader, TrainBatch, grouped_advantages, weights_sha256
from rlckpt.replay import ReplayBuffer
from rlckpt.store import BundleStore

logger = logging.getLogger(__name__)

ROW_ID_FIELDS = ("prompt_id", "sample_index", "weight_version", "draw_seq")


class SaveFailedError(CheckpointError):
    """A periodic save failed and the run is configured to stop (``save_failure='stop'``)."""


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
        self._progress = asyncio.Condition()
        self.save_parts = SaveParticipants(
            store=store,
            policy=trainer,
            replay=replay,
            capture_loader_state=lambda: self.state.to_state(self.loader),
            rollout_order=config.rollout_order,
            staging_root=config.staging_dir,
            compress_data_plane=config.compress_data_plane,
            keep_last=config.keep_last,
            extra_metadata={
                "task": repr(task),
                "steps_target": config.steps,
                layout.META_TRAINER_RANKS: trainer.world_size,
            },
            before_commit=before_commit,
            row_copier=row_copier,
        )
        self._save_in_flight: asyncio.Task[None] | None = None
        self._background_failure: SaveFailedError | None = None

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
        rollout = asyncio.create_task(self._rollout_pump(), name="rollout-pump")
        train = asyncio.create_task(self._train_pump(), name="train-pump")
        try:
            done, _ = await asyncio.wait({rollout, train}, return_when=asyncio.FIRST_COMPLETED)
            if rollout in done and rollout.exception() is not None:
                raise rollout.exception()  # type: ignore[misc]
            await train
            await self._join_save_in_flight()  # the last save commits before the run ends (rollouts still flow)
        finally:
            # stopped early: the train pump goes first, else it would begin the next save after the abort
            train.cancel()
            await asyncio.gather(train, return_exceptions=True)
            await self._abort_save_in_flight()  # only when stopped early: nothing half-committed is left
            rollout.cancel()
            await asyncio.gather(rollout, return_exceptions=True)
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
        )

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
            group_ids = self._draw_and_reserve(batch_step)
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
        while self.state.step < cfg.steps:
            self._raise_background_failure()  # an async save that failed stops the run here (save_failure=stop)
            k = self.state.step
            groups = await self.replay.take(cfg.grpo.prompts_per_step, target_step=k)
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
            event = {"event": "step", "step": version, "reward": metrics["mean_reward"], "loss": metrics["loss"]}
            if version % cfg.save_every == 0 or version == cfg.steps:
                event.update(await self._save(version))
            self.on_event(event)

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
            out["save_started"] = step
            return out
        return {**out, **await finish}

    async def _finish_save(self, pending: PendingSave, waits_before: int) -> dict[str, Any]:
        step = pending.step
        try:
            report = await pending.finish()
        except Exception as exc:
            return self._save_failed(step, exc)
        self.saves.append(report)
        waits = self.replay.barrier.stats().mutation_waits[waits_before:]
        return {
            "saved": step,
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
            self._save_in_flight = None  # only once it ended: a run stopped while waiting still aborts it
        self._raise_background_failure()

    def _raise_background_failure(self) -> None:
        failure, self._background_failure = self._background_failure, None
        if failure is not None:
            raise failure

    async def _abort_save_in_flight(self) -> None:
        """The run stops early (failure, cancel, SIGTERM): the save in flight is cancelled, which aborts
        its transaction — nothing is committed and the newest committed bundle stays the resume point."""
        task, self._save_in_flight = self._save_in_flight, None
        if task is not None and not task.done():
            logger.warning("run stopping with a save in flight: aborting it (nothing of it is committed)")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

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
