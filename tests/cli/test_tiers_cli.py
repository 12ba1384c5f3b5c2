"""The two-tier commands: `rlckpt copy` (a bundle into another store as the same bundle, verified there),
`rlckpt gc` with the retention flags and --replicated-to, `rlckpt ls --replicated-to` (both tiers side by
side). The remote tier is the `store_location` (local disk and S3); the local tier a directory."""

from __future__ import annotations

import json

import pytest

from support.store_checks import corrupt_file

from .conftest import Run


@pytest.fixture
def local(tmp_path) -> Run:
    """The fast tier: committed bundles 1, 2, 3 with a reward each (2 is the best)."""
    location = Run(str(tmp_path / "local"), None)
    for step, reward in ((1, 0.1), (2, 0.9), (3, 0.5)):
        location.commit(step, metadata={"step": step, "metrics": {"reward": reward}})
    return location


def _remote_args(run: Run) -> list[str]:
    return ["--replicated-storage-options", json.dumps(run.storage_options)] if run.storage_options else []


def _dest_args(run: Run) -> list[str]:
    return ["--dest-storage-options", json.dumps(run.storage_options)] if run.storage_options else []


def test_copy_copies_the_newest_bundle_as_the_same_bundle_and_verifies_it_there(local, run, cli):
    result = cli("copy", local.url, run.url, "--json", *_dest_args(run))
    assert result.code == 0, result.err
    assert result.json()["step"] == 3 and result.json()["verified"] is True
    assert run.store().steps() == [3]
    assert run.store().records(3) == local.store().records(3)  # manifest and COMMIT bytes verbatim


def test_copy_with_step_copies_that_bundle(local, run, cli):
    assert cli("copy", local.url, run.url, "--step", "1", *_dest_args(run)).code == 0
    assert run.store().steps() == [1]


def test_copy_of_a_step_that_does_not_verify_fails_and_commits_nothing(local, run, cli):
    corrupt_file(local.store(), 3, "policy/weights.bin", "flip")
    result = cli("copy", local.url, run.url, "--step", "3", *_dest_args(run))
    assert result.code == 1, result.err
    assert "policy/weights.bin" in result.err
    assert run.store().steps() == []


def test_copy_without_step_copies_the_newest_bundle_that_verifies_and_names_the_one_it_skipped(local, run, cli):
    corrupt_file(local.store(), 3, "policy/weights.bin", "flip")
    result = cli("copy", local.url, run.url, "--json", *_dest_args(run))
    assert result.code == 0, result.err
    assert result.json()["step"] == 2
    assert [s["step"] for s in result.json()["skipped"]] == [3]
    assert "SKIPPED step 3: it does not verify" in result.err and "policy/weights.bin" in result.err
    assert run.store().steps() == [2]


def test_copy_without_step_and_no_bundle_that_verifies_copies_nothing(local, run, cli):
    for step in (1, 2, 3):
        corrupt_file(local.store(), step, "policy/weights.bin", "truncate")
    result = cli("copy", local.url, run.url, *_dest_args(run))
    assert result.code == 2
    assert "holds no committed bundle that verifies (skipped: 3, 2, 1)" in result.err
    assert run.store().steps() == []


def test_copy_help_states_the_rule_the_command_follows(cli):
    result = cli("copy", "--help")
    assert "(default: the newest that verifies)" in result.out
    assert "the newest bundle that verifies" in result.out and "newest committed" not in result.out


def test_copy_with_reuse_takes_unchanged_files_from_the_destinations_bundle_before_and_verifies(local, run, cli):
    assert cli("copy", local.url, run.url, "--step", "1", *_dest_args(run)).code == 0
    result = cli("copy", local.url, run.url, "--step", "2", "--reuse", "--json", *_dest_args(run))
    assert result.code == 0, result.err
    report = result.json()
    assert (report["reused_files"], report["copied_files"], report["verified"]) == (2, 0, True)
    assert run.store().records(2) == local.store().records(2)


def test_copy_of_a_bundle_already_there_leaves_it_as_it_is(local, run, cli):
    cli("copy", local.url, run.url, *_dest_args(run))
    again = cli("copy", local.url, run.url, "--json", *_dest_args(run))
    assert again.code == 0 and again.json()["already"] is True


def test_gc_keep_best_keeps_the_best_by_the_metric_and_the_newest(local, cli):
    result = cli("gc", local.url, "--keep-best", "1", "--metric", "reward")
    assert result.code == 0, result.err
    assert local.store().steps() == [2, 3]


def test_gc_keep_best_lower_is_better_keeps_the_lowest(local, cli):
    assert cli("gc", local.url, "--keep-best", "1", "--metric", "reward", "--lower-is-better").code == 0
    assert local.store().steps() == [1, 3]


def test_gc_refuses_a_metric_without_keep_best(local, cli):
    result = cli("gc", local.url, "--metric", "reward")
    assert result.code == 64
    assert "keep_best and metric go together" in result.err


def test_gc_replicated_to_keeps_every_bundle_the_remote_tier_does_not_hold_yet(local, run, cli):
    cli("copy", local.url, run.url, "--step", "1", *_dest_args(run))
    result = cli("gc", local.url, "--keep-last", "1", "--replicated-to", run.url, *_remote_args(run))
    assert result.code == 0, result.err
    assert "kept committed step 2: not yet replicated" in result.out
    assert local.store().steps() == [2, 3]  # 1 is on the remote tier; 2 is not, whatever --keep-last says


