"""`rlckpt train`'s stop options and its SIGTERM handling, without a cluster: what the options parse
to, what they refuse before anything starts, and what each SIGTERM does."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from rlckpt.cli import train_stop
from rlckpt.cli.main import build_parser
from rlckpt.controller import setup
from rlckpt.controller.stopping import StopRequest
from rlckpt.errors import CheckpointError


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


def test_the_first_sigterm_asks_to_save_and_stop_with_what_is_left_of_the_grace():
    now = [100.0]
    handler = train_stop.SigtermHandler("save", grace_s=60.0, clock=lambda: now[0])
    assert handler.pending() is None
    handler.handle(15, None)
    now[0] = 110.0
    assert handler.pending() == StopRequest("preempted", grace_s=50.0)


def test_the_second_sigterm_stops_at_once_and_later_ones_are_ignored():
    handler = train_stop.SigtermHandler("save", grace_s=60.0)
    handler.handle(15, None)
    assert not handler.stopped_at_once
    with pytest.raises(KeyboardInterrupt):
        handler.handle(15, None)
    assert handler.stopped_at_once
    handler.handle(15, None)  # the abort and the shutdown are under way: not interrupted again


def test_with_on_sigterm_exit_the_first_sigterm_stops_at_once():
    handler = train_stop.SigtermHandler("exit", grace_s=60.0)
    with pytest.raises(KeyboardInterrupt):
        handler.handle(15, None)
    assert handler.stopped_at_once and handler.pending() is None
