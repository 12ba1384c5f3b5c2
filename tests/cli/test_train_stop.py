"""`rlckpt train`'s stop options and its SIGTERM handling, without a cluster: what the options parse
to, what they refuse before anything starts, and what each SIGTERM does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from rlckpt.cli import train_stop
from rlckpt.cli.main import build_parser
from rlckpt.cli.train_stop import Phase
from rlckpt.controller import setup
from rlckpt.controller.stopping import StopOutcome, StopRequest
from rlckpt.dataplane import ray_cluster
from rlckpt.errors import CheckpointError
from rlckpt.store import BundleStore
from support.signals import came_before_the_handler_ran


def _parse(*argv: str):
    return build_parser().parse_args(["train", "--run-dir", "/nowhere", *argv])


def test_the_defaults_save_on_sigterm_with_a_minute_of_grace_and_no_deadline():
    args = _parse()
    assert (args.on_sigterm, args.grace_seconds, args.save_by) == ("save", 60.0, None)


def test_save_by_takes_an_iso_time_with_a_zone():
    args = _parse("--save-by", "2999-01-02T03:04:05Z")
    assert args.save_by == datetime(2999, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()


def test_save_by_seconds_counts_from_the_command_start():
    before = time.time()
    args = _parse("--save-by-seconds", "90")
    assert before + 90 <= args.save_by <= time.time() + 90


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--save-by", "2001-01-01T00:00:00Z"], "is not in the future"),
        (["--save-by", "tomorrow"], "not an ISO 8601 time"),
        (["--save-by-seconds", "0"], "must be a number of seconds > 0"),
        (["--grace-seconds", "-1"], "must be a number of seconds > 0"),
        (["--on-sigterm", "ignore"], "invalid choice"),
        (["--save-by", "2999-01-01T00:00:00Z", "--save-by-seconds", "60"], "not allowed with argument"),
    ],
    ids=["past-deadline", "not-iso", "zero-seconds", "negative-grace", "unknown-mode", "two-deadlines"],
)
def test_a_stop_option_that_cannot_work_is_a_usage_error(cli, tmp_path, argv, message):
    result = cli("train", "--run-dir", str(tmp_path / "run"), *argv)
    assert result.code == 64, result.err
    assert message in result.err


@pytest.mark.parametrize("moment", ["0001-01-01", "0001-01-01T00:00:00"])
def test_a_deadline_before_the_calendar_can_count_is_refused_as_not_in_the_future(cli, tmp_path, moment):
    """Year 1 in local time has no unix timestamp on a machine at or east of UTC (datetime raises):
    the refusal still says what is wrong with the deadline, not which function choked on it."""
    result = cli("train", "--run-dir", str(tmp_path / "run"), "--save-by", moment)
    assert result.code == 64, result.err
    assert f"argument --save-by: {moment!r} is not in the future" in result.err


@pytest.mark.parametrize("flag", ["--grace-seconds", "--save-by-seconds"])
def test_a_number_of_seconds_that_is_no_number_is_refused_in_the_users_words(cli, tmp_path, flag):
    result = cli("train", "--run-dir", str(tmp_path / "run"), flag, "soon")
    assert result.code == 64, result.err
    assert f"argument {flag}: not a number of seconds: 'soon'" in result.err


def test_the_stop_options_reach_the_runs_config(cli, tmp_path, monkeypatch):
    seen = []

    def check_start(config):
        seen.append(config)
        raise CheckpointError("stop here, before Ray")

    monkeypatch.setattr(setup, "check_start", check_start)
    cli("train", "--run-dir", str(tmp_path / "run"), "--grace-seconds", "5", "--save-by", "2999-01-01T00:00:00Z")
    [config] = seen
    assert config.grace_s == 5.0
    assert config.save_by == datetime(2999, 1, 1, tzinfo=UTC).timestamp()


def _refuse_ray(*args: object, **kwargs: object) -> None:
    raise AssertionError("rlckpt train started Ray after a SIGTERM stopped its start-up")


def _default_would_kill(signum: int, frame: object) -> None:
    raise AssertionError("SIGTERM reached no handler of rlckpt train: it would have killed the process")


@pytest.fixture
def sigterm_guard() -> Iterator[None]:
    """A SIGTERM that reaches no handler of `rlckpt train` fails the test instead of killing pytest."""
    before = signal.signal(signal.SIGTERM, _default_would_kill)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_sigterm_before_ray_starts_stops_the_start_up_with_nothing_to_save(cli, tmp_path, monkeypatch, sigterm_guard):
    run_dir = str(tmp_path / "run")
    real_check_start = setup.check_start

    def check_start_then_sigterm(config):
        store = real_check_start(config)
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at once, in this thread
        return store

    monkeypatch.setattr(setup, "check_start", check_start_then_sigterm)
    monkeypatch.setattr(ray_cluster, "start_local_ray", _refuse_ray)
    result = cli("train", "--run-dir", run_dir, "--json")
    assert result.code == 0, result.err
    assert "rlckpt train: preempted: nothing new to save, at step 0, stopped" in result.err
    assert json.loads(result.out) == {
        "step": 0,
        "stop_reason": "preempted",
        "final_save_aborted": False,
        "last_committed_step": None,
        "bundles": [],
        "run_dir": run_dir,
    }


# --- the stop's state machine: one outcome per phase and SIGTERM (docs/cli.md's table) -------------


def _state(on_sigterm: str = "save", phase: Phase = Phase.STARTING, **kw) -> train_stop.StopState:
    state = train_stop.StopState(on_sigterm, grace_s=60.0, on_overrun=lambda code: None, **kw)
    if phase is not Phase.STARTING:
        state.enter(Phase.TRAINING)
    if phase in (Phase.SAVING, Phase.COMMITTED):
        state.handle(signal.SIGTERM, None)  # the first SIGTERM: save and stop
    if phase in (Phase.COMMITTED, Phase.SHUTTING_DOWN):
        state.enter(phase)
    assert state.phase is phase
    return state


def test_a_stop_before_any_step_of_a_restored_run_reports_the_step_it_stands_at(tmp_path, capsys):
    store = BundleStore(str(tmp_path / "run"))
    with store.begin(16) as tx:
        tx.write_bytes("loader.pt", b"l" * 10)
        tx.commit({"step": 16})
    code = train_stop.report_stopped(store, store.url, reason="preempted", step=None, known_last=None, as_json=True)
    out, err = capsys.readouterr()
    assert code == 0
    assert "rlckpt train: preempted: nothing new to save, at step 16, stopped" in err
    assert json.loads(out)["step"] == 16


def test_a_stop_after_the_step_reached_committed_reports_that_step():
    line = train_stop.stopped_line("preempted", 18, trained=True, step=18)
    assert line == "rlckpt train: preempted: saved step 18, stopped"


def test_a_run_that_trained_nothing_since_its_restore_says_so_with_the_step_it_stands_at():
    line = train_stop.stopped_line("deadline", 16, trained=False, step=16)
    assert line == "rlckpt train: deadline: nothing new to save, at step 16, stopped"


def test_the_step_a_stopped_run_stands_at_is_the_step_reached_else_its_resume_point_else_0():
    assert train_stop.standing_at(18, 16) == 18
    assert train_stop.standing_at(None, 16) == 16
    assert train_stop.standing_at(None, None) == 0


def test_a_sigterm_during_start_up_stops_it_and_loses_nothing():
    state = _state()
    with pytest.raises(KeyboardInterrupt):
        state.handle(signal.SIGTERM, None)
    assert state.startup_stopped and not state.stopped_at_once
    assert state.pending() is None and state.exit_code() == 0


def test_a_second_sigterm_during_start_up_does_not_interrupt_its_undoing():
    state = _state()
    with pytest.raises(KeyboardInterrupt):
        state.handle(signal.SIGTERM, None)
    state.handle(signal.SIGTERM, None)
    assert state.exit_code() == 0


def test_a_start_up_stop_that_was_swallowed_on_the_way_is_raised_again_when_training_would_begin():
    state = _state()
    with contextlib.suppress(KeyboardInterrupt):
        state.handle(signal.SIGTERM, None)
    with pytest.raises(KeyboardInterrupt):
        state.enter(Phase.TRAINING)


def test_the_first_sigterm_while_training_asks_to_save_and_stop_with_what_is_left_of_the_grace():
    now = [100.0]
    state = _state(phase=Phase.TRAINING, clock=lambda: now[0])
    assert state.pending() is None
    state.handle(signal.SIGTERM, None)
    assert state.phase is Phase.SAVING
    now[0] = 110.0
    assert state.pending() == StopRequest("preempted", grace_s=50.0)


def test_a_second_sigterm_while_saving_stops_at_once_and_the_step_reached_is_lost():
    state = _state(phase=Phase.SAVING)
    with pytest.raises(KeyboardInterrupt):
        state.handle(signal.SIGTERM, None)
    assert state.stopped_at_once and state.exit_code() == 143


def test_a_second_sigterm_once_the_step_reached_is_committed_stops_at_once_and_loses_nothing():
    state = _state(phase=Phase.COMMITTED)
    with pytest.raises(KeyboardInterrupt):
        state.handle(signal.SIGTERM, None)
    assert state.stopped_at_once and state.exit_code() == 0


@pytest.mark.parametrize("before", [0, 1], ids=["first", "second"])
def test_a_sigterm_while_shutting_down_is_ignored_and_the_runs_outcome_stands(before):
    state = _state(phase=Phase.TRAINING)
    for _ in range(before):
        state.handle(signal.SIGTERM, None)
    state.enter(Phase.SHUTTING_DOWN)
    state.outcome = 0
    state.handle(signal.SIGTERM, None)
    assert not state.stopped_at_once and state.exit_code() == 0


def test_later_sigterms_after_the_stop_at_once_are_ignored():
    state = _state(phase=Phase.SAVING)
    with pytest.raises(KeyboardInterrupt):
        state.handle(signal.SIGTERM, None)
    state.handle(signal.SIGTERM, None)  # the abort and the shutdown are under way: not interrupted again


def test_with_on_sigterm_exit_the_first_sigterm_while_training_stops_at_once():
    state = _state("exit", phase=Phase.TRAINING)
    with pytest.raises(KeyboardInterrupt):
        state.handle(signal.SIGTERM, None)
    assert state.stopped_at_once and state.pending() is None


def test_two_sigterms_that_python_hands_the_handler_as_one_are_two():
    """Python runs a handler once for signals that came before it could run it (it keeps a flag, not a
    count); the C-level handler writes one byte per signal to the wakeup fd, as here."""
    state = _state()
    state.install()
    try:
        state.enter(Phase.TRAINING)
        came_before_the_handler_ran(signal.SIGTERM, signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):
            state.handle(signal.SIGTERM, None)
        assert state.received == 2 and state.stopped_at_once
    finally:
        state.uninstall()


def test_a_handler_call_for_a_sigterm_already_counted_counts_nothing():
    state = _state()
    state.install()
    try:
        state.enter(Phase.TRAINING)
        came_before_the_handler_ran(signal.SIGTERM)
        state.handle(signal.SIGTERM, None)  # it came while the handler ran for ... itself: counted once
        state.handle(signal.SIGTERM, None)
        assert state.received == 1 and state.phase is Phase.SAVING
    finally:
        state.uninstall()


def test_a_stop_that_overruns_its_bound_ends_the_process_with_the_code_of_where_it_is():
    ended: list[int] = []
    done = threading.Event()

    def overrun(exit_code: int) -> None:
        ended.append(exit_code)
        done.set()

    state = train_stop.StopState("save", grace_s=0.0, margin_s=0.0, on_overrun=overrun)
    state.enter(Phase.TRAINING)
    state.handle(signal.SIGTERM, None)  # arms the backstop, here with a bound of 0 s: still saving then
    assert done.wait(60)
    assert ended == [143]


def test_install_and_uninstall_leave_the_process_as_they_found_it():
    before = signal.getsignal(signal.SIGTERM)
    state = train_stop.StopState("save", grace_s=60.0)
    state.install()
    state.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.set_wakeup_fd(-1) == -1


def test_what_a_run_stopped_at_once_leaves_decides_whether_it_lost_its_step():
    assert StopOutcome(step=5, last_committed_step=5).lost_nothing
    assert StopOutcome(step=0, last_committed_step=None).lost_nothing  # trained nothing
    assert not StopOutcome(step=5, last_committed_step=4).lost_nothing
    assert not StopOutcome(step=None, last_committed_step=4).lost_nothing  # the controller did not say
