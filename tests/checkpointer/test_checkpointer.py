"""The Checkpointer in one process (world size 1, no process group), on local disk and on S3 (moto): what a save
commits, what a restore chooses and loads, async saves with one in flight, and each failure mode of a call.
Its multi-rank behaviour (one rank failing, agreement, another world size) is in test_multi_rank.py."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed.checkpoint

from rlckpt import Checkpointer
from rlckpt.checkpointer import CheckpointerConfig
from rlckpt.checkpointer.record import CHECKPOINTER_BUNDLE_FORMAT, FORMAT_KEY
from rlckpt.checkpointer.saving import Saver
from rlckpt.errors import (
    BundleExistsError,
    BundleFormatError,
    CheckpointerError,
    CheckpointError,
    ExtraPieceError,
    SaveTimeoutError,
    UnsafeContentError,
)
from rlckpt.store import BundleStore, BundleTransaction, Retention, SigningKey
from support.checkpointer import FailingSavePlanner, Trainer
from support.dcp_ranks import bitwise_equal, quiet_dcp_warnings
from support.forge import copy_bundle, rewrite_run_record
from support.pause import Background, PauseAt
from support.store_checks import corrupt_file, debris

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def run(store_location):
    url, options = store_location
    return url, options


def _checkpointer(run, **settings) -> Checkpointer:
    url, options = run
    return Checkpointer(url, storage_options=options, **settings)


def _saved(run, steps=(2, 4), **settings) -> dict[int, dict[str, torch.Tensor]]:
    """Train and save at `steps` (blocking); the state saved at each."""
    trainer, saved = Trainer(), {}
    with _checkpointer(run, async_save=False, **settings) as ckpt:
        for step in steps:
            trainer.step(step)
            ckpt.save(step, trainer.state(), extra={"loader": {"position": step}})
            saved[step] = trainer.tensors()
    return saved


def _nested(levels: int) -> dict:
    deep: dict = {}
    for _ in range(levels - 1):
        deep = {"a": deep}
    return deep


def _store(run) -> BundleStore:
    url, options = run
    return BundleStore(url, options)


# --- what a save commits, what a restore loads -------------------------------------------------------


def test_a_restore_loads_the_state_pieces_metrics_and_metadata_of_the_save(run):
    trainer = Trainer()
    trainer.step(1)
    rng = torch.get_rng_state()
    with _checkpointer(run) as ckpt:
        ckpt.save(
            3,
            trainer.state(),
            extra={"loader": {"epoch": 1, "position": 24}, "seen": torch.arange(4)},
            rank_extra={"rng": rng},
            metrics={"loss": 0.25},
            metadata={"run": "exp-7"},
        )
        result = ckpt.wait()
    assert result is not None and result.step == 3 and result.world_size == 1
    fresh = Trainer(seed=99)
    with _checkpointer(run) as ckpt:
        restored = ckpt.restore(fresh.state())
    assert restored is not None and restored.step == 3 and restored.skipped == []
    assert bitwise_equal(fresh.tensors(), trainer.tensors()) == []
    assert restored.extra["loader"] == {"epoch": 1, "position": 24}
    assert torch.equal(restored.extra["seen"], torch.arange(4))
    assert torch.equal(restored.rank_extra["rng"], rng)
    assert restored.metrics == {"loss": 0.25} and restored.metadata == {"run": "exp-7"}
    assert restored.saved_world_size == 1


def test_the_bundle_is_committed_with_every_file_digested_and_its_record(run):
    _saved(run, steps=(2,))
    bundle = _store(run).open(2)
    bundle.verify()
    assert bundle.manifest.metadata[FORMAT_KEY] == CHECKPOINTER_BUNDLE_FORMAT
    assert {"state/.metadata", "extra/loader.json"} <= set(bundle.manifest.files)


def test_rlckpt_verify_names_a_checkpointer_bundle_and_its_own_format(tmp_path, capsys):
    from rlckpt.cli.main import main

    run = (str(tmp_path / "run"), None)
    _saved(run, steps=(2,))
    assert main(["verify", run[0]]) == 0
    assert f"checkpointer-bundle format {CHECKPOINTER_BUNDLE_FORMAT}, written by rlckpt" in capsys.readouterr().out


def test_a_run_without_a_committed_bundle_restores_nothing(run):
    with _checkpointer(run) as ckpt:
        assert ckpt.restore(Trainer().state()) is None


def test_a_restore_takes_the_newest_bundle(run):
    saved = _saved(run)
    fresh = Trainer(seed=99)
    with _checkpointer(run) as ckpt:
        restored = ckpt.restore(fresh.state())
    assert restored.step == 4 and restored.extra == {"loader": {"position": 4}}
    assert bitwise_equal(fresh.tensors(), saved[4]) == []


def test_a_newer_bundle_that_does_not_verify_is_skipped_and_named(run):
    saved = _saved(run)
    corrupt_file(_store(run), 4, "extra/loader.json", "flip")
    fresh = Trainer(seed=99)
    with _checkpointer(run) as ckpt:
        restored = ckpt.restore(fresh.state())
    assert restored.step == 2 and [s.step for s in restored.skipped] == [4]
    assert "extra/loader.json" in restored.skipped[0].reason
    assert bitwise_equal(fresh.tensors(), saved[2]) == []


def test_a_pinned_step_is_restored_exactly(run):
    saved = _saved(run)
    fresh = Trainer(seed=99)
    with _checkpointer(run) as ckpt:
        restored = ckpt.restore(fresh.state(), step=4)
    assert restored.step == 4 and restored.why == "the step asked for"
    assert bitwise_equal(fresh.tensors(), saved[4]) == []


def test_a_pinned_step_below_newer_bundles_is_refused(run):
    _saved(run)
    with _checkpointer(run) as ckpt, pytest.raises(CheckpointError, match=r"newer committed bundles \[4\]"):
        ckpt.restore(Trainer().state(), step=2)


def test_a_pinned_step_that_does_not_verify_is_refused_not_replaced(run):
    _saved(run)
    corrupt_file(_store(run), 4, "extra/loader.json", "flip")
    with _checkpointer(run) as ckpt, pytest.raises(CheckpointError, match="cannot resume step 4.*does not verify"):
        ckpt.restore(Trainer().state(), step=4)


def test_a_run_bundle_of_rlckpt_train_is_refused_by_name(run):
    with _store(run).begin(5) as txn:
        txn.write_bytes("policy/state.pt", b"x")
        txn.commit({"rlckpt_run_format": 3})
    with _checkpointer(run) as ckpt, pytest.raises(BundleFormatError, match="not a Checkpointer bundle"):
        ckpt.restore(Trainer().state())


class Boom:
    def __reduce__(self):
        return (print, ("code ran from a bundle",))


def test_a_piece_that_names_a_pickle_global_is_refused_at_the_restore_and_runs_nothing(run, capsys):
    _saved(run, steps=(2,))
    store = _store(run)
    good = store.open(2)
    evil = io.BytesIO()
    torch.save({"position": Boom()}, evil)
    with store.begin(6) as txn:  # someone who can write the run's storage commits a bundle of their own
        for rel in good.manifest.files:
            if rel != "extra/loader.json":
                txn.write_bytes(rel, good.read_bytes(rel))
        txn.write_bytes("extra/loader.pt", evil.getvalue())
        txn.commit({**good.manifest.metadata, "extra": {"loader": "pt"}})
    with _checkpointer(run) as ckpt, pytest.raises(CheckpointerError, match="reading the pieces of step 6") as caught:
        ckpt.restore(Trainer().state())
    assert isinstance(caught.value.__cause__, UnsafeContentError)
    assert "code ran" not in capsys.readouterr().out


# --- async saves ---------------------------------------------------------------------------------


def test_an_async_save_returns_before_its_commit_and_wait_returns_it(run):
    trainer = Trainer()
    with _checkpointer(run) as ckpt, PauseAt(BundleTransaction, "commit") as commit:
        assert ckpt.save(2, trainer.state()) is None  # returned while the commit is held
        commit.wait_reached()
        assert ckpt.saving and _store(run).steps() == []
        commit.release()
        result = ckpt.wait()
    assert result.step == 2 and _store(run).steps() == [2]
    assert ckpt.wait() is None  # its outcome was handed out already


def test_an_async_save_writes_the_state_as_it_was_when_save_returned(run):
    trainer = Trainer()
    trainer.step(1)
    before = trainer.tensors()
    with _checkpointer(run) as ckpt, PauseAt(torch.distributed.checkpoint, "save") as write:
        ckpt.save(2, trainer.state())
        write.wait_reached()  # nothing of the state is written yet
        trainer.step(2)  # training goes on, in place
        write.release()
        ckpt.wait()
    fresh = Trainer(seed=99)
    with _checkpointer(run) as ckpt:
        ckpt.restore(fresh.state())
    assert bitwise_equal(fresh.tensors(), before) == []


class _Said(logging.Handler):
    """Sets `said` once a log record holding `text` is emitted (from any thread)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.said = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.said.set()


