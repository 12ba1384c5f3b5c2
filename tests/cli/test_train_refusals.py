"""What `rlckpt train` (and, for their JSON, `ls`, `verify` and `gc`) refuse, each in one line on stderr naming
the flag and the cause, with the documented exit code: command lines that cannot work, before any Ray cluster
is started or joined (Ray's start and join are replaced by a failure here)."""

from __future__ import annotations

import json

import pytest

from rlckpt.dataplane import ray_cluster

DEEP_JSON = '{"a": ' * 1000 + "1" + "}" * 1000


def _refuse_ray(*args: object, **kwargs: object) -> None:
    raise AssertionError("rlckpt train started or joined Ray before refusing the start")


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's start and join fail the test: what is refused must be refused before either."""
    monkeypatch.setattr(ray_cluster, "start_local_ray", _refuse_ray)
    monkeypatch.setattr(ray_cluster, "connect_ray", _refuse_ray)


def _one_line(result) -> str:
    assert result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    return result.err


def _train(cli, tmp_path, *argv: str):
    return cli("train", "--run-dir", str(tmp_path / "run"), "--steps", "2", *argv)


# --- JSON arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["ls", "verify", "gc"])
def test_thousand_deep_storage_options_are_a_one_line_usage_error(cli, tmp_path, command):
    result = cli(command, str(tmp_path), "--storage-options", DEEP_JSON)
    assert result.code == 64
    assert "--storage-options" in _one_line(result) and "nested deeper than" in result.err


def test_thousand_deep_storage_options_of_train_are_a_one_line_usage_error(cli, tmp_path, no_cluster):
    result = _train(cli, tmp_path, "--storage-options", DEEP_JSON)
    assert result.code == 64
    assert "--storage-options" in _one_line(result) and "nested deeper than" in result.err


def test_thousand_deep_trainer_resources_are_a_one_line_usage_error(cli, tmp_path, no_cluster):
    result = _train(cli, tmp_path, "--trainer-resources", DEEP_JSON)
    assert result.code == 64
    assert "--trainer-resources" in _one_line(result) and "nested deeper than" in result.err


def test_storage_options_nested_within_the_limit_still_parse(cli, tmp_path):
    nested = {"config_kwargs": {"retries": {"mode": "standard"}}}
    result = cli("ls", str(tmp_path), "--storage-options", json.dumps(nested))
    assert "nested" not in result.err
