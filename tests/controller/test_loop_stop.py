"""Stopping a run early, in-process (no Ray, in-memory data plane): a stop request (what SIGTERM
becomes) or a deadline makes the run finish its step, save the step reached once and return; the
grace period running out, or a cancel (a second SIGTERM), aborts that save and keeps the previous
bundle. Every stop point is forced with a hold at the exact call, never a sleep."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rlckpt.controller.config import TrainConfig
from rlckpt.controller.ranks.trainer_group import LocalTrainerGroup
from rlckpt.controller.stopping import StopOutcome, StopRequest
from rlckpt.errors import FinalSaveAbortedError
from rlckpt.grpo import GRPOConfig
from rlckpt.store import BundleStore, BundleTransaction
from support.controller import InProcessRun, run_in_process
from support.pause import PauseAt
from support.store_checks import debris

SMALL = GRPOConfig(group_size=4, prompts_per_step=4)
LONG_GRACE = StopRequest("preempted", grace_s=600.0)  # never what ends a test: every stop here has its hold
SILENT_AT_MOST_S = 60.0  # a silent store answers after this anyway: a run that waits for it fails, not hangs


class Hold:
    """An async hook that holds the run at ``step`` (``reached`` is then set) until ``release()``."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.reached = asyncio.Event()
        self._go = asyncio.Event()

    async def __call__(self, step: int) -> None:
        if step == self.step:
            self.reached.set()
            await self._go.wait()

    def release(self) -> None:
        self._go.set()


def _config(url: str, steps: int, options: dict[str, Any] | None = None, **kw: Any) -> TrainConfig:
    return TrainConfig(
        run_dir=url, steps=steps, save_every=kw.pop("save_every", 2), grpo=SMALL, storage_options=options, **kw
    )


def _run(url: str, steps: int, options: dict[str, Any] | None = None, **kw: Any):
    return asyncio.run(run_in_process(_config(url, steps, options, **kw))).summary


async def _stopped_at(
    config: TrainConfig,
    reached: Callable[[InProcessRun], Awaitable[Any]],
    stop: StopRequest = LONG_GRACE,
    **hooks: Any,
) -> InProcessRun:
    """Run ``config`` in-process, request ``stop`` once ``reached(run)`` returns, and wait for the run."""
    run = InProcessRun()
    task = asyncio.create_task(run_in_process(config, run=run, **hooks))
    await reached(run)
    assert run.loop is not None
    run.loop.request_stop(stop)
    return await task


def _saved_steps(run: InProcessRun) -> list[int]:
    assert run.summary is not None
    return [save["step"] for save in run.summary.saves]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """0 → 8 uninterrupted with async, pinned saves: the reference for exact resume."""
    return _run(str(tmp_path_factory.mktemp("straight") / "run"), 8)


# --- where the stop lands ------------------------------------------------------------------------


def test_a_stop_while_rollouts_are_generated_saves_the_step_reached_and_resumes_bit_identical(store_location, straight):
    url, options = store_location
    generating = Hold(3)  # batch 3 drawn and in flight; the train pump has done step 3 and waits for it

    async def main() -> InProcessRun:
        return await _stopped_at(
            _config(url, 8, options), lambda run: generating.reached.wait(), before_generate=generating
        )

    first = asyncio.run(main())
    assert first.summary is not None
    assert (first.summary.stop_reason, first.summary.step, first.summary.last_committed_step) == ("preempted", 3, 3)
    store = BundleStore(url, options)
    assert store.steps() == [2, 3] and debris(store) == []

    resumed = _run(url, 8, options)
    assert resumed.resumed_from == 3 and resumed.stop_reason == "completed"
    assert resumed.policy_sha256 == straight.policy_sha256
    assert first.summary.trained_draws + resumed.trained_draws == straight.trained_draws


