"""The tiers of a run are one run: a tier without a run record takes the other's (a local disk wiped with its
machine takes the run's identity back from S3), and two tiers naming different runs are refused before
anything is written."""

from __future__ import annotations

import pytest

from rlckpt.errors import RunIdentityError
from rlckpt.store import BundleStore
from rlckpt.tiers import one_run
from support.store_checks import all_paths, save_sample


@pytest.fixture
def tiers(store_location, tmp_path) -> tuple[BundleStore, BundleStore]:
    """(local tier, remote tier), both empty."""
    return BundleStore(str(tmp_path / "local")), BundleStore(*store_location)


def test_a_wiped_local_tier_takes_the_remote_tiers_run_record(tiers):
    local, remote = tiers
    save_sample(remote, 4)
    one_run([local, remote])
    assert local.run_record() == remote.run_record() is not None


def test_a_new_remote_tier_takes_the_local_tiers_run_record(tiers):
    local, remote = tiers
    save_sample(local, 2)
    one_run([local, remote])
    assert BundleStore(remote.url, remote.storage_options).run_record() == local.run_record()


def test_two_tiers_of_different_runs_are_refused_and_neither_is_touched(tiers):
    local, remote = tiers
    save_sample(local, 2)
    save_sample(remote, 4)
    before = (all_paths(local), all_paths(remote))
    with pytest.raises(RunIdentityError, match="must be one run"):
        one_run([local, remote])
    assert (all_paths(local), all_paths(remote)) == before


def test_tiers_without_any_run_record_are_left_as_they_are(tiers):
    local, remote = tiers
    one_run([local, remote])
    assert local.run_record() is None and remote.run_record() is None


def test_a_tier_whose_run_record_is_gone_is_the_run_its_newest_commit_names(tiers):
    local, remote = tiers
    save_sample(local, 2)
    save_sample(remote, 4)  # another run's bundle
    remote.fs.rm_file(f"{remote.root}/_run.json")  # its record is gone; its COMMIT still names its run
    fresh = BundleStore(remote.url, remote.storage_options)
    before = all_paths(fresh)
    with pytest.raises(RunIdentityError, match="the COMMIT of its step 4 names it"):
        one_run([local, fresh])
    assert all_paths(fresh) == before  # the local run's record is not written into it
