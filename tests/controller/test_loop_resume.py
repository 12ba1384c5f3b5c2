"""The controller loop in-process (no Ray, in-memory data plane): resume is exact with the in_order
rollout order, and with async every drawn prompt is trained exactly once across a restart."""

import asyncio
import shutil

import pytest

from rlckpt.controller import loop as loop_module
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.ranks.trainer_group import StagedRankPolicy
from rlckpt.errors import SaveFailedError
from rlckpt.grpo import (
    DigitSumTask,
    GenerationWorker,
    GRPOConfig,
    PromptLoader,
    Trainer,
    run_steps,
)
from rlckpt.store import BundleStore
from rlckpt.store.paths.paths import step_dirname
from support.controller import InProcessRun, run_in_process

SMALL = GRPOConfig(group_size=4, prompts_per_step=4)


def _run(run_dir: str, steps: int, **kw):
    config = TrainConfig(run_dir=run_dir, steps=steps, save_every=2, grpo=SMALL, **kw)
    return asyncio.run(run_in_process(config)).summary


def test_in_order_matches_the_plain_grpo_reference_loop(tmp_path):
    summary = _run(str(tmp_path / "run"), 6)
    task = DigitSumTask(seed=0, num_prompts=64)
    trainer = Trainer(SMALL)
    run_steps(trainer, GenerationWorker(SMALL, task), PromptLoader(task, SMALL.prompts_per_step, seed=SMALL.seed), 6)
    assert summary.policy_sha256 == trainer.policy_sha256()


def test_in_order_resume_is_bit_exact(store_location, tmp_path):
    url, options = store_location
    straight = _run(str(tmp_path / "straight"), 8)
    first = _run(url, 4, storage_options=options)
    resumed = _run(url, 8, storage_options=options)
    assert first.step == 4 and resumed.resumed_from == 4
    assert resumed.policy_sha256 == straight.policy_sha256
    assert first.trained_draws + resumed.trained_draws == straight.trained_draws