def test_a_stop_during_a_train_step_lets_that_step_finish_and_saves_it(tmp_path, monkeypatch):
    training = Hold(3)
    real = LocalTrainerGroup.train_step

    async def held_train_step(self, batch):
        await training(self.rank.trainer.weight_version + 1)  # the step this call makes
        return await real(self, batch)

    monkeypatch.setattr(LocalTrainerGroup, "train_step", held_train_step)

    async def main() -> InProcessRun:
        async def reached(run: InProcessRun) -> None:
            await training.reached.wait()
            asyncio.get_running_loop().call_soon(training.release)  # right after the stop request

        return await _stopped_at(_config(str(tmp_path / "run"), 8), reached)

    run = asyncio.run(main())
    assert run.summary is not None and run.summary.step == 3
    assert BundleStore(str(tmp_path / "run")).steps() == [2, 3]


def test_a_stop_during_a_saves_staging_lets_that_save_commit_and_takes_no_second_one(tmp_path, monkeypatch):
    staging = Hold(4)
    real = LocalTrainerGroup.stage_policy

    async def held_stage_policy(self):
        await staging(self.rank.trainer.weight_version)  # the step being saved
        return await real(self)

    monkeypatch.setattr(LocalTrainerGroup, "stage_policy", held_stage_policy)

    async def main() -> InProcessRun:
        async def reached(run: InProcessRun) -> None:
            await staging.reached.wait()
            asyncio.get_running_loop().call_soon(staging.release)

        return await _stopped_at(_config(str(tmp_path / "run"), 8), reached)

    run = asyncio.run(main())
    assert run.summary is not None and run.summary.step == 4
    assert _saved_steps(run) == [2, 4]  # the save of step 4 was the final one: not taken twice
    assert BundleStore(str(tmp_path / "run")).steps() == [2, 4]


def test_a_stop_during_a_background_upload_commits_that_save_first_then_saves_the_step_reached(tmp_path, straight):
    """Save 4 is held before its COMMIT while step 5 trains; the stop comes with both held. Save 4 is
    finished (not aborted, not repeated), then the final save of step 5 is the newest bundle."""
    run_dir = str(tmp_path / "run")
    uploading, generating = Hold(4), Hold(5)
    events: list[dict] = []

    async def main() -> InProcessRun:
        async def reached(run: InProcessRun) -> None:
            await uploading.reached.wait()
            await generating.reached.wait()
            asyncio.get_running_loop().call_soon(uploading.release)

        return await _stopped_at(
            _config(run_dir, 8), reached, before_commit=uploading, before_generate=generating, on_event=events.append
        )

    first = asyncio.run(main())
    assert first.summary is not None and first.summary.step == 5
    assert _saved_steps(first) == [2, 4, 5]
    committed = [e["saved"] for e in events if e.get("event") == "save" and "saved" in e]
    assert committed == [2, 4, 5]
    store = BundleStore(run_dir)
    assert store.steps() == [2, 4, 5] and debris(store) == []

    resumed = _run(run_dir, 8)
    assert resumed.resumed_from == 5 and resumed.policy_sha256 == straight.policy_sha256


def test_a_save_in_flight_that_does_not_fit_the_grace_period_is_aborted_and_the_final_save_commits(tmp_path):
    """No save measured yet, and one is assumed to take longer than the grace period: save 4 (held
    before its COMMIT) is not waited for; the final save of step 5 commits alone."""
    run_dir = str(tmp_path / "run")
    uploading, generating = Hold(4), Hold(5)  # save 4 is never released

    async def main() -> InProcessRun:
        async def reached(run: InProcessRun) -> None:
            await uploading.reached.wait()
            await generating.reached.wait()

        config = _config(run_dir, 8, save_every=4, unmeasured_save_s=1000.0)
        return await _stopped_at(config, reached, before_commit=uploading, before_generate=generating)

    run = asyncio.run(main())
    assert run.summary is not None and run.summary.step == 5 and run.summary.last_committed_step == 5
    store = BundleStore(run_dir)
    assert store.steps() == [5] and debris(store) == []


def test_a_stop_before_the_first_step_saves_nothing(tmp_path):
    generating = Hold(0)

    async def main() -> InProcessRun:
        return await _stopped_at(
            _config(str(tmp_path / "run"), 8), lambda run: generating.reached.wait(), before_generate=generating
        )

    run = asyncio.run(main())
    assert run.summary is not None
    assert (run.summary.step, run.summary.last_committed_step, run.summary.saves) == (0, None, [])
    assert BundleStore(str(tmp_path / "run")).steps() == []


# --- the final save, aborted ---------------------------------------------------------------------


