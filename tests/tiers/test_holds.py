"""While replication is on, the local tier's retention keeps every bundle newer than the newest one the remote
tier holds as *that bundle of this run* (the same run and manifest digest in COMMIT), as read from the remote
store itself; what is older was superseded by that replica and may go by the rules. Another run's bundles, or
another bundle of the same step, prove nothing replicated."""

from __future__ import annotations

import pytest

from rlckpt.store import BundleStore, Retention, copy_bundle
from rlckpt.tiers import replication_holds
from support.store_checks import declare_writers_dead, save_sample


@pytest.fixture
def tiers(store_location, tmp_path) -> tuple[BundleStore, BundleStore]:
    """(local tier with bundles 2, 4, 6, 8; remote tier, empty)."""
    local = BundleStore(str(tmp_path / "local"))
    for step in (2, 4, 6, 8):
        save_sample(local, step)
    return local, BundleStore(*store_location)


def test_with_an_empty_remote_every_local_bundle_is_held(tiers):
    local, remote = tiers
    assert sorted(replication_holds(local, remote)) == [2, 4, 6, 8]


def test_bundles_newer_than_the_newest_replica_are_held_and_older_ones_are_not(tiers):
    local, remote = tiers
    copy_bundle(local, 4, remote)
    holds = replication_holds(local, remote)
    assert sorted(holds) == [6, 8]
    assert holds[6] == f"not yet replicated to {remote.url} (the newest it holds: this run's bundle of step 4)"


def test_a_remote_of_another_run_with_a_newer_step_holds_every_local_bundle(tiers):
    local, remote = tiers
    save_sample(remote, 100)  # another run's bundle (its own _run.json), newer than anything local
    holds = replication_holds(local, remote)
    assert sorted(holds) == [2, 4, 6, 8]
    assert holds[2] == f"not yet replicated to {remote.url} (the newest it holds: no bundle of this run)"


def test_another_runs_bundle_of_the_same_step_is_not_a_replica(tiers):
    local, remote = tiers
    save_sample(remote, 8)  # step 8 there: same step number, another run and another manifest digest
    assert sorted(replication_holds(local, remote)) == [2, 4, 6, 8]


def test_another_bundle_of_the_same_step_in_this_run_is_not_a_replica(tiers):
    local, remote = tiers
    remote.ensure_run_record(local.run_record())  # the remote tier is this run's
    save_sample(remote, 8)  # but its step 8 is another save than the local one (another digest)
    copy_bundle(local, 4, remote)
    assert sorted(replication_holds(local, remote)) == [6, 8]


def test_a_bundle_being_copied_to_the_remote_is_held(tiers):
    local, remote = tiers
    copy_bundle(local, 6, remote)
    with remote.begin(2, txid=local.records(2).manifest.txid):  # a copy of step 2 under way
        holds = replication_holds(local, remote)
    assert holds[2] == f"being replicated to {remote.url}"
    assert 4 not in holds


def test_another_writer_of_a_remote_step_does_not_hold_the_local_bundle(tiers):
    local, remote = tiers
    copy_bundle(local, 6, remote)
    with remote.begin(2):  # a writer of step 2 there, of another bundle
        assert 2 not in replication_holds(local, remote)


def test_pending_steps_are_held(tiers):
    local, remote = tiers
    copy_bundle(local, 8, remote)
    assert sorted(replication_holds(local, remote, pending=[4])) == [4]


def test_local_retention_does_not_delete_a_bundle_not_yet_replicated(tiers):
    local, remote = tiers
    copy_bundle(local, 4, remote)
    report = local.gc(retention=Retention(keep_last=1, holds=replication_holds(local, remote)))
    assert (report.kept_steps, report.deleted_steps) == ([6, 8], [2, 4])  # 4 is there; 2 was superseded
    assert report.kept_reasons[6].startswith("not yet replicated")


def test_local_retention_with_a_remote_of_another_run_deletes_nothing(tiers):
    local, remote = tiers
    save_sample(remote, 100)
    report = local.gc(retention=Retention(keep_last=1, holds=replication_holds(local, remote)))
    assert (report.kept_steps, report.deleted_steps) == ([2, 4, 6, 8], [])


def test_a_copy_whose_process_died_does_not_hold_the_local_bundle(tiers):
    local, remote = tiers
    copy_bundle(local, 6, remote)
    copy = remote.begin(2, txid=local.records(2).manifest.txid)  # a copy of step 2, then its process died
    declare_writers_dead(remote)
    assert 2 not in replication_holds(local, remote)
    copy.abort()
