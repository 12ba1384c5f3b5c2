"""What `rlckpt train` (and, for their JSON, `ls`, `verify` and `gc`) refuse, each in one line on stderr naming
the flag and the cause, with the documented exit code: command lines that cannot work before any Ray cluster
is started or joined (Ray's start and join are replaced by a failure here), and an address where no Ray
cluster answers within the connect timeout, before ray.init would retry it for minutes."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterator

import pytest

from rlckpt.dataplane import ray_cluster
from rlckpt.errors import ClusterUnavailableError
from rlckpt.s3local import free_port
from rlckpt.store import BundleStore

DEEP_JSON = '{"a": ' * 1000 + "1" + "}" * 1000


def _refuse_ray(*args: object, **kwargs: object) -> None:
    raise AssertionError("rlckpt train started or joined Ray before refusing the start")


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's start and join fail the test: what is refused must be refused before either."""
    monkeypatch.setattr(ray_cluster, "start_local_ray", _refuse_ray)
    monkeypatch.setattr(ray_cluster, "connect_ray", _refuse_ray)


@pytest.fixture
def no_ray_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real connect_ray, but ray.init fails the test: an address must be refused before it. This
    process counts as not connected (a session fixture may have started Ray in it)."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", _refuse_ray)
    monkeypatch.setattr(ray_cluster, "start_local_ray", _refuse_ray)


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
    assert "nested deeper than" not in result.err  # (refused for another reason: an S3 option on local disk)


@pytest.mark.parametrize(
    ("resources", "cause"),
    [
        ('{"x": Infinity}', "Infinity is not a JSON number"),
        ('{"x": NaN}', "NaN is not a JSON number"),
        ('{"CPU": 1}', "'CPU' is Ray's own resource"),
        ('{"memory": 1}', "'memory' is Ray's own resource"),
        ('{"x": -1}', "'x': -1 is not an amount"),
        ('{"x": true}', "'x': True is not an amount"),
        ('{"x": 1e-9}', "finer than Ray counts"),
    ],
)
def test_trainer_resources_ray_would_refuse_are_refused_before_ray_starts(cli, tmp_path, no_cluster, resources, cause):
    result = _train(cli, tmp_path, "--trainer-resources", resources)
    assert result.code == 64
    assert "--trainer-resources" in _one_line(result) and cause in result.err


# --- the Ray address ------------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["127.0.0.1", "auto", "ray://10.0.0.1:10001", "10.0.0.1:99999", "10.0.0.1:port"])
def test_a_malformed_ray_address_is_refused_before_ray_starts(cli, tmp_path, no_cluster, address):
    result = _train(cli, tmp_path, "--ray-address", address)
    assert result.code == 64
    assert "--ray-address" in _one_line(result) and "is not a Ray address host:port" in result.err


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "soon"])
def test_a_connect_timeout_that_is_no_duration_is_refused(cli, tmp_path, no_cluster, timeout):
    result = _train(cli, tmp_path, "--ray-address", "127.0.0.1:6379", "--ray-connect-timeout", timeout)
    assert result.code == 64
    assert "--ray-connect-timeout" in _one_line(result)


def test_an_address_where_nothing_listens_is_refused_at_once_without_ray_init(cli, tmp_path, no_ray_init):
    address = f"127.0.0.1:{free_port()}"
    result = _train(cli, tmp_path, "--ray-address", address)
    assert result.code == 3
    assert f"no Ray cluster at {address}" in _one_line(result) and "Connection refused" in result.err


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """host:port of a socket that takes connections (the kernel's backlog) and never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_an_address_that_never_answers_is_refused_after_the_connect_timeout(
    cli, tmp_path, no_ray_init, silent_listener
):
    result = _train(cli, tmp_path, "--ray-address", silent_listener, "--ray-connect-timeout", "0.5")
    assert result.code == 3
    assert f"no Ray cluster answered at {silent_listener} within 0.5s (--ray-connect-timeout)" in _one_line(result)


# --- no temp dir left behind ------------------------------------------------------------------------


@pytest.fixture
def made_dirs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every dir tempfile.mkdtemp makes during the test."""
    made: list[str] = []
    real = tempfile.mkdtemp

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording)
    return made


def _fail_start(*args: object, **kwargs: object) -> None:
    raise ClusterUnavailableError("the test's Ray did not start")


def test_a_private_cluster_that_fails_to_start_leaves_no_temp_dir(cli, tmp_path, monkeypatch, made_dirs):
    monkeypatch.setattr(ray_cluster, "start_local_ray", _fail_start)
    result = _train(cli, tmp_path)
    assert result.code == 3 and "the test's Ray did not start" in _one_line(result)
    assert [d for d in made_dirs if os.path.exists(d)] == []