def test_the_grace_period_running_out_aborts_the_final_save_and_keeps_the_previous_bundle(store_location):
    url, options = store_location
    generating, committing = Hold(3), Hold(3)  # the final save of step 3 is held before its COMMIT for good
    saved_2 = asyncio.Event()

    def on_event(event: dict) -> None:
        if event.get("saved") == 2:
            saved_2.set()

    async def main() -> None:
        async def reached(run: InProcessRun) -> None:
            await generating.reached.wait()
            await saved_2.wait()  # the grace is short: save 2 must not be the save it cuts

        with pytest.raises(
            FinalSaveAbortedError, match=r"step 3 was not saved within the 1s grace.*newest bundle is step 2"
        ) as caught:
            await _stopped_at(
                _config(url, 8, options),
                reached,
                stop=StopRequest("preempted", grace_s=1.0),
                before_generate=generating,
                before_commit=committing,
                on_event=on_event,
            )
        assert (caught.value.reason, caught.value.last_committed_step) == ("preempted", 2)
        assert _leftover_tasks() == []

    asyncio.run(main())
    store = BundleStore(url, options)
    assert store.steps() == [2] and debris(store) == []


def test_the_grace_period_ending_while_the_final_commit_runs_counts_the_step_saved(tmp_path):
    """The COMMIT call of the final save is held in its thread when the grace period ends. A thread
    cannot be stopped, and this one commits: the run says step 3 is saved, not aborted, and it is."""
    run_dir = str(tmp_path / "run")
    generating = Hold(3)
    saved_2 = asyncio.Event()

    def on_event(event: dict) -> None:
        if event.get("saved") == 2:
            saved_2.set()

    async def main() -> InProcessRun:
        run = InProcessRun()
        task = asyncio.create_task(
            run_in_process(_config(run_dir, 8), run=run, before_generate=generating, on_event=on_event)
        )
        await generating.reached.wait()
        await saved_2.wait()  # the next COMMIT call is the final save's
        with PauseAt(BundleTransaction, "commit") as committing:
            assert run.loop is not None
            run.loop.request_stop(LONG_GRACE)
            await asyncio.to_thread(committing.wait_reached)
            run.loop._end_grace_in(0)  # the grace ends here instead of waited for
            [body] = [t for t in asyncio.all_tasks() if t.get_name() == "run-body"]
            while body.cancelling() == 0:  # the grace has cancelled the run: the COMMIT call is still held
                await asyncio.sleep(0)
            committing.release()
            return await task

    run = asyncio.run(main())
    assert run.summary is not None
    assert (run.summary.stop_reason, run.summary.last_committed_step) == ("preempted", 3)
    store = BundleStore(run_dir)
    assert store.steps() == [2, 3] and debris(store) == []