def test_a_second_save_waits_for_the_one_in_flight_before_it_begins(run, caplog):
    trainer, said = Trainer(), _Said("waiting for the save of step 2 first")
    caplog.set_level(logging.INFO, logger="rlckpt.checkpointer")
    logging.getLogger("rlckpt.checkpointer").addHandler(said)
    try:
        with _checkpointer(run) as ckpt, PauseAt(BundleTransaction, "commit") as commit:
            ckpt.save(2, trainer.state())
            commit.wait_reached()
            second = Background(ckpt.save, 4, trainer.state())
            assert said.said.wait(60)  # the second save is waiting ...
            assert _store(run).read_intent(4) is None  # ... and has not begun its transaction
            commit.release()
            second.result()
            assert ckpt.wait().step == 4
    finally:
        logging.getLogger("rlckpt.checkpointer").removeHandler(said)
    assert _store(run).steps() == [2, 4]


def test_a_failure_in_the_background_raises_at_the_next_save_and_commits_nothing(run):
    trainer = Trainer()
    with _checkpointer(run, save_planner=FailingSavePlanner) as ckpt:
        ckpt.save(2, trainer.state())
        with pytest.raises(CheckpointerError, match="save of step 2 .* failed: .*injected: rank 0 fails to plan"):
            ckpt.save(4, trainer.state())
    assert _store(run).steps() == [] and debris(_store(run)) == []


