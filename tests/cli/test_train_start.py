"""`rlckpt train` refuses a start that cannot work before it starts a Ray cluster and TransferQueue
(≈20 s): a --resume-step that is missing, uncommitted, torn or below newer bundles, and --fresh over
committed bundles. Ray's start is replaced by a failure, so a check that came too late fails here."""

from __future__ import annotations

import pytest

from rlckpt.dataplane import ray_cluster


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("rlckpt train started Ray before refusing the start")

    monkeypatch.setattr(ray_cluster, "start_local_ray", refuse)
    monkeypatch.setattr(ray_cluster, "connect_ray", refuse)


def _train(cli, run, *argv: str):
    return cli("train", "--run-dir", run.url, *run.options_args(), "--steps", "8", *argv)


def test_resume_step_that_does_not_exist_is_refused_before_ray_starts(cli, run):
    run.commit(2)
    result = _train(cli, run, "--resume-step", "4")
    assert result.code == 3, result.err
    assert "cannot resume step 4" in result.err and "does not verify" in result.err


def test_resume_step_without_commit_is_refused_before_ray_starts(cli, run):
    run.commit(2)
    with run.store().begin(4) as tx:
        tx.write_bytes("loader.pt", b"l")  # never committed
        result = _train(cli, run, "--resume-step", "4")
    assert result.code == 3, result.err
    assert "cannot resume step 4" in result.err


def test_resume_step_with_a_torn_manifest_is_refused_naming_the_file(cli, run):
    run.commit(2)
    fs, path = run.raw_path("step_2", "manifest.json")
    fs.pipe_file(path, fs.cat_file(path)[:-7])
    result = _train(cli, run, "--resume-step", "2")
    assert result.code == 3, result.err
    assert "cannot resume step 2" in result.err and "manifest" in result.err


def test_resume_step_below_newer_committed_bundles_is_refused_before_ray_starts(cli, run):
    run.commit(2)
    run.commit(4)
    result = _train(cli, run, "--resume-step", "2")
    assert result.code == 3, result.err
    assert "newer committed bundles [4]" in result.err


def test_fresh_over_committed_bundles_is_refused_before_ray_starts(cli, run):
    run.commit(2)
    result = _train(cli, run, "--fresh")
    assert result.code == 3, result.err
    assert "--fresh but" in result.err and "[2]" in result.err