class SilentStore:
    """``BundleStore.begin`` of the next save does not answer until ``answer()`` (a store that accepts the
    request and says nothing); ``answered`` is set once the call has returned."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.called, self.answered, self._back = threading.Event(), threading.Event(), threading.Event()
        real = BundleStore.begin

        def silent_begin(store: BundleStore, *args: Any, **kwargs: Any) -> Any:
            self.called.set()
            self._back.wait(SILENT_AT_MOST_S)
            try:
                return real(store, *args, **kwargs)
            finally:
                self.answered.set()

        self._install = lambda: monkeypatch.setattr(BundleStore, "begin", silent_begin)

    def from_now(self) -> None:
        self._install()

    def answer(self) -> None:
        self._back.set()


def test_a_final_save_whose_store_does_not_answer_is_abandoned_when_the_grace_ends(tmp_path, monkeypatch):
    """The final save's first storage call never returns while the store is silent. When the grace period
    ends, the run does not wait for the store: it raises FinalSaveAbortedError while that call is still
    unanswered (the store answers only after). Once it does, the abandoned save aborts: nothing is left."""
    run_dir = str(tmp_path / "run")
    generating, silent = Hold(3), SilentStore(monkeypatch)
    saved_2 = asyncio.Event()

    def on_event(event: dict) -> None:
        if event.get("saved") == 2:
            saved_2.set()

    async def main() -> None:
        run = InProcessRun()
        config = _config(run_dir, 8, stop_abort_s=0.2)
        task = asyncio.create_task(run_in_process(config, run=run, before_generate=generating, on_event=on_event))
        await generating.reached.wait()
        await saved_2.wait()
        silent.from_now()
        assert run.loop is not None
        run.loop.request_stop(LONG_GRACE)
        await asyncio.to_thread(silent.called.wait)
        run.loop._end_grace_in(0)
        with pytest.raises(FinalSaveAbortedError, match=r"step 3 was not saved.*abandoned.*newest bundle is step 2"):
            await task
        assert not silent.answered.is_set()  # the run ended while the store was still silent
        silent.answer()
        while leftovers := [t for t in asyncio.all_tasks() if t.get_name() == "run-body"]:
            await asyncio.wait(leftovers)  # the abandoned save ends once the store answers: it aborts

    asyncio.run(main())
    store = BundleStore(run_dir)
    assert store.steps() == [2] and debris(store) == []


def test_a_cancel_during_the_final_save_aborts_it_and_keeps_the_previous_bundle(store_location):
    """What a second SIGTERM does: the driver cancels the run while its final save is held before COMMIT."""
    url, options = store_location
    generating, committing = Hold(3), Hold(3)

    async def main() -> None:
        run = InProcessRun()
        config = _config(url, 8, options)
        task = asyncio.create_task(
            run_in_process(config, run=run, before_generate=generating, before_commit=committing)
        )
        await generating.reached.wait()
        assert run.loop is not None
        run.loop.request_stop(LONG_GRACE)
        await committing.reached.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _leftover_tasks() == []

    asyncio.run(main())
    store = BundleStore(url, options)
    assert store.steps() == [2] and debris(store) == []


def test_a_cancel_once_the_final_save_committed_leaves_the_step_reached_as_the_resume_point(tmp_path):
    """What a second SIGTERM does in the stop's "committed" phase: the final save of step 3 has committed
    and its retention is held; the driver cancels the run. Nothing is lost: the step reached is the
    newest committed step (StopOutcome.lost_nothing: the driver exits 0)."""
    run_dir = str(tmp_path / "run")
    generating = Hold(3)
    saved_2, committed = asyncio.Event(), asyncio.Event()

    def on_event(event: dict) -> None:
        if event.get("saved") == 2:
            saved_2.set()
        if event.get("event") == "stop_committed":
            committed.set()

    async def main() -> InProcessRun:
        run = InProcessRun()
        config = _config(run_dir, 8, keep_last=1)
        task = asyncio.create_task(run_in_process(config, run=run, before_generate=generating, on_event=on_event))
        await generating.reached.wait()
        await saved_2.wait()  # and its retention: the next one is the final save's
        with PauseAt(BundleStore, "gc") as retaining:
            assert run.loop is not None
            run.loop.request_stop(LONG_GRACE)
            await asyncio.wait_for(committed.wait(), 60)  # a run that never says so fails, not hangs
            await asyncio.to_thread(retaining.wait_reached)
            task.cancel()
            retaining.release()
            with pytest.raises(asyncio.CancelledError):
                await task
        return run

    run = asyncio.run(main())
    assert run.loop is not None
    outcome = StopOutcome(step=run.loop.state.step, last_committed_step=run.loop.committed_step)
    assert outcome == StopOutcome(step=3, last_committed_step=3) and outcome.lost_nothing
    assert 3 in BundleStore(run_dir).steps()


def _leftover_tasks() -> list[str]:
    """Tasks of the run still alive (checked before asyncio.run's shutdown would cancel them)."""
    names = ("save-", "train-pump", "rollout-pump", "deadline-watch", "run-body")
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(names)]


# --- deadlines -----------------------------------------------------------------------------------


