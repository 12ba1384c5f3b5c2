"""The `rlckpt` entry point: help, error reporting (one line, no traceback), exit codes, real console script."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

from rlckpt.cli.main import SUBCOMMANDS, main


def test_help_lists_every_registered_subcommand_and_examples(cli):
    result = cli("--help")
    assert result.code == 0
    for module in SUBCOMMANDS:
        assert module.rsplit(".", 1)[1] in result.out
    assert "examples:" in result.out and "exit codes" in result.out


@pytest.mark.parametrize("command", ["ls", "verify", "gc"])
def test_each_subcommand_help_has_examples(cli, command):
    result = cli(command, "--help")
    assert result.code == 0
    assert "--storage-options" in result.out and "examples:" in result.out


def test_storage_options_that_are_not_json_are_a_usage_error(cli, tmp_path):
    result = cli("ls", str(tmp_path), "--storage-options", "{endpoint")
    assert result.code == 64
    assert "--storage-options" in result.err and "not valid JSON" in result.err


def test_storage_options_must_be_an_object(cli, tmp_path):
    result = cli("ls", str(tmp_path), "--storage-options", "[1, 2]")
    assert result.code == 64
    assert "JSON object" in result.err


def test_unreachable_store_is_one_line_on_stderr_with_exit_3(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = cli("ls", str(blocker / "run"))
    assert result.code == 3
    assert result.err.count("\n") == 1 and "Traceback" not in result.err
    assert result.err.startswith("rlckpt ls: error:") and str(blocker) in result.err


def test_missing_bucket_is_reported_as_unavailable(cli, s3_storage_options):
    result = cli("verify", "s3://rlckpt-no-such-bucket/run", "--storage-options", json.dumps(s3_storage_options))
    assert result.code == 3
    assert "rlckpt-no-such-bucket" in result.err and "Traceback" not in result.err


def test_verbose_flag_turns_on_info_logging_for_rlckpt(cli, tmp_path):
    logger = logging.getLogger("rlckpt")
    saved = logger.level
    try:
        cli("ls", str(tmp_path), "-v")
        assert logger.level == logging.INFO
        cli("ls", str(tmp_path), "-vv")
        assert logger.level == logging.DEBUG
    finally:
        logger.setLevel(saved)


def test_main_returns_the_exit_code_instead_of_exiting(tmp_path):
    assert main(["verify", str(tmp_path)]) == 2


def _console_script() -> list[str]:
    exe = shutil.which("rlckpt", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "rlckpt.cli.main"]


def test_console_script_runs_ls_and_verify_as_a_real_process(run):
    run.commit(1)
    env = dict(os.environ)
    ls = subprocess.run(
        [*_console_script(), "ls", run.url, "--json", *run.options_args()],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ls.returncode == 0, ls.stderr
    assert [(r["step"], r["state"]) for r in json.loads(ls.stdout)] == [(1, "committed")]
    verify = subprocess.run(
        [*_console_script(), "verify", run.url, "--step", "2", *run.options_args()],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert verify.returncode == 2
    assert "Traceback" not in verify.stderr
