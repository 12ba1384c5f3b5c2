"""The Checkpointer in a one-rank gloo group in this process: every exchange goes through torch.distributed
(JSON in tensors over its own groups), on local disk and on S3 (moto)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from rlckpt import Checkpointer
from rlckpt.checkpointer import SaveAndStop
from rlckpt.s3local import free_port
from support.checkpointer import Trainer
from support.dcp_ranks import GROUP_TIMEOUT, bitwise_equal, quiet_dcp_warnings

quiet_dcp_warnings()


@pytest.fixture
def one_rank_group():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=GROUP_TIMEOUT
    )
    yield
    dist.destroy_process_group()


def test_a_save_and_restore_through_the_groups_round_trip(one_rank_group, store_location):
    url, options = store_location
    trainer = Trainer()
    trainer.step(1)
    with Checkpointer(url, storage_options=options) as ckpt:
        assert ckpt.ranks.distributed and ckpt.world_size == 1
        ckpt.save(2, trainer.state(), extra={"loader": {"position": 2}}, rank_extra={"seed": 7})
        assert ckpt.wait().step == 2
    fresh = Trainer(seed=99)
    with Checkpointer(url, storage_options=options) as ckpt:
        restored = ckpt.restore(fresh.state())
    assert restored.extra == {"loader": {"position": 2}} and restored.rank_extra == {"seed": 7}
    assert bitwise_equal(fresh.tensors(), trainer.tensors()) == []


def test_a_stop_is_agreed_through_the_control_group(one_rank_group, tmp_path):
    with Checkpointer(str(tmp_path / "run")) as ckpt:
        stop = SaveAndStop(ckpt)
        assert not stop.should_stop()
        stop.request()
        assert stop.should_stop() and stop.reason == "requested"


def test_closing_the_checkpointer_destroys_its_two_groups_and_an_exchange_after_it_is_refused(one_rank_group, tmp_path):
    """Its groups end with it, not at the interpreter's exit (where a gloo group's worker thread aborted the
    process now and then); the default group never stands in for them afterwards."""
    from rlckpt.errors import RankGroupError

    ckpt = Checkpointer(str(tmp_path / "run"))
    groups = [ckpt.ranks.save_group, ckpt.ranks.control_group]
    ranks = ckpt.ranks
    ckpt.close()

    for group in groups:
        with pytest.raises(KeyError):  # torch no longer knows the group
            dist.get_process_group_ranks(group)
    with pytest.raises(RankGroupError, match="the Checkpointer's groups are closed"):
        ranks.broadcast({"x": 1}, ranks.save_group, "a late exchange")