def test_joining_a_cluster_that_fails_leaves_no_temp_dir(cli, tmp_path, monkeypatch, made_dirs):
    monkeypatch.setattr(ray_cluster, "connect_ray", _fail_start)
    result = _train(cli, tmp_path, "--ray-address", "127.0.0.1:6379")
    assert result.code == 3 and "the test's Ray did not start" in _one_line(result)
    assert [d for d in made_dirs if os.path.exists(d)] == []


# --- --resume-step of a bundle that is not a run bundle ------------------------------------------------


def test_resume_step_of_a_bundle_another_program_committed_is_refused_before_ray_starts(cli, run, no_cluster):
    run.commit(2)  # a bundle, but not one `rlckpt train` wrote
    result = cli("train", "--run-dir", run.url, *run.options_args(), "--steps", "4", "--resume-step", "2")
    assert result.code == 3
    assert "step 2" in _one_line(result) and "is not a run bundle" in result.err


def test_resume_step_of_a_run_bundle_missing_a_piece_is_refused_naming_it(cli, run, no_cluster):
    from rlckpt.checkpoint import layout

    with BundleStore(run.url, run.storage_options).begin(2) as tx:
        for rel in (layout.POLICY_METADATA, layout.REPLAY_FILE, layout.DATA_PLANE_METADATA):  # no loader
            tx.write_bytes(rel, b"x")
        digest, order = "0" * 64, {layout.META_ROLLOUT_ORDER: "in_order"}
        data_plane = {"index_digest": digest, "group_count": 0, "step": 2, "partition_id": "rollouts", **order}
        tx.commit(
            {
                layout.META_FORMAT: layout.RUN_BUNDLE_FORMAT,
                **{"index_digest": digest, "group_count": 0, layout.META_UPLOAD_TIMING: "pinned", **order},
                "data_plane": data_plane,
            }
        )
    result = cli("train", "--run-dir", run.url, *run.options_args(), "--steps", "4", "--resume-step", "2")
    assert result.code == 3
    assert "cannot resume step 2" in _one_line(result) and layout.LOADER_FILE in result.err


# --- two tiers and retention -----------------------------------------------------------------------


def test_a_metric_without_keep_best_is_a_one_line_usage_error(cli, tmp_path, no_cluster):
    result = _train(cli, tmp_path, "--metric", "reward")
    assert result.code == 64
    assert "metric 'reward' is for keep_best" in _one_line(result)


def test_replica_retention_without_a_remote_tier_is_a_one_line_usage_error(cli, tmp_path, no_cluster):
    result = _train(cli, tmp_path, "--replica-keep-last", "2")
    assert result.code == 64
    assert "need a remote tier" in _one_line(result)


def test_a_remote_tier_that_cannot_be_reached_is_refused_before_ray_starts(cli, tmp_path, no_cluster):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the remote tier should be")
    result = _train(cli, tmp_path, "--replicate-to", str(blocked / "remote"))
    assert result.code == 3
    assert "not-a-dir" in _one_line(result)


def test_fresh_is_refused_when_the_remote_tier_holds_bundles(cli, tmp_path, no_cluster):
    remote = tmp_path / "remote"
    with BundleStore(str(remote)).begin(2) as txn:
        txn.write_bytes("x.bin", b"x")
        txn.commit({})
    result = _train(cli, tmp_path, "--fresh", "--replicate-to", str(remote))
    assert result.code == 3
    assert f"--fresh but {remote} already holds committed bundles" in _one_line(result)


def _train_two_tiers(cli, tmp_path, remote):
    """rlckpt train with the run dir `<tmp>/local` and `remote` (a Run) as its remote tier."""
    options = ["--replicate-storage-options", json.dumps(remote.storage_options)] if remote.storage_options else []
    local = str(tmp_path / "local")
    return cli("train", "--run-dir", local, "--steps", "2", "--replicate-to", remote.url, *options)


def test_a_remote_tier_of_another_run_is_refused_before_ray_starts(cli, tmp_path, run, no_cluster):
    BundleStore(str(tmp_path / "local")).ensure_run_record()  # this run, on the local tier
    run.commit(100)  # the remote tier: another run's
    result = _train_two_tiers(cli, tmp_path, run)
    assert result.code == 3
    assert "the tiers of one run must be one run" in _one_line(result)


def test_a_remote_tier_whose_bundles_name_another_run_is_refused_before_ray_starts(cli, tmp_path, run, no_cluster):
    BundleStore(str(tmp_path / "local")).ensure_run_record()
    run.commit(100)
    fs, record = run.raw_path("_run.json")
    fs.rm_file(record)  # its record is gone; its COMMITs still name the run they were saved in
    result = _train_two_tiers(cli, tmp_path, run)
    assert result.code == 3
    assert "the COMMIT of its step 100 names it" in _one_line(result)
    assert not fs.exists(record)  # nothing written into the other run