def test_with_save_failure_log_a_background_failure_is_logged_and_the_next_save_goes_on(run, caplog):
    trainer = Trainer()
    planners = iter([FailingSavePlanner(), None])
    with _checkpointer(run, save_planner=lambda: next(planners), save_failure="log") as ckpt:
        ckpt.save(2, trainer.state())
        ckpt.save(4, trainer.state())
        assert ckpt.wait().step == 4
    assert _store(run).steps() == [4]
    assert "save_failure=log: going on" in caplog.text


def test_a_wait_that_times_out_abandons_the_save_and_commits_nothing(run):
    trainer = Trainer()
    with _checkpointer(run) as ckpt:
        with PauseAt(torch.distributed.checkpoint, "save") as write:
            ckpt.save(2, trainer.state())
            write.wait_reached()
            with pytest.raises(SaveTimeoutError, match="step 2 .* did not commit within 0.0s: aborted"):
                ckpt.wait(timeout=0)
        ckpt.close()  # the abandoned save's thread has ended
    assert _store(run).steps() == [] and debris(_store(run)) == []


def test_a_wait_that_times_out_as_rank_0_decides_to_commit_aborts_the_save(run, caplog):
    """The race `abandoned` settles: every rank has written and rank 0 is about to decide when the wait gives
    up. The abort it makes is what the decision then finds: no COMMIT, and the reason said."""
    trainer = Trainer()
    with _checkpointer(run) as ckpt:
        with PauseAt(Saver, "_commit_or_abort") as deciding:
            ckpt.save(2, trainer.state())
            deciding.wait_reached()
            with pytest.raises(SaveTimeoutError, match="step 2 .* aborted before its COMMIT"):
                ckpt.wait(timeout=0)
        ckpt.close()  # the decision ran, and the save's thread has ended
    assert "a wait for it timed out first (abandoned); nothing committed" in caplog.text
    assert _store(run).steps() == [] and debris(_store(run)) == []


