"""Resuming a run from a bundle someone forged through the store's own API (every digest matches): no
piece of it runs code, and each refusal names the file and the global (docs/security.md). The policy
attacks go through the whole resume, the in-process trainer loading its shards as a trainer rank does."""

from __future__ import annotations

import asyncio
import io
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.restore import PolicyLocation, restore_run
from rlckpt.controller.config import TrainConfig
from rlckpt.dataplane.memory import InMemoryDataPlane, InMemoryStore
from rlckpt.dcp import BundleStorageWriter
from rlckpt.errors import CheckpointError
from rlckpt.grpo import GRPOConfig
from rlckpt.grpo.trainer import Trainer
from rlckpt.store import BundleStore
from support.controller import run_in_process
from support.dcp_ranks import quiet_dcp_warnings
from support.forge import RunsCode, code_pickle, code_torch_save, forge_step

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SMALL = GRPOConfig(group_size=4, prompts_per_step=4)


class SpyTrainer:
    async def load_policy(self, location: PolicyLocation) -> None:
        pass


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> str:
    """A run dir with committed bundles at steps 2 and 4 (local disk)."""
    run_dir = str(tmp_path_factory.mktemp("trained") / "run")
    asyncio.run(run_in_process(TrainConfig(run_dir=run_dir, steps=4, save_every=2, grpo=SMALL)))
    return run_dir


@pytest.fixture
def run(trained_run, tmp_path) -> BundleStore:
    """A copy of the trained run, to forge step 6 into."""
    shutil.copytree(trained_run, tmp_path / "run")
    return BundleStore(str(tmp_path / "run"))


def resume(store: BundleStore, **overrides) -> None:
    config = TrainConfig(run_dir=store.url, steps=6, save_every=2, grpo=SMALL, **overrides)
    asyncio.run(run_in_process(config))


def restore(store: BundleStore, plane: InMemoryStore, **kwargs):
    bootstrap = InMemoryDataPlane(plane)
    return asyncio.run(restore_run(store, trainer=SpyTrainer(), bootstrap=bootstrap, phase=RestorePhase(), **kwargs))


def forged_policy(tmp_path: Path, store: BundleStore, trainer_record: object) -> dict[str, bytes | None]:
    """The changes that swap step 4's policy for one saved from a trainer state whose record is
    `trainer_record` (DCP writes a non-tensor value as a BYTE_IO item)."""
    state = Trainer(SMALL).checkpoint_state()
    state["trainer"] = trainer_record
    scratch = BundleStore(str(tmp_path / "scratch"))
    dcp.save(state, storage_writer=BundleStorageWriter(scratch, step=1))
    theirs = scratch.open(1)
    changes: dict[str, bytes | None] = {rel: None for rel in store.open(4).files_under(layout.POLICY_DIR)}
    return changes | {rel: theirs.read_bytes(rel) for rel in theirs.files_under(layout.POLICY_DIR)}


def test_resuming_a_bundle_whose_policy_metadata_runs_code_is_refused_before_it_runs(run, tmp_path):
    marker = tmp_path / "ran"
    forge_step(run, 4, 6, {f"{layout.POLICY_DIR}/.metadata": code_pickle(marker)})
    with pytest.raises(CheckpointError, match=r"step 6 .*policy/\.metadata: refused to unpickle: .*builtins\.exec"):
        resume(run)
    assert not marker.exists()


def test_resuming_a_bundle_whose_trainer_record_runs_code_is_refused_before_it_runs(run, tmp_path):
    marker = tmp_path / "ran"
    forge_step(run, 4, 6, forged_policy(tmp_path, run, RunsCode(marker)))
    with pytest.raises(CheckpointError, match=r"step 6 .*policy/__0_\d+\.distcp, item 'trainer': refused .*exec"):
        resume(run)
    assert not marker.exists()


def test_a_loader_state_that_runs_code_is_skipped_before_anything_loads(run, tmp_path):
    marker = tmp_path / "ran"
    forge_step(run, 4, 6, {layout.LOADER_FILE: code_torch_save(marker)})
    plane = InMemoryStore()
    restored = restore(run, plane)
    assert restored.step == 4 and [s.step for s in restored.skipped] == [6]
    reason = restored.skipped[0].reason
    assert "step 6: train_dataloader.pt: refused to unpickle: it asks for __builtin__.exec" in reason
    assert not marker.exists()


def test_a_loader_state_in_torchs_legacy_format_is_refused_unread(run):
    buffer = io.BytesIO()
    torch.save({"format": 1, "step": 4}, buffer, _use_new_zipfile_serialization=False)
    forge_step(run, 4, 6, {layout.LOADER_FILE: buffer.getvalue()})
    plane = InMemoryStore()
    with pytest.raises(CheckpointError, match=r"step 6: train_dataloader\.pt: refused to load: not a torch\.save"):
        restore(run, plane, resume_step=6)
    assert plane.is_empty()


def test_a_replay_index_that_runs_code_is_skipped_and_the_bundle_before_it_resumed(run, tmp_path):
    marker = tmp_path / "ran"
    forge_step(run, 4, 6, {layout.REPLAY_FILE: code_torch_save(marker)})
    restored = restore(run, InMemoryStore())
    assert restored.step == 4
    assert [s.step for s in restored.skipped] == [6]
    assert "replay_buffer_metadata.pt: refused to unpickle: it asks for __builtin__.exec" in restored.skipped[0].reason
    assert not marker.exists()
