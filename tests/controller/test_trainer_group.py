"""The trainer group on Ray: real rank actors in a gloo group (FSDP2), saving into a real transaction
as participants and loading at the same and at another world size; a rank that raises or dies mid-save.

The session's Ray cluster (the ``tq_session`` fixture) is shared; each test starts its own ranks.
"""

from __future__ import annotations

import asyncio

import pytest

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.restore import PolicyLocation
from rlckpt.controller.ranks.trainer_group import LocalTrainerGroup, TrainerGroup
from rlckpt.errors import TrainerGroupError
from rlckpt.grpo import DigitSumTask, GRPOConfig, TrainBatch
from rlckpt.store import BundleStore
from support.batches import initial_weight_batches
from support.rank_faults import FailRankSave

pytestmark = pytest.mark.slow
CONFIG = GRPOConfig(group_size=4, prompts_per_step=4)
TASK = DigitSumTask(seed=0)


BATCHES = initial_weight_batches(CONFIG, TASK, 4)


async def _save(group, store: BundleStore, step: int, *, train_between: TrainBatch | None = None) -> None:
    """One save as the controller makes it: stage on every rank, (train), write, commit the receipts."""
    staged = await group.stage_policy()
    if train_between is not None:  # the staged copy must not see this step
        await group.train_step(train_between)
    txn = store.begin(step)
    try:
        receipts = await staged.write(txn)
    except BaseException:
        txn.abort()
        raise
    txn.commit({}, receipts=receipts, participants={f"rank{r}" for r in range(group.world_size)})


@pytest.fixture
def ray_up(tq_session):
    """The session's Ray cluster (started with TransferQueue; only Ray is used here)."""
    return tq_session


def test_two_ranks_save_while_training_on_and_reload_bit_identical_at_world_size_2_and_1(ray_up, tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    group = TrainerGroup(CONFIG, ranks=2, timeout_s=120)
    try:
        handle = group.handle
        for batch in BATCHES[:2]:
            asyncio.run(handle.train_step(batch))
        saved_sha = asyncio.run(handle.policy_sha256())
        asyncio.run(_save(handle, store, 2, train_between=BATCHES[2]))
        assert asyncio.run(handle.policy_sha256()) != saved_sha  # it trained on after staging
        files = store.open(2).manifest.files
        assert {f"{layout.POLICY_DIR}/.metadata", f"{layout.POLICY_DIR}/__0_0.distcp"} <= set(files)
        assert f"{layout.POLICY_DIR}/__1_0.distcp" in files
        asyncio.run(handle.train_step(BATCHES[3]))
        continued = asyncio.run(handle.policy_sha256())
    finally:
        group.shutdown()

    location = PolicyLocation(store.url, {}, 2)
    again = TrainerGroup(CONFIG, ranks=2, timeout_s=120)  # same world size: bit-identical continuation
    try:
        asyncio.run(again.load_policy(location))
        assert asyncio.run(again.handle.policy_sha256()) == saved_sha
        asyncio.run(again.handle.train_step(BATCHES[2]))
        asyncio.run(again.handle.train_step(BATCHES[3]))
        assert asyncio.run(again.handle.policy_sha256()) == continued
    finally:
        again.shutdown()

    alone = LocalTrainerGroup(CONFIG)  # world size 1: the full state as saved, and it trains on
    asyncio.run(alone.load_policy(location))
    assert asyncio.run(alone.policy_sha256()) == saved_sha
    assert alone.rank.trainer.weight_version == 2
    asyncio.run(alone.train_step(BATCHES[2]))
    assert alone.rank.trainer.weight_version == 3


def test_a_rank_that_raises_mid_save_aborts_it_and_the_group_saves_again(ray_up, tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    group = TrainerGroup(CONFIG, ranks=2, timeout_s=120, save_planner=FailRankSave(step=2, rank=1, how="raise"))
    try:
        handle = group.handle
        asyncio.run(handle.train_step(BATCHES[0]))
        asyncio.run(_save(handle, store, 1))
        asyncio.run(handle.train_step(BATCHES[1]))
        with pytest.raises(TrainerGroupError, match=r"writing the policy of step 2 .*rank 1: InjectedRankFault"):
            asyncio.run(_save(handle, store, 2))
        assert store.steps() == [1] and store.latest() == 1
        asyncio.run(handle.train_step(BATCHES[2]))  # --save-failure continue: the group trains on
        asyncio.run(_save(handle, store, 3))
        assert store.steps() == [1, 3]
        store.open(3).verify()
    finally:
        group.shutdown()


def test_a_rank_whose_planner_cannot_be_made_fails_the_write_on_every_rank_at_once(ray_up, tmp_path):
    """Through DCP's first collective (checkpoint/rank_save.py, shared with the Checkpointer's ranks): the other
    rank does not wait in its write for the group's timeout, and learns why."""
    store = BundleStore(str(tmp_path / "run"))
    group = TrainerGroup(CONFIG, ranks=2, timeout_s=120, save_planner=FailRankSave(step=1, rank=1, how="refuse"))
    try:
        handle = group.handle
        asyncio.run(handle.train_step(BATCHES[0]))
        with pytest.raises(TrainerGroupError, match=r"failed on 2 of 2 trainer ranks") as failed:
            asyncio.run(_save(handle, store, 1))
        assert str(failed.value).count("injected: no planner for step 1") == 2  # rank 0 names rank 1's cause
        assert store.steps() == []
    finally:
        group.shutdown()


def test_a_rank_that_dies_mid_save_aborts_it_without_hanging_and_the_previous_bundle_loads(ray_up, tmp_path):
    store = BundleStore(str(tmp_path / "run"))
    group = TrainerGroup(CONFIG, ranks=2, timeout_s=120, save_planner=FailRankSave(step=2, rank=1, how="exit"))
    try:
        handle = group.handle
        asyncio.run(handle.train_step(BATCHES[0]))
        asyncio.run(_save(handle, store, 1))
        saved_sha = asyncio.run(handle.policy_sha256())
        asyncio.run(handle.train_step(BATCHES[1]))
        with pytest.raises(TrainerGroupError, match=r"rank 1: died"):
            asyncio.run(_save(handle, store, 2))
        with pytest.raises(TrainerGroupError, match=r"rank 1: died"):
            asyncio.run(handle.train_step(BATCHES[2]))  # a dead rank ends the group, loudly
    finally:
        group.shutdown()
    assert store.latest() == 1 and [e.step for e in store.entries() if e.state == "committed"] == [1]
    alone = LocalTrainerGroup(CONFIG)
    asyncio.run(alone.load_policy(PolicyLocation(store.url, {}, 1)))
    assert asyncio.run(alone.policy_sha256()) == saved_sha