@pytest.fixture(scope="module")
def straight_to_8(tmp_path_factory):
    """One uninterrupted run to step 8 with async, pinned saves (the defaults) at 2, 4, 6 and 8."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    return run_dir, _run(str(run_dir), 8)


@pytest.mark.parametrize("resume_from", [2, 4, 6])
def test_in_order_resume_from_any_bundle_of_a_run_ends_bit_identical(straight_to_8, tmp_path, resume_from):
    straight_dir, straight = straight_to_8
    run_dir = tmp_path / "run"
    shutil.copytree(straight_dir, run_dir)
    for newer in range(resume_from + 2, 9, 2):  # as if the run had been killed right after `resume_from`
        shutil.rmtree(run_dir / step_dirname(newer))
    resumed = _run(str(run_dir), 8)
    assert resumed.resumed_from == resume_from
    assert resumed.policy_sha256 == straight.policy_sha256
    assert BundleStore(str(run_dir)).steps() == [2, 4, 6, 8]


def test_async_restart_trains_every_drawn_prompt_exactly_once(tmp_path):
    run_dir = str(tmp_path / "run")
    first = _run(run_dir, 4, rollout_order="async", max_staleness=2)
    second = _run(run_dir, 8, rollout_order="async", max_staleness=2)
    trained = first.trained_draws + second.trained_draws
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    assert sorted(trained + second.unconsumed_draws) == list(range(second.drawn)), "a prompt was lost"
    assert len(trained) == 8 * SMALL.prompts_per_step


def test_prompts_in_the_buffer_at_the_save_are_trained_after_resume(tmp_path):
    run_dir = str(tmp_path / "run")
    first = _run(run_dir, 4, rollout_order="async", max_staleness=2)
    second = _run(run_dir, 5, rollout_order="async", max_staleness=2)
    assert set(first.unconsumed_draws) <= set(second.trained_draws) | set(second.unconsumed_draws)
    assert not set(first.unconsumed_draws) & set(first.trained_draws)


def test_a_failed_save_stops_the_run_by_default(tmp_path, monkeypatch):
    async def broken(parts, step, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(loop_module, "start_save", broken)
    with pytest.raises(SaveFailedError, match="save of step 2 .* disk full"):
        _run(str(tmp_path / "run"), 4)


def test_a_failed_save_can_be_skipped_and_the_next_one_commits(tmp_path, monkeypatch):
    real = loop_module.start_save

    async def flaky(parts, step, **kw):
        if step == 2:
            raise OSError("disk full")
        return await real(parts, step, **kw)

    monkeypatch.setattr(loop_module, "start_save", flaky)
    summary = _run(str(tmp_path / "run"), 4, save_failure="continue")
    assert summary.step == 4
    assert BundleStore(str(tmp_path / "run")).steps() == [4]


def _policy_write_fails_at(monkeypatch, failing_step: int) -> None:
    """The background half of a save fails: writing the staged policy of ``failing_step`` raises."""
    real = StagedRankPolicy.write

    async def write(self, txn):
        if txn.step == failing_step:
            await real(self, txn)  # the ranks' own writes run to their end; then the write "fails"
            raise OSError("disk full")
        return await real(self, txn)

    monkeypatch.setattr(StagedRankPolicy, "write", write)


def test_an_async_save_failing_in_the_background_stops_the_run_and_commits_nothing(tmp_path, monkeypatch):
    _policy_write_fails_at(monkeypatch, 2)
    with pytest.raises(SaveFailedError, match="save of step 2 .* disk full"):
        _run(str(tmp_path / "run"), 6)
    store = BundleStore(str(tmp_path / "run"))
    assert store.steps() == []
    report = store.gc(dry_run=True, stale_after=0)
    assert report.removed == [] and report.skipped == []  # the transaction was aborted, not left behind


def test_an_async_save_failing_in_the_background_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    _policy_write_fails_at(monkeypatch, 2)
    events: list[dict] = []
    config = TrainConfig(run_dir=str(tmp_path / "run"), steps=4, save_every=2, grpo=SMALL, save_failure="continue")
    summary = asyncio.run(run_in_process(config, on_event=events.append)).summary
    assert summary.step == 4
    assert BundleStore(str(tmp_path / "run")).steps() == [4]
    failed = [e for e in events if e.get("event") == "save" and "save_error" in e]
    assert [e["step"] for e in failed] == [2] and "disk full" in failed[0]["save_error"]


def test_training_goes_on_while_an_async_save_is_written_and_the_next_save_waits_for_it(tmp_path):
    """Save 2 is held just before its COMMIT until the trainer has reached step 4: steps 3 and 4 train
    while it is in flight, and save 4 (due meanwhile) waits for it rather than running beside it."""
    run = InProcessRun()
    events: list[dict] = []

    async def hold(step: int) -> None:
        if step == 2:  # the train pump notifies every step; a pump that waited for save 2 never gets to 4
            await asyncio.wait_for(run.loop._wait(lambda: run.loop.state.step >= 4), timeout=120)

    config = TrainConfig(run_dir=str(tmp_path / "run"), steps=4, save_every=2, grpo=SMALL)
    asyncio.run(run_in_process(config, before_commit=hold, on_event=events.append, run=run))
    order = [(e["event"], e["step"] if e["event"] == "step" else e.get("saved")) for e in events]
    assert order.index(("step", 3)) < order.index(("save", 2))  # step 3 trained while save 2 was in flight
    step4 = next(e for e in events if e.get("event") == "step" and e["step"] == 4)
    assert step4["save_started"] == 4 and step4["save_wait_s"] > 0
    saved = [e["saved"] for e in events if e.get("event") == "save" and "saved" in e]
    assert saved == [2, 4]
    assert BundleStore(str(tmp_path / "run")).steps() == [2, 4]


@pytest.mark.parametrize("stop_at_step", [4, 6], ids=["while-training", "while-save-6-waits-for-it"])
def test_stopping_a_run_with_a_save_in_flight_aborts_it_and_keeps_the_previous_bundle(tmp_path, stop_at_step):
    run = InProcessRun()
    held = asyncio.Event()

    async def hold(step: int) -> None:
        if step == 4:
            held.set()
            await asyncio.Event().wait()  # never returns: the run is stopped while this save is in flight

    async def main() -> None:
        config = TrainConfig(run_dir=str(tmp_path / "run"), steps=6, save_every=2, grpo=SMALL)
        task = asyncio.create_task(run_in_process(config, before_commit=hold, run=run))
        await held.wait()
        await run.loop._wait(lambda: run.loop.state.step >= stop_at_step)  # 6: save 6 waits for save 4
        task.cancel()  # what SIGTERM / Ctrl-C amounts to in the controller
        with pytest.raises(asyncio.CancelledError):
            await task
        # checked before asyncio.run's shutdown would cancel anything left over
        left = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(("save-", "train-pump"))]
        assert left == []  # an orphaned train pump would go on to begin save 6 after save 4's abort
        store = BundleStore(str(tmp_path / "run"))
        assert store.steps() == [2]
        report = store.gc(dry_run=True, stale_after=0)
        assert report.removed == [] and report.skipped == []  # step 4's transaction was aborted, not left behind

    asyncio.run(main())


@pytest.mark.parametrize("upload_timing", ["staged", "pinned"])
def test_in_order_resume_is_bit_exact_with_synchronous_saves(tmp_path, upload_timing):
    straight = _run(str(tmp_path / "straight"), 8, async_saves=False, upload_timing=upload_timing)
    _run(str(tmp_path / "run"), 4, async_saves=False, upload_timing=upload_timing)
    resumed = _run(str(tmp_path / "run"), 8, async_saves=False, upload_timing=upload_timing)
    assert resumed.resumed_from == 4 and resumed.policy_sha256 == straight.policy_sha256


def test_a_run_already_at_its_target_resumes_and_trains_nothing(tmp_path):
    run_dir = str(tmp_path / "run")
    _run(run_dir, 2)
    resumed = _run(run_dir, 2)
    assert resumed.resumed_from == 2 and resumed.steps_run == 0


def test_fresh_over_committed_bundles_is_refused_before_anything_starts(tmp_path):
    from rlckpt.controller.setup import setup_single_controller
    from rlckpt.errors import CheckpointError

    run_dir = str(tmp_path / "run")
    _run(run_dir, 2)
    with pytest.raises(CheckpointError, match=r"--fresh but .* \(steps \[2\]\)"):
        setup_single_controller(TrainConfig(run_dir=run_dir, fresh=True))


def test_a_dataloader_state_of_another_format_is_refused():
    from rlckpt.controller.loop_state import LoopState
    from rlckpt.errors import LoaderStateError

    task = DigitSumTask(seed=0, num_prompts=64)
    loader = PromptLoader(task, SMALL.prompts_per_step, seed=0)
    state = LoopState(step=2).to_state(loader)
    assert LoopState.from_state(state, loader).step == 2
    with pytest.raises(LoaderStateError, match="format 99"):
        LoopState.from_state({**state, "format": 99}, loader)
