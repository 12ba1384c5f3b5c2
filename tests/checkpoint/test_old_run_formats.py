"""Bundles written by older rlckpt versions resume with today's: tests/fixtures/run_format_1 and _2, made
by the old code (tests/fixtures/README.md), read piece by piece in the format each was written in, and
their one-file policy loaded into trainer ranks at any count as the state the old run saved."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from rlckpt.checkpoint import codec, layout
from rlckpt.checkpoint.phase import Phase, RestorePhase
from rlckpt.checkpoint.restore import restore_run
from rlckpt.checkpoint.run_format import INDEX_1_COMMIT_FIELDS
from rlckpt.controller.ranks.trainer_group import LocalTrainerGroup
from rlckpt.dataplane.memory import InMemoryDataPlane
from rlckpt.dataplane.snapshot_metadata import read_snapshot_metadata
from rlckpt.errors import CheckpointError
from rlckpt.grpo import Trainer
from rlckpt.replay import REPLAY_INDEX_FORMAT, DataPlaneCheckpointBarrier, ReplayBuffer
from rlckpt.store import BundleStore
from support.dcp_ranks import bitwise_equal, flat_tensors, full_state, run_ranks
from support.old_bundles import (
    CONFIG,
    SAVED_STEP,
    OldBundle,
    load_whole_policy_into_ranks,
    whole_policy_location,
)
from support.tq import restore_in_fresh_cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OLD = {n: OldBundle(FIXTURES / f"run_format_{n}", n) for n in (1, 2)}
FORMAT_1_ASYNC = OldBundle(FIXTURES / "run_format_1_async", 1)  # rows in TransferQueue, replay index format 1


class SpyTrainer:
    """Records where the restore told the trainer ranks to load the policy from."""

    def __init__(self) -> None:
        self.loaded: list[Any] = []

    async def load_policy(self, location: Any) -> None:
        self.loaded.append(location)


class TransferQueueSpy:
    """The bootstrap client, for what the restore hands it: TransferQueue's own snapshot is pickles that
    only TransferQueue loads (the end-to-end tests do), so this keeps the files it was given and answers
    with their metadata, as ``TransferQueueClient.load_checkpoint`` does."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    async def load_checkpoint(self, local_dir: str | Path) -> dict[str, Any]:
        root = Path(local_dir)
        self.files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        return read_snapshot_metadata(root)


def _restore(run_dir: str, **kw: Any) -> tuple[Any, SpyTrainer, TransferQueueSpy, RestorePhase]:
    trainer, plane, phase = SpyTrainer(), TransferQueueSpy(), RestorePhase()
    result = asyncio.run(restore_run(BundleStore(run_dir), trainer=trainer, bootstrap=plane, phase=phase, **kw))  # type: ignore[arg-type]
    return result, trainer, plane, phase


