"""While replication is on, the local tier's retention keeps every bundle the remote tier does not hold yet,
as read from the remote store itself; what the remote holds, or what a newer replica superseded, may go."""

from __future__ import annotations

import pytest

from rlckpt.store import BundleStore, Retention, copy_bundle
from rlckpt.testing.store_checks import declare_writers_dead, save_sample
from rlckpt.tiers import replication_holds


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
    assert holds[6] == f"not yet replicated to {remote.url} (it holds up to step 4)"


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


def test_a_copy_whose_process_died_does_not_hold_the_local_bundle(tiers):
    local, remote = tiers
    copy_bundle(local, 6, remote)
    copy = remote.begin(2, txid=local.records(2).manifest.txid)  # a copy of step 2, then its process died
    declare_writers_dead(remote)
    assert 2 not in replication_holds(local, remote)
    copy.abort()