def test_a_wait_that_times_out_once_the_commit_began_returns_the_committed_save(run):
    """The other side of the race: the wait gives up (``abandon``) while rank 0's COMMIT is held under way,
    so it finds the save committing, waits for that and returns its outcome; the COMMIT is let go only once
    the wait has given up, so the outcome cannot come the ordinary way first."""
    trainer = Trainer()
    with _checkpointer(run) as ckpt, PauseAt(BundleTransaction, "commit") as commit:
        ckpt.save(2, trainer.state())
        commit.wait_reached()  # COMMIT is under way
        with PauseAt(Saver, "abandon") as giving_up:
            waiting = Background(ckpt.wait, 0)
            giving_up.wait_reached()  # the wait timed out with the save still in flight
        commit.release()
        assert waiting.result().step == 2
    assert _store(run).steps() == [2]


# --- a save in flight when the Checkpointer ends --------------------------------------------------------


def _released_when_waited_for(ckpt: Checkpointer, write: PauseAt) -> None:
    """Hold the save's write until the Checkpointer's close waits for it: the race a raise right after
    `save()` makes, at its exact point (the save is still being written when the close begins)."""
    original = ckpt.wait

    def wait(timeout=None):
        write.release()
        return original(timeout)

    ckpt.wait = wait  # type: ignore[method-assign]


def test_a_save_in_flight_when_a_with_block_is_left_on_an_exception_is_finished_and_committed(run, caplog):
    trainer = Trainer()
    with PauseAt(torch.distributed.checkpoint, "save") as write:
        ckpt = _checkpointer(run)
        _released_when_waited_for(ckpt, write)
        with pytest.raises(ValueError, match="the forward of step 3 failed"), ckpt:
            ckpt.save(2, trainer.state())
            write.wait_reached()  # staged, not written yet
            raise ValueError("the forward of step 3 failed")
    assert _store(run).steps() == [2]
    assert (
        "leaving the Checkpointer on an error (ValueError: the forward of step 3 failed): finishing the save of "
        "step 2 first" in caplog.text
    )
    assert "the save of step 2 committed before the Checkpointer closed" in caplog.text


def test_a_save_that_fails_while_the_checkpointer_closes_on_an_error_is_logged_with_the_resume_point(run, caplog):
    trainer = Trainer()
    _saved(run, steps=(1,))
    with PauseAt(torch.distributed.checkpoint, "save") as write:
        ckpt = _checkpointer(run, save_planner=FailingSavePlanner)
        ckpt.committed_step = 1  # as a restore of step 1 would leave it
        _released_when_waited_for(ckpt, write)
        with pytest.raises(ValueError, match="boom"), ckpt:  # the error that led here is the one raised
            ckpt.save(2, trainer.state())
            write.wait_reached()
            raise ValueError("boom")
    assert _store(run).steps() == [1]
    assert "injected: rank 0 fails to plan its write" in caplog.text and "the resume point is step 1" in caplog.text


def test_ctrl_c_in_a_with_block_leaves_at_once_abandoning_the_save_in_flight(run, caplog):
    trainer = Trainer()
    with PauseAt(torch.distributed.checkpoint, "save") as write:
        ckpt = _checkpointer(run)
        with pytest.raises(KeyboardInterrupt), ckpt:
            ckpt.save(2, trainer.state())
            write.wait_reached()
            raise KeyboardInterrupt
    assert _store(run).steps() == []
    assert "closing the Checkpointer (interrupted)" in caplog.text and "did not commit within 0.0s" in caplog.text


_EXITS_WITH_A_SAVE_IN_FLIGHT = """
import json, logging, sys
import torch.distributed.checkpoint as dcp
from rlckpt import Checkpointer
from support.checkpointer import Trainer
from support.pause import PauseAt

logging.basicConfig(level=logging.WARNING)
write = PauseAt(dcp, "save").__enter__()
ckpt = Checkpointer(sys.argv[1], storage_options=json.loads(sys.argv[2]))
original = ckpt.wait
def wait(timeout=None):  # the write goes on only once the exit's close waits for it
    write.release()
    return original(timeout)
ckpt.wait = wait
ckpt.save(2, Trainer().state())
write.wait_reached()
raise RuntimeError("the forward of step 3 failed")  # uncaught: no with, no close
"""


