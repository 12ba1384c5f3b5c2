"""One replication: the committed bundle copied into the remote tier, then the remote tier's own retention."""

from __future__ import annotations

import pytest

from rlckpt.errors import CorruptBundleError
from rlckpt.store import BundleStore, Retention
from rlckpt.tiers import BundleReplicator, ReplicationConfig
from support.store_checks import corrupt_file, debris, save_sample


@pytest.fixture
def local(tmp_path) -> BundleStore:
    store = BundleStore(str(tmp_path / "local"))
    for step in (2, 4, 6):
        save_sample(store, step)
    return store


def test_a_replication_copies_the_bundle_and_applies_the_remote_retention(local, store_location):
    url, options = store_location
    config = ReplicationConfig(url, options, retention=Retention(keep_last=2))
    replicator = BundleReplicator(local.url, None, config)
    reports = [replicator.replicate(step) for step in (2, 4, 6)]
    assert [r.remote_deleted for r in reports] == [[], [], [2]]
    remote = BundleStore(url, options)
    assert remote.steps() == [4, 6]
    assert remote.records(6) == local.records(6)


def test_a_replication_takes_unchanged_files_from_the_remote_tiers_previous_bundle(tmp_path, store_location):
    """A frozen file crosses to the remote tier once: the next replication takes it from the bundle there."""
    local = BundleStore(str(tmp_path / "reusing"))
    for step in (2, 4):
        with local.begin(step, reuse=True) as txn:
            txn.write_bytes("policy/frozen.bin", b"f" * 50_000)
            txn.write_bytes("policy/live.bin", bytes([step]) * 1000)
            txn.commit()
    url, options = store_location
    replicator = BundleReplicator(local.url, None, ReplicationConfig(url, options, retention=Retention(keep_last=1)))
    first, second = (replicator.replicate(step).copy for step in (2, 4))
    assert (first.reused_files, first.copied_files) == (0, 2)
    assert (second.reused_files, second.reused_bytes, second.copied_files) == (1, 50_000, 1)
    remote = BundleStore(url, options)
    assert remote.steps() == [4]  # the bundle it took from is gone; the replica stays whole
    remote.open(4).verify()
    assert remote.open(4).read_bytes("policy/frozen.bin") == b"f" * 50_000


def test_a_replication_of_a_corrupt_local_bundle_fails_and_leaves_the_remote_as_it_was(local, store_location):
    url, options = store_location
    replicator = BundleReplicator(local.url, None, ReplicationConfig(url, options))
    replicator.replicate(2)
    corrupt_file(local, 4, "policy/optim.bin", "truncate")
    with pytest.raises(CorruptBundleError, match="policy/optim.bin"):
        replicator.replicate(4)
    remote = BundleStore(url, options)
    assert remote.steps() == [2] and debris(remote) == []


@pytest.mark.parametrize(
    ("step", "save_every", "last", "due"),
    [(4, 2, False, True), (6, 2, False, False), (8, 2, False, True), (7, 2, True, True), (2, 2, False, False)],
)
def test_every_kth_save_period_and_the_last_save_are_due(step, save_every, last, due):
    assert ReplicationConfig("s3://b/run", every=2).due(step, save_every, last) is due