@pytest.mark.parametrize("run_format", [1, 2])
def test_an_old_bundle_restores_its_whole_policy_loader_and_transferqueue_snapshot(run_format, tmp_path):
    old = OLD[run_format]
    run_dir = old.copy_run(tmp_path)
    result, trainer, plane, phase = _restore(run_dir, expected_rollout_order="in_order")
    assert result.step == SAVED_STEP and phase.state is Phase.RESTORED
    assert trainer.loaded == [whole_policy_location(run_dir)]
    assert result.loader_state["step"] == SAVED_STEP and result.loader_state["draws"] == old.summary()["drawn"]
    snapshot = Path(run_dir) / f"step_{SAVED_STEP}" / layout.DATA_PLANE_DIR
    assert plane.files == {
        str(p.relative_to(snapshot)): p.read_bytes() for p in sorted(snapshot.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize("run_format", [1, 2])
def test_an_old_bundles_replay_index_loads_in_todays_format_under_the_digest_restore_hands_on(run_format, tmp_path):
    result, _, _, _ = _restore(OLD[run_format].copy_run(tmp_path))
    assert result.replay_state["format"] == REPLAY_INDEX_FORMAT
    replay = ReplayBuffer(InMemoryDataPlane(), DataPlaneCheckpointBarrier(), partition_id="rollouts", group_size=8)
    replay.load_state_dict(result.replay_state, expected_digest=result.index_digest)
    assert len(replay) == result.group_count == 8
    assert [g.group_id for g in replay.pending_groups()] == sorted(result.loader_state["pending"])


def test_a_format_1_bundle_names_its_rollout_order_mode_and_is_held_to_it(tmp_path):
    with pytest.raises(CheckpointError, match="saved with rollout order 'in_order'.*--mode in_order"):
        _restore(OLD[1].copy_run(tmp_path), expected_rollout_order="async")


@pytest.mark.parametrize("run_format", [1, 2])
def test_an_old_whole_policy_loads_in_one_process_as_the_state_the_old_run_saved(run_format, tmp_path):
    run_dir = OLD[run_format].copy_run(tmp_path)
    alone = LocalTrainerGroup(CONFIG)  # world size 1 without a group: the trainer unsharded
    asyncio.run(alone.load_policy(whole_policy_location(run_dir)))
    assert asyncio.run(alone.policy_sha256()) == OLD[run_format].summary()["policy_sha256"]
    assert alone.rank.trainer.weight_version == SAVED_STEP


def _saved_full_state(run_dir: str) -> dict[str, torch.Tensor]:
    """The old bundle's whole policy file as an unsharded trainer holds it (model and AdamW state)."""
    data = BundleStore(run_dir).open(SAVED_STEP).read_bytes(layout.POLICY_FILE)
    trainer = Trainer(CONFIG)
    trainer.load_state_dict(codec.loads(data, origin=layout.POLICY_FILE))
    return flat_tensors(full_state(trainer.model, trainer.optimizer))


@pytest.mark.parametrize(("run_format", "ranks"), [(1, 1), (1, 2), (2, 2)])
def test_an_old_whole_policy_loads_into_sharded_ranks_as_the_state_the_old_run_saved(run_format, ranks, tmp_path):
    run_dir = OLD[run_format].copy_run(tmp_path)
    out = tmp_path / "loaded.pt"
    run_ranks(load_whole_policy_into_ranks, ranks, run_dir, str(out), timeout=180)
    loaded = torch.load(out, weights_only=True)
    assert loaded["sha"] == OLD[run_format].summary()["policy_sha256"]
    assert loaded["version"] == SAVED_STEP
    assert bitwise_equal(loaded["full"], _saved_full_state(run_dir)) == []


def test_a_format_1_index_gives_its_committed_groups_the_columns_the_old_run_committed(tmp_path):
    result, _, _, _ = _restore(FORMAT_1_ASYNC.copy_run(tmp_path))
    committed = [g for g in result.replay_state["groups"] if g["sample_ids"]]
    assert len(committed) == 8 and all(g["fields"] == sorted(INDEX_1_COMMIT_FIELDS) for g in committed)
    assert all(g["fields"] == [] for g in result.replay_state["groups"] if not g["sample_ids"])


@pytest.mark.slow
def test_the_old_runs_rows_in_transferqueue_hold_exactly_the_columns_a_format_1_index_is_given(tmp_path):
    """The columns ``INDEX_1_COMMIT_FIELDS`` names are checked against the old rows themselves: the
    snapshot, restored into a real TransferQueue (a fresh Ray cluster in a subprocess), read back."""
    run_dir = FORMAT_1_ASYNC.copy_run(tmp_path)
    snapshot = tmp_path / "snapshot"
    BundleStore(run_dir).open(SAVED_STEP).get_dir(layout.DATA_PLANE_DIR, snapshot)  # digest-checked
    report = restore_in_fresh_cluster(snapshot, tmp_path / "report.pt", partition_id="rollouts")
    result, _, _, _ = _restore(run_dir)
    assert sorted(report["sample_ids"]) == sorted(s for g in result.replay_state["groups"] for s in g["sample_ids"])
    assert sorted(report["rows"]) == sorted(INDEX_1_COMMIT_FIELDS)