def test_an_uncaught_exception_with_a_save_in_flight_finishes_the_save_before_the_interpreter_exits(run):
    url, options = run
    child = subprocess.run(
        [sys.executable, "-c", _EXITS_WITH_A_SAVE_IN_FLIGHT, url, json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 1, child.stderr  # the exception's exit code, not an abort
    assert "RuntimeError: the forward of step 3 failed" in child.stderr
    assert "the interpreter is exiting with the Checkpointer open: finishing the save of step 2 first" in child.stderr
    assert _store(run).steps() == [2]


# --- failures before anything is written -------------------------------------------------------------


def test_a_piece_that_would_need_pickle_fails_the_save_before_anything_is_written(run):
    with _checkpointer(run) as ckpt, pytest.raises(CheckpointerError, match="rank 0: ExtraPieceError") as caught:
        ckpt.save(2, Trainer().state(), extra={"loader": {"order": object()}})
    assert isinstance(caught.value.__cause__, ExtraPieceError)
    assert _store(run).steps() == [] and debris(_store(run)) == []


def test_saving_a_committed_step_again_is_refused_naming_it(run):
    _saved(run, steps=(2,))
    with _checkpointer(run) as ckpt, pytest.raises(CheckpointerError, match="already committed") as caught:
        ckpt.save(2, Trainer().state())
    assert isinstance(caught.value.__cause__, BundleExistsError)
    assert debris(_store(run)) == []


def test_a_step_that_is_not_a_step_is_refused(tmp_path):  # refused before the store is touched: one backend
    with Checkpointer(str(tmp_path / "run")) as ckpt, pytest.raises(CheckpointerError, match="InvalidStepError"):
        ckpt.save(-1, Trainer().state())


def test_metrics_a_restore_would_not_read_are_refused_before_anything_is_written(tmp_path):
    run = (str(tmp_path / "run"), None)
    with _checkpointer(run) as ckpt, pytest.raises(CheckpointerError, match="metrics"):
        ckpt.save(2, Trainer().state(), metrics={"loss": "low"})
    assert debris(_store(run)) == []


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ({"seen": object()}, "metadata['seen']: a builtins.object (not JSON)"),
        ({"run": {"tags": [1, {"a", "b"}]}}, "metadata['run']['tags'][1]: a builtins.set (not JSON)"),
        ({"loss": float("nan")}, "metadata['loss']: nan (JSON holds no NaN or infinity)"),
        ({1: "one", "two": 2}, "metadata: keys of several types (int, str) that do not sort"),
        (_nested(5000), "nested deeper than 63 levels"),
    ],
    ids=["not-json", "not-json-inside", "nan", "mixed-keys", "5000-deep"],
)
def test_metadata_a_restore_would_not_read_is_refused_before_anything_is_written(tmp_path, metadata, reason):
    run = (str(tmp_path / "run"), None)
    with _checkpointer(run) as ckpt, pytest.raises(CheckpointerError, match="before anything was written") as caught:
        ckpt.save(2, Trainer().state(), metadata=metadata)
    assert isinstance(caught.value.__cause__, ExtraPieceError)
    assert reason in str(caught.value)
    assert _store(run).steps() == [] and debris(_store(run)) == []


def test_a_diverged_runs_non_finite_metrics_are_dropped_with_a_warning_and_the_save_commits(run, caplog):
    with _checkpointer(run, async_save=False) as ckpt:
        ckpt.save(2, Trainer().state(), metrics={"loss": float("nan"), "grad_norm": float("inf"), "reward": 0.5})
    assert _store(run).open(2).manifest.metadata["metrics"] == {"reward": 0.5}
    assert "save of step 2: metrics not recorded, not finite: loss=nan, grad_norm=inf" in caplog.text


def test_keep_best_passes_over_a_save_whose_metric_was_not_finite(run):
    trainer, best = Trainer(), Retention(keep_best=1, metric="loss", lower_is_better=True)
    with _checkpointer(run, async_save=False, retention=best) as ckpt:
        for step, loss in ((1, 0.5), (2, 0.1), (3, float("nan")), (4, 0.9)):
            ckpt.save(step, trainer.state(), metrics={"loss": loss})
    assert _store(run).steps() == [2, 4]  # the best finite one, and the newest


def test_a_closed_checkpointer_refuses_calls(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "run"))
    ckpt.close()
    with pytest.raises(CheckpointerError, match="is closed"):
        ckpt.save(2, Trainer().state())


# --- retention, keys -----------------------------------------------------------------------------


