"""The Checkpointer at two ranks (FSDP2 + AdamW, gloo on 127.0.0.1), on local disk and on S3 (moto): one rank's
failure fails the save on both and commits nothing, without a hang, even when it fails before the exchange or
dies; a stop asked on one rank is agreed by both; bundles move between world sizes 1 and 2 bit for bit.

The ranks run once per backend (support.checkpointer_ranks: a spawn costs seconds) and record what they
saw; each test asserts one behaviour on those records or on the store they left.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from rlckpt import Checkpointer
from rlckpt.s3local import make_s3fs
from rlckpt.store import BundleStore
from support import checkpointer_ranks as scenarios
from support.checkpointer import Trainer
from support.dcp_ranks import bitwise_equal, flat_tensors, quiet_dcp_warnings, run_ranks
from support.store_checks import debris

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@dataclass
class Ranks:
    store: BundleStore
    url: str
    options: dict[str, Any] | None
    workdir: str
    records: list[dict[str, Any]]


@pytest.fixture(scope="module", params=["local", "s3"])
def ranks(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"ckpt-ranks-{request.param}")
    if request.param == "local":
        url, options = str(base / "run"), None
    else:
        options = dict(request.getfixturevalue("s3_storage_options"))
        bucket = f"rlckpt-ckpt-{uuid.uuid4().hex[:12]}"
        make_s3fs(options).mkdir(bucket)
        url = f"s3://{bucket}/run"
    workdir = str(base / "records")
    os.makedirs(workdir)
    trainer = Trainer(seed=5)  # the ranks' model and optimizer, unsharded: world size 1
    trainer.step(1)
    with Checkpointer(url, storage_options=options) as ckpt:
        ckpt.save(1, trainer.state(), extra={"loader": {"position": 1}}, rank_extra={"rng": torch.get_rng_state()})
    torch.save(trainer.state(), os.path.join(workdir, "full_1.pt"))
    spec = scenarios.RanksSpec(url, options, workdir)
    run_ranks(scenarios.run, 2, spec, expected_exits={1: scenarios.DEAD_RANK_EXIT}, timeout=300)
    records = []
    for rank in (0, 1):
        with open(os.path.join(workdir, f"rank{rank}.json")) as f:
            records.append(json.load(f))
    yield Ranks(BundleStore(url, options), url, options, workdir, records)
    if request.param == "s3":
        make_s3fs(options).rm(url.split("/")[2], recursive=True)


def test_a_bundle_saved_at_one_rank_restores_at_two_bit_for_bit(ranks):
    assert ranks.records[0]["restore_1"]["differs"] == []  # the full state, gathered on rank 0
    for record in ranks.records:
        restored = record["restore_1"]
        assert restored["step"] == 1 and restored["saved_world_size"] == 1
        assert restored["extra"] == {"loader": {"position": 1}}
        assert restored["rank_extra"] is None  # saved by one rank: no rank of two has pieces of its own there


def test_every_rank_learns_the_same_committed_save(ranks):
    results = [record["save_2"] for record in ranks.records]
    assert results[0] == results[1] and results[0]["world_size"] == 2
    assert ranks.store.open(2).manifest.metadata["world_size"] == 2


def test_a_bundle_saved_at_two_ranks_restores_at_one_bit_for_bit_with_rank_0s_shared_pieces(ranks):
    fresh = Trainer(seed=99)
    with Checkpointer(ranks.url, storage_options=ranks.options) as ckpt:
        restored = ckpt.restore(fresh.state())  # step 6: the state of step 2, saved again after the failures
    assert restored.step == 6 and restored.saved_world_size == 2
    assert restored.extra == {"loader": {"position": 6}} and restored.rank_extra is None
    saved = flat_tensors(torch.load(os.path.join(ranks.workdir, "full_2.pt"), weights_only=True))
    assert bitwise_equal(fresh.tensors(), saved) == []


def test_a_rank_that_fails_before_the_exchange_fails_the_save_on_every_rank(ranks):
    for record in ranks.records:
        outcome = record["save_4_piece"]
        assert outcome["raised"] == "CheckpointerError"
        assert "rank 1: ExtraPieceError" in outcome["message"] and "nothing committed" in outcome["message"]


def test_a_rank_whose_write_fails_fails_the_save_on_every_rank(ranks):
    for record in ranks.records:
        outcome = record["save_4_write"]
        assert outcome["save"]["raised"] is None  # the foreground went through ...
        assert outcome["wait"]["raised"] == "CheckpointerError"  # ... the write failed, on both
        assert "injected: rank 1 fails to plan its write" in outcome["wait"]["message"]


def test_a_rank_whose_planner_cannot_be_made_fails_the_save_on_every_rank_at_once(ranks):
    """Through DCP's first collective (checkpoint/rank_save.py, shared with `rlckpt train`'s trainer ranks): the
    other rank does not wait in its write for the group's timeout, and learns why."""
    for record in ranks.records:
        outcome = record["save_4_planner"]
        assert outcome["wait"]["raised"] == "CheckpointerError"
        message = outcome["wait"]["message"]
        assert message.count("injected: rank 1 cannot make its planner") == 2, message  # rank 0's and rank 1's
        assert "timeout" not in message.lower()


def test_nothing_of_a_failed_save_is_committed_or_left_behind(ranks):
    assert 4 not in ranks.store.steps() and 8 not in ranks.store.steps()
    assert debris(ranks.store) == []


def test_a_stop_asked_on_one_rank_is_agreed_by_every_rank_at_the_same_poll(ranks):
    stops = [record["stop"] for record in ranks.records]
    assert stops[0] == stops[1] == {"before": False, "after": True, "reason": "requested"}


def test_saves_go_through_after_failed_ones(ranks):
    assert [record["save_6"]["raised"] for record in ranks.records] == [None, None]
    assert ranks.store.steps() == [1, 2, 6]


def test_a_rank_that_raises_with_a_save_in_flight_finishes_it_as_its_checkpointer_closes(ranks):
    """Rank 1 leaves its `with` block on an exception while its part of step 10 is still to be written: its close
    finishes the save; rank 0, which went on, learns the commit."""
    raised, waited = ranks.records[1]["save_10_raise"], ranks.records[0]["save_10_raise"]
    assert raised == {"raised": "injected: rank 1's next forward fails", "committed_step": 10}
    assert waited["wait"] == {"raised": None, "value": 10}
    closing = BundleStore(scenarios.RanksSpec(ranks.url, ranks.options, ranks.workdir).closing_url, ranks.options)
    assert closing.steps() == [10] and closing.open(10).manifest.metadata["world_size"] == 2


def test_a_rank_that_dies_mid_save_fails_the_save_on_the_others_without_a_hang(ranks):
    outcome = ranks.records[0]["save_8_dead_rank"]
    assert outcome["save"]["raised"] is None
    assert outcome["wait"]["raised"] == "CheckpointerError" and "nothing committed" in outcome["wait"]["message"]
    assert "rank 1 died: its connection closed" in outcome["wait"]["message"]  # not "... or did not reach ..."