def test_ls_replicated_to_shows_both_tiers_and_what_is_not_replicated_yet(local, run, cli):
    cli("copy", local.url, run.url, "--step", "2", *_dest_args(run))
    result = cli("ls", local.url, "--replicated-to", run.url, "--json", *_remote_args(run))
    assert result.code == 0, result.err
    record = result.json()
    states = [
        (s["step"], s["local"] and s["local"]["state"], s["remote"] and s["remote"]["state"]) for s in record["steps"]
    ]
    assert states == [(1, "committed", None), (2, "committed", "committed"), (3, "committed", None)]
    lag = record["steps"][1]["lag_s"]
    assert lag is not None and lag >= -5  # the two storages' clocks; the copy came after the local commit
    assert (record["local_newest"], record["remote_newest"], record["not_replicated"]) == (3, 2, [3])


def test_ls_replicated_to_table_says_what_the_remote_tier_lacks(local, run, cli):
    result = cli("ls", local.url, "--replicated-to", run.url, *_remote_args(run))
    assert result.code == 0, result.err
    assert "LOCAL" in result.out and "REMOTE" in result.out
    assert "holds no committed bundle; not replicated yet: step(s) 1, 2, 3" in result.out


def test_ls_replicated_to_names_a_step_skipped_for_a_newer_replicated_one(local, run, cli):
    cli("copy", local.url, run.url, "--step", "1", *_dest_args(run))
    cli("copy", local.url, run.url, "--step", "3", *_dest_args(run))  # 2 waited, and 3 replaced it
    record = cli("ls", local.url, "--replicated-to", run.url, "--json", *_remote_args(run)).json()
    assert [(s["step"], s["skipped_for"]) for s in record["steps"]] == [(1, None), (2, 3), (3, None)]
    assert record["not_replicated"] == []
    table = cli("ls", local.url, "--replicated-to", run.url, *_remote_args(run))
    assert "not replicated: skipped for step 3" in table.out
    assert "holds the newest local bundle (step 3)" in table.out


def test_ls_replicated_to_does_not_call_a_step_newer_than_every_replica_skipped(local, run, cli):
    cli("copy", local.url, run.url, "--step", "2", *_dest_args(run))
    record = cli("ls", local.url, "--replicated-to", run.url, "--json", *_remote_args(run)).json()
    assert [(s["step"], s["skipped_for"]) for s in record["steps"]] == [(1, 2), (2, None), (3, None)]
    assert record["not_replicated"] == [3]


# --- a remote tier of another run ------------------------------------------------------------------


@pytest.fixture
def another_run(run) -> Run:
    """The remote location holding another run's bundle of step 100 (its own _run.json)."""
    run.commit(100)
    return run


def _one_line(result) -> str:
    assert result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    return result.err


def test_gc_refuses_a_remote_tier_of_another_run_and_deletes_nothing(local, another_run, cli):
    result = cli("gc", local.url, "--keep-last", "1", "--replicated-to", another_run.url, *_remote_args(another_run))
    assert result.code == 3
    assert f"{another_run.url} is not the remote tier of {local.url}" in _one_line(result)
    assert "nothing removed" in result.err
    assert local.store().steps() == [1, 2, 3]


def test_ls_refuses_a_remote_tier_of_another_run_instead_of_calling_it_up_to_date(local, another_run, cli):
    result = cli("ls", local.url, "--replicated-to", another_run.url, *_remote_args(another_run))
    assert result.code == 3
    assert "the tiers of one run must be one run" in _one_line(result)
    assert "holds the newest local bundle" not in result.out


def test_ls_does_not_count_another_bundle_of_the_same_step_as_replicated(local, run, cli):
    run.store().ensure_run_record(local.store().run_record())  # this run's remote tier...
    run.commit(3)  # ...holding another save of step 3 than the local one
    result = cli("ls", local.url, "--replicated-to", run.url, "--json", *_remote_args(run))
    assert result.code == 0, result.err
    record = result.json()
    assert [s["replicated"] for s in record["steps"]] == [False, False, False]
    assert (record["replicated_newest"], record["not_replicated"]) == (None, [1, 2, 3])
    table = cli("ls", local.url, "--replicated-to", run.url, *_remote_args(run))
    assert "another bundle of this step on each tier" in table.out
    assert "holds no bundle of the local tier; not replicated yet: step(s) 1, 2, 3" in table.out


def test_gc_keeps_what_the_remote_tier_holds_only_as_another_bundle_of_the_step(local, run, cli):
    run.store().ensure_run_record(local.store().run_record())
    run.commit(3)
    result = cli("gc", local.url, "--keep-last", "1", "--replicated-to", run.url, *_remote_args(run))
    assert result.code == 0, result.err
    assert local.store().steps() == [1, 2, 3]


# --- the remote tier, opened one way ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["ls", "gc", "copy"])
def test_every_command_opens_the_remote_tier_fail_fast(
    command, local, s3_run_url, s3_storage_options, cli, monkeypatch
):
    import rlckpt.store

    opened: list[tuple[str, bool]] = []
    real = rlckpt.store.open_location

    def spy(url, storage_options=None, *, fail_fast=False):
        opened.append((str(url), fail_fast))
        return real(url, storage_options, fail_fast=fail_fast)

    monkeypatch.setattr(rlckpt.store, "open_location", spy)
    options = ["--dest-storage-options" if command == "copy" else "--replicated-storage-options"]
    options.append(json.dumps(s3_storage_options))
    argv = [local.url, s3_run_url] if command == "copy" else [local.url, "--replicated-to", s3_run_url]
    result = cli(command, *argv, *options)
    assert result.code == 0, result.err
    assert (s3_run_url, True) in opened
