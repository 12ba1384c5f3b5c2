"""A Checkpointer with two tiers: local disk saves, a moto S3 remote tier replicated in the background (the same
bundle, through its own transaction), a restore from whichever tier holds the newest bundle that verifies, and
local retention that never deletes what the remote tier does not hold yet."""

from __future__ import annotations

import shutil

import pytest

from rlckpt import Checkpointer
from rlckpt.store import BundleStore, Retention
from rlckpt.tiers import BundleReplicator, ReplicationConfig, ReplicationQueue
from support.checkpointer import Trainer
from support.dcp_ranks import bitwise_equal, quiet_dcp_warnings
from support.outage import ONE_QUICK_ATTEMPT, Outage
from support.pause import PauseAt

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def tiers(tmp_path, s3_run_url, s3_storage_options):
    return str(tmp_path / "local"), s3_run_url, dict(s3_storage_options)


def _checkpointer(tiers, every=1, **settings) -> Checkpointer:
    local, remote, options = tiers
    return Checkpointer(local, replication=ReplicationConfig(remote, options, every=every), **settings)


def test_a_committed_save_is_replicated_as_the_same_bundle(tiers):
    local, remote, options = tiers
    with _checkpointer(tiers) as ckpt:
        ckpt.save(2, Trainer().state(), extra={"loader": {"position": 2}})
        ckpt.wait()
    assert ckpt.replicated == [2]  # close() waited for the replication
    assert BundleStore(remote, options).records(2) == BundleStore(local).records(2)


def test_with_the_local_tier_wiped_a_restore_takes_the_remote_copy(tiers):
    local, remote, _ = tiers
    trainer = Trainer()
    trainer.step(1)
    with _checkpointer(tiers) as ckpt:
        ckpt.save(2, trainer.state(), extra={"loader": {"position": 2}})
    shutil.rmtree(local)  # the machine is gone
    fresh = Trainer(seed=99)
    with _checkpointer(tiers) as ckpt:
        restored = ckpt.restore(fresh.state())
    assert restored.step == 2 and restored.url == remote
    assert f"{local} holds no committed bundle" in restored.why
    assert bitwise_equal(fresh.tensors(), trainer.tensors()) == []
    assert BundleStore(local).run_record() == BundleStore(remote, tiers[2]).run_record()  # still one run


def test_only_every_kth_save_and_the_last_are_replicated(tiers):
    trainer = Trainer()
    with _checkpointer(tiers, every=2, async_save=False) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, trainer.state(), last=step == 3)
    assert sorted(BundleStore(tiers[1], tiers[2]).steps()) == [2, 3]


def test_local_retention_keeps_a_bundle_the_remote_tier_does_not_hold_yet(tiers):
    local, _, _ = tiers
    trainer = Trainer()
    with PauseAt(BundleReplicator, "replicate") as copy:  # the replication of step 2 is held: not there yet
        ckpt = _checkpointer(tiers, every=2, async_save=False, retention=Retention(keep_last=1))
        ckpt.save(1, trainer.state())
        ckpt.save(2, trainer.state())  # replicated (every 2nd save); retention runs meanwhile
        copy.wait_reached()
        assert BundleStore(local).steps() == [1, 2]  # keep_last=1, but the remote tier holds neither
        copy.release()
        ckpt.close()
    assert ckpt.replicated == [2]


def test_a_remote_tier_that_refuses_every_write_fails_that_replication_and_the_next_one_catches_up(
    tmp_path, s3_run_url, s3_storage_options
):
    """The remote's server goes away after save 2 was replicated: save 4 commits locally and training goes on,
    its replication fails and `replication_failed` says why; the server is back for save 6, whose replication
    goes through. Save 4 never reaches the remote tier, and local retention keeps it."""
    local, trainer = str(tmp_path / "local"), Trainer()
    with Outage(s3_storage_options["endpoint_url"]) as outage:
        options = {**s3_storage_options, "endpoint_url": outage.endpoint, "config_kwargs": ONE_QUICK_ATTEMPT}
        replication = ReplicationConfig(s3_run_url, options)
        with Checkpointer(local, replication=replication, async_save=False, retention=Retention(keep_last=1)) as ckpt:
            with PauseAt(ReplicationQueue, "_done", when="after") as replicated:
                ckpt.save(2, trainer.state())
                replicated.wait_reached()  # step 2's replication is over and recorded
            assert ckpt.replicated == [2]
            outage.cut()
            trainer.step(1)
            with PauseAt(ReplicationQueue, "_failed", when="after") as failed_once:
                assert ckpt.save(4, trainer.state()) is not None  # committed locally, whatever the remote does
                failed_once.wait_reached()  # step 4's replication has failed, and that is recorded
            assert list(ckpt.replication_failed) == [4]
            outage.restore()
            trainer.step(2)
            ckpt.save(6, trainer.state())
        failed = ckpt.replication_failed  # close() waited for the replication of 6
    assert ckpt.replicated == [2, 6] and list(failed) == [4]
    assert f"{s3_run_url} unavailable while beginning step 4" in failed[4] and outage.endpoint in failed[4]
    remote = BundleStore(s3_run_url, s3_storage_options)
    assert remote.steps() == [2, 6]
    remote.open(6).verify()
    assert BundleStore(local).steps() == [4, 6]  # 4 is held: the remote tier does not have it