def test_retention_after_each_commit_keeps_what_its_rules_keep(run):
    _saved(run, steps=(1, 2, 3), retention=Retention(keep_last=2))
    assert _store(run).steps() == [2, 3]


def test_retention_by_metric_keeps_the_best_saves(run):
    trainer, best = Trainer(), Retention(keep_best=1, metric="loss", lower_is_better=True)
    with _checkpointer(run, async_save=False, retention=best) as ckpt:
        for step, loss in ((1, 0.5), (2, 0.1), (3, 0.9)):
            ckpt.save(step, trainer.state(), metrics={"loss": loss})
    assert _store(run).steps() == [2, 3]  # the best, and the newest (never deleted)


def test_a_signed_run_is_read_with_its_key_and_refused_with_another(run, tmp_path):
    key, other = SigningKey.generate(), SigningKey.generate()
    _saved(run, steps=(2,), signing_key=key)
    assert _store(run).open(2).commit.signature is not None
    with _checkpointer(run, verify_key=key.public) as ckpt:
        assert ckpt.restore(Trainer().state()).step == 2
    with _checkpointer(run, verify_key=other.public) as ckpt, pytest.raises(CheckpointError, match="verifies"):
        ckpt.restore(Trainer().state())


def test_a_checkpointer_pinned_to_its_run_restores_its_own_bundle_past_another_runs_with_the_same_key(run):
    key, (url, options) = SigningKey.generate(), run
    other = (url + "-x", options)
    _saved(other, steps=(4,), signing_key=key)
    saved = _saved(run, steps=(2,), signing_key=key)
    run_id = _store(run).run_record().run_id
    copy_bundle(_store(other), 4, _store(run))  # run X's newer bundle and X's _run.json, in run Y
    rewrite_run_record(_store(run), _store(other).run_record().run_id)
    fresh = Trainer()
    with _checkpointer(run, verify_key=key.public, run_id=run_id) as ckpt:
        assert ckpt.restore(fresh.state()).step == 2
    assert bitwise_equal(fresh.tensors(), saved[2]) == []  # Y's weights, not X's


def test_settings_come_as_a_config_or_as_keywords_not_both(tmp_path):
    with pytest.raises(TypeError, match="not both"):
        Checkpointer(CheckpointerConfig(str(tmp_path)), async_save=False)


def test_a_compressed_save_stores_the_state_in_planes_and_restores_every_bit(run):
    trainer = Trainer()
    trainer.step(1)
    with _checkpointer(run, async_save=False, compression="on") as ckpt:
        ckpt.save(2, trainer.state())
    shards = {e.compression for rel, e in _store(run).open(2).manifest.files.items() if rel.endswith(".distcp")}
    assert "zstd-planes4" in shards  # fp32 weights and moments
    fresh = Trainer(seed=99)
    with _checkpointer(run) as ckpt:
        restored = ckpt.restore(fresh.state())
    assert restored is not None and restored.step == 2
    assert bitwise_equal(fresh.tensors(), trainer.tensors()) == []


def test_an_unknown_compression_is_refused_when_the_checkpointer_is_made(tmp_path):
    with pytest.raises(ValueError, match="compression must be one of off, auto, on"):
        Checkpointer(str(tmp_path), compression="zstd")


def test_a_save_with_reuse_takes_a_frozen_tensor_from_the_bundle_before_and_restores_every_bit(run):
    frozen, live = torch.randn(512, 1024), torch.zeros(4096)
    with _checkpointer(run, async_save=False, reuse=True, compression="on") as ckpt:
        for step in (1, 2):
            live.add_(1.0)
            ckpt.save(step, {"frozen": frozen, "live": live}, extra={"loader": {"position": step}})
    store = _store(run)
    before, after = store.open(1).manifest.files, store.open(2).manifest.files
    unchanged = [rel for rel, entry in after.items() if rel.endswith(".distcp") and before.get(rel) == entry]
    assert sum(after[rel].logical_size for rel in unchanged) >= frozen.numel() * 4
    into = {"frozen": torch.zeros_like(frozen), "live": torch.zeros_like(live)}
    with _checkpointer(run) as ckpt:
        restored = ckpt.restore(into)
    assert restored.step == 2 and restored.extra == {"loader": {"position": 2}}
    assert bitwise_equal(into, {"frozen": frozen, "live": live}) == []
