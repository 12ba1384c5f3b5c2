"""Every bad store input and every failure to reach a store is one line on stderr (never a traceback)
with the documented exit code: 64 for a URL or --storage-options that cannot describe a store, 3 for
a store that cannot be reached or read. Never 1, which means "corrupt"."""

from __future__ import annotations

import argparse
import json

import pytest

from rlckpt.cli import _common, ls
from rlckpt.s3local import free_port
from rlckpt.store import BundleStore
from rlckpt.store.paths.location import S3_CLIENT_DEFAULTS
from support.permissions import mode_enforced

COMMANDS = ["ls", "verify", "gc"]


def _one_line(err: str) -> bool:
    return err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_protocol_is_one_line_naming_it_with_exit_64(cli, command):
    result = cli(command, "foo://bucket/run")
    assert result.code == 64 and _one_line(result.err)
    assert (
        result.err.startswith(f"rlckpt {command}: error: ")
        and "foo://bucket/run" in result.err
        and "'foo'" in result.err
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_empty_url_is_refused_with_exit_64(cli, command):
    result = cli(command, "")
    assert result.code == 64 and _one_line(result.err)
    assert "empty" in result.err and result.out == ""


@pytest.mark.parametrize("endpoint", ["not-a-url", "ftp://127.0.0.1:9000", "http://"])
def test_endpoint_that_is_not_an_http_url_is_one_line_naming_it_with_exit_64(cli, endpoint):
    result = cli("ls", "s3://bucket/run", "--storage-options", json.dumps({"endpoint_url": endpoint}))
    assert result.code == 64 and _one_line(result.err)
    assert "s3://bucket/run" in result.err and f"endpoint_url {endpoint!r}" in result.err


def test_unknown_s3_option_is_one_line_naming_it_with_exit_64(cli, s3_storage_options):
    options = dict(s3_storage_options, endpoint="http://127.0.0.1:9000")  # a typo of endpoint_url
    result = cli("ls", "s3://bucket/run", "--storage-options", json.dumps(options))
    assert result.code == 64 and _one_line(result.err)
    assert "s3://bucket/run" in result.err and "unknown storage option 'endpoint'" in result.err


def test_unknown_storage_option_on_local_disk_is_one_line_naming_it_with_exit_64(cli, tmp_path):
    result = cli("ls", str(tmp_path / "run"), "--storage-options", json.dumps({"endpoint_url": "http://127.0.0.1:9"}))
    assert result.code == 64 and _one_line(result.err)
    assert str(tmp_path / "run") in result.err and "unknown storage option 'endpoint_url'" in result.err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_run_path_fsspec_would_chain_is_refused_with_exit_64_not_listed_as_another_run(cli, tmp_path, command):
    """`/x/a::b` is `/x/a` to fsspec: refused by the CLI as by the library, never read as either run."""
    with BundleStore(str(tmp_path / "a")).begin(1) as tx:
        tx.write_bytes("weights.bin", b"w" * 100)
        tx.commit()
    result = cli(command, f"{tmp_path}/a::b")
    assert result.code == 64 and _one_line(result.err) and result.out == ""
    assert "a::b" in result.err and "'::' chains filesystems" in result.err


def test_ill_typed_s3_option_is_one_line_naming_it_with_exit_64(cli, s3_storage_options):
    options = dict(s3_storage_options, client_kwargs="us-east-1")
    result = cli("ls", "s3://bucket/run", "--storage-options", json.dumps(options))
    assert result.code == 64 and _one_line(result.err)
    assert "client_kwargs" in result.err


@pytest.mark.parametrize("command", COMMANDS)
def test_unreachable_endpoint_is_one_line_naming_url_and_endpoint_with_exit_3(cli, s3_storage_options, command):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    options = dict(s3_storage_options, endpoint_url=endpoint)
    result = cli(command, "s3://bucket/run", "--storage-options", json.dumps(options))
    assert result.code == 3 and _one_line(result.err)
    assert "s3://bucket/run unavailable" in result.err and endpoint in result.err


def test_cli_s3_client_gives_up_after_3_attempts_with_a_3s_connect_timeout(s3_storage_options, monkeypatch):
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    args = argparse.Namespace(url="s3://bucket/run", storage_options=dict(s3_storage_options))
    fs = _common.open_store(args).fs
    assert fs.config_kwargs == {
        **S3_CLIENT_DEFAULTS,
        "connect_timeout": 3,
        "retries": {"total_max_attempts": 3, "mode": "standard"},
    }
    assert fs.retries == 2  # s3fs's own tries around timeouts and dropped connections (default 5)


def test_file_that_cannot_be_read_while_verifying_is_one_line_with_exit_3_not_corrupt(tmp_path, cli):
    run_dir = tmp_path / "run"
    with BundleStore(str(run_dir)).begin(1) as tx:
        tx.write_bytes("weights.bin", b"w" * 100)
        tx.commit()
    unreadable = run_dir / "step_1" / "weights.bin"
    with mode_enforced(unreadable, 0o000):
        result = cli("verify", str(run_dir), "--step", "1")
    assert result.code == 3 and _one_line(result.err)
    assert f"store {run_dir} unavailable while reading weights.bin of step 1" in result.err
    assert "PermissionError" in result.err and str(unreadable) in result.err


def test_a_bug_in_a_subcommand_is_one_line_with_exit_3(cli, tmp_path, monkeypatch):
    def broken(args):
        raise KeyError("some internal key")

    monkeypatch.setattr(ls, "run", broken)
    result = cli("ls", str(tmp_path))
    assert result.code == 3 and _one_line(result.err)
    assert "unexpected KeyError" in result.err and "-vv" in result.err