def test_a_deadline_stops_the_run_with_one_save_at_the_last_step_that_leaves_time_for_it(tmp_path):
    """A step takes 100 s on the run's clock and a save is assumed to take 30 s (none measured: no
    periodic save comes before the deadline at 350 s). After step 2 (at 200 s) there is time for a
    step and a save; after step 3 (at 300 s) there is not: the run saves step 3 and stops."""
    run = InProcessRun()
    events: list[dict] = []

    def clock() -> float:
        assert run.loop is not None
        return 1000.0 + 100.0 * run.loop.state.step

    config = _config(str(tmp_path / "run"), 8, save_every=100, save_by=1350.0, unmeasured_save_s=30.0)
    asyncio.run(run_in_process(config, run=run, clock=clock, on_event=events.append))
    assert run.summary is not None
    assert (run.summary.stop_reason, run.summary.step, run.summary.last_committed_step) == ("deadline", 3, 3)
    assert _saved_steps(run) == [3]
    assert BundleStore(str(tmp_path / "run")).steps() == [3]
    [stop] = [e for e in events if e.get("event") == "stop"]
    assert stop["reason"] == "deadline" and stop["step"] == 3
    assert "50.0s to the deadline" in stop["detail"] and "30.0s, assumed: no save measured yet" in stop["detail"]


def test_a_deadline_that_comes_while_rollouts_are_awaited_stops_the_run_counting_only_saves_still_written(
    tmp_path,
):
    """The run waits for batch 3 (save 2 committed) when the clock reaches the deadline: no step ends,
    yet the stop comes, and its estimate counts the final save alone, not save 2 once more."""
    now = [1000.0]
    generating = Hold(3)
    saved_2 = asyncio.Event()
    events: list[dict] = []

    def on_event(event: dict) -> None:
        events.append(event)
        if event.get("saved") == 2:
            saved_2.set()

    async def main() -> InProcessRun:
        run = InProcessRun()
        config = _config(str(tmp_path / "run"), 8, save_by=2000.0)
        hooks = {"before_generate": generating, "on_event": on_event, "clock": lambda: now[0]}
        task = asyncio.create_task(run_in_process(config, run=run, **hooks))
        await generating.reached.wait()
        await saved_2.wait()
        now[0] = 2000.0  # the deadline: the run sees it at its next look, with no step to end
        return await task

    run = asyncio.run(main())
    assert run.summary is not None
    assert (run.summary.stop_reason, run.summary.step, run.summary.last_committed_step) == ("deadline", 3, 3)
    [stop] = [e for e in events if e.get("event") == "stop"]
    assert stop["step"] == 3 and "in flight" not in stop["detail"]


# --- with the other features ---------------------------------------------------------------------


def test_retention_keeps_the_final_bundle(tmp_path):
    generating = Hold(3)

    async def main() -> InProcessRun:
        config = _config(str(tmp_path / "run"), 8, keep_last=1)
        return await _stopped_at(config, lambda run: generating.reached.wait(), before_generate=generating)

    asyncio.run(main())
    assert BundleStore(str(tmp_path / "run")).steps() == [3]


@pytest.mark.parametrize("upload_timing", ["staged", "pinned"])
def test_a_stop_with_synchronous_saves_takes_the_final_save(tmp_path, upload_timing):
    generating = Hold(3)

    async def main() -> InProcessRun:
        config = _config(str(tmp_path / "run"), 8, async_saves=False, upload_timing=upload_timing)
        return await _stopped_at(config, lambda run: generating.reached.wait(), before_generate=generating)

    asyncio.run(main())
    store = BundleStore(str(tmp_path / "run"))
    assert store.steps() == [2, 3]
    store.open(3).verify()


def test_a_stop_with_the_async_rollout_order_loses_no_prompt_and_trains_none_twice(tmp_path):
    run_dir = str(tmp_path / "run")
    generating = Hold(6)  # up to 2 batches ahead: steps 1-5 train, then the train pump waits at step 5 or 6

    async def main() -> InProcessRun:
        config = _config(run_dir, 8, rollout_order="async", max_staleness=2)
        return await _stopped_at(config, lambda run: generating.reached.wait(), before_generate=generating)

    first = asyncio.run(main())
    assert first.summary is not None
    second = _run(run_dir, 8, rollout_order="async", max_staleness=2)
    assert second.resumed_from == first.summary.step
    trained = first.summary.trained_draws + second.trained_draws
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    assert sorted(trained + second.unconsumed_draws) == list(range(second.drawn)), "a prompt was lost"


def test_a_run_that_reaches_its_last_step_says_completed(tmp_path):
    summary = _run(str(tmp_path / "run"), 2)
    assert (summary.stop_reason, summary.last_committed_step) == ("completed", 2)
