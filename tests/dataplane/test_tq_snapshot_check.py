"""TransferQueue's own snapshot (staged/inline saves) is never handed to TQ as given: TQ's actors unpickle
it with plain pickle, so the adapter loads a vetted copy whose pickles are rlckpt's own (docs/security.md).
The forged snapshots here run code in TQ's actors if anything unpickles them unvetted."""

from __future__ import annotations

import asyncio
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.restore import PolicyLocation, restore_run
from rlckpt.controller.config import TrainConfig
from rlckpt.dataplane.rows_snapshot import ROWS_MARKER
from rlckpt.dataplane.tq_snapshot_check import vetted_copy
from rlckpt.errors import DataPlaneError, UnsafeContentError
from rlckpt.grpo import GRPOConfig
from rlckpt.store import BundleStore
from support.controller import run_in_process
from support.forge import code_pickle, forge_step
from support.tq import connect_client, reset_tq_state

P = "rollouts"
PROTO4 = b"\x80\x04"


def run(coro):
    return asyncio.run(coro)


def honest_snapshot(client, path: Path) -> None:
    """A snapshot of rows numpy can hold, a bfloat16 column it cannot (kept as tensors) and tags."""
    fields = {"x": torch.arange(6).reshape(3, 2), "y": torch.rand(3, 2).to(torch.bfloat16), "r": torch.rand(3)}
    run(client.put_samples(P, ["a", "b", "c"], fields, tags=[{"g": 1}, {"g": 2}, {"g": [3]}]))
    run(client.put_samples(P, ["a", "b"], {"advantages": torch.rand(2)}))
    run(client.clear_samples(P, ["c"]))
    run(client.save_checkpoint(path, {"step": 1}))


def storage_unit_file(snapshot: Path) -> Path:
    return next((snapshot / "simple_storage").glob("su_*.pkl"))


# --- the vetted copy (no TransferQueue running) ------------------------------------------------------


def minimal_snapshot(path: Path, units: object = ()) -> Path:
    path.mkdir()
    (path / "metadata.json").write_text(json.dumps({"storage_saved": bool(units), "user_metadata": {}}))
    (path / "controller_state.pkl").write_bytes(pickle.dumps({"controller_id": "c"}))
    if units:
        (path / "simple_storage").mkdir()
        (path / "simple_storage" / "storage_unit_info.json").write_text(json.dumps(units))
    return path


def test_a_controller_state_that_runs_code_is_refused_naming_the_file_and_the_global(tmp_path):
    source = minimal_snapshot(tmp_path / "snap")
    marker = tmp_path / "ran"
    (source / "controller_state.pkl").write_bytes(code_pickle(marker))
    with pytest.raises(UnsafeContentError, match=r"snap/controller_state\.pkl: refused to unpickle: .*builtins\.exec"):
        vetted_copy(source, tmp_path / "copy")
    assert not marker.exists()


def test_a_storage_unit_id_that_is_a_path_is_refused(tmp_path):
    source = minimal_snapshot(tmp_path / "snap", [{"position": 0, "storage_unit_id": "../../elsewhere"}])
    with pytest.raises(UnsafeContentError, match="storage_unit_info.json: not a list of storage units"):
        vetted_copy(source, tmp_path / "copy")


def test_a_storage_unit_kept_on_ssd_is_refused(tmp_path):
    """TQ's SSD format keeps values as pickled blobs beside the unit's file, loaded later: never taken."""
    source = minimal_snapshot(tmp_path / "snap", [{"position": 0, "storage_unit_id": "u"}])
    state = {"format": "transfer_queue_hybrid_storage_v1", "field_data": {}, "ssd_index": {}, "active_keys": set()}
    (source / "simple_storage" / "su_0_u.pkl").write_bytes(pickle.dumps(state))
    with pytest.raises(UnsafeContentError, match=r"su_0_u\.pkl: not an in-memory storage unit's state"):
        vetted_copy(source, tmp_path / "copy")


def test_a_snapshot_holding_the_storage_stand_in_itself_is_refused(tmp_path):
    """The stand-in for torch.storage._load_from_bytes must never reach the copy TQ loads."""
    source = minimal_snapshot(tmp_path / "snap")
    the_function = PROTO4 + b"\x8c\x0dtorch.storage\x8c\x10_load_from_bytes\x93."  # named, never called
    (source / "controller_state.pkl").write_bytes(the_function)
    with pytest.raises(UnsafeContentError, match=r"controller_state\.pkl: what it holds cannot be pickled again"):
        vetted_copy(source, tmp_path / "copy")


def test_only_the_files_tq_reads_are_copied(tmp_path):
    source = minimal_snapshot(tmp_path / "snap", [{"position": 0, "storage_unit_id": "u"}])
    (source / "simple_storage" / "su_0_u.pkl").write_bytes(pickle.dumps({"field_data": {}, "active_keys": set()}))
    (source / "simple_storage" / "su_0_u.pkl.blobs").mkdir()
    (source / "extra.pkl").write_bytes(b"anything")
    copy = vetted_copy(source, tmp_path / "copy")
    found = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
    assert found == [
        "controller_state.pkl",
        "metadata.json",
        "simple_storage/storage_unit_info.json",
        "simple_storage/su_0_u.pkl",
    ]


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(DataPlaneError, match=r"empty/metadata\.json: cannot read"):
        vetted_copy((tmp_path / "empty"), tmp_path / "copy")


# --- through the TransferQueue adapter -------------------------------------------------------------


@pytest.mark.tq
def test_an_honest_snapshot_loads_back_through_the_vetted_copy(tq_plane, tmp_path):
    honest_snapshot(tq_plane, tmp_path / "snap")
    before = run(tq_plane.get_rows(P, ["a", "b"], ["x", "y", "r", "advantages"]))
    reset_tq_state()
    restorer = connect_client()
    assert run(restorer.load_checkpoint(tmp_path / "snap")) == {"step": 1}
    after = run(restorer.get_rows(P, ["a", "b"], ["x", "y", "r", "advantages"]))
    assert run(restorer.list_sample_ids(P)) == ["a", "b"]
    for name, rows in before.items():
        assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(rows, after[name], strict=True)), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]  # the vetted copy is gone


@pytest.mark.tq
def test_a_staged_snapshot_whose_storage_unit_runs_code_is_refused_before_tq_loads_it(tq_plane, tmp_path):
    honest_snapshot(tq_plane, tmp_path / "snap")
    reset_tq_state()
    marker = tmp_path / "ran"
    unit = storage_unit_file(tmp_path / "snap")
    unit.write_bytes(code_pickle(marker))
    restorer = connect_client()
    with pytest.raises(UnsafeContentError, match=rf"{unit.name}: refused to unpickle: it asks for builtins\.exec"):
        run(restorer.load_checkpoint(tmp_path / "snap"))
    assert not marker.exists()
    assert run(restorer.is_empty())


@pytest.mark.tq
def test_a_refused_snapshot_leaves_the_client_able_to_load_an_honest_one(tq_plane, tmp_path):
    honest_snapshot(tq_plane, tmp_path / "snap")
    reset_tq_state()
    shutil.copytree(tmp_path / "snap", tmp_path / "forged")
    (tmp_path / "forged" / "controller_state.pkl").write_bytes(code_pickle(tmp_path / "ran"))
    restorer = connect_client()
    with pytest.raises(UnsafeContentError):
        run(restorer.load_checkpoint(tmp_path / "forged"))
    assert run(restorer.load_checkpoint(tmp_path / "snap")) == {"step": 1}


class SpyTrainer:
    async def load_policy(self, location: PolicyLocation) -> None:
        pass


@pytest.mark.tq
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_resuming_a_pinned_bundle_forged_into_a_tq_snapshot_that_runs_code_is_refused_before_it_runs(
    tq_plane, tmp_path
):
    """A pinned save's rows snapshot holds no pickle; the forger drops the rows marker from its
    metadata.json, which makes the restore hand the directory to TransferQueue's own loader, and adds
    a controller state that runs code."""
    config = TrainConfig(
        run_dir=str(tmp_path / "run"), steps=2, save_every=2, grpo=GRPOConfig(group_size=4, prompts_per_step=4)
    )
    asyncio.run(run_in_process(config))
    store = BundleStore(config.run_dir)
    document = json.loads(store.open(2).read_bytes(layout.DATA_PLANE_METADATA))
    assert ROWS_MARKER in document
    marker = tmp_path / "ran"
    as_tq = {"storage_saved": False, "user_metadata": document["user_metadata"]}  # the pairing checks still pass
    forge_step(
        store,
        2,
        4,
        {
            layout.DATA_PLANE_METADATA: json.dumps(as_tq).encode(),
            f"{layout.DATA_PLANE_DIR}/controller_state.pkl": code_pickle(marker),
        },
    )
    with pytest.raises(UnsafeContentError, match=r"controller_state\.pkl: refused to unpickle: .*builtins\.exec"):
        run(restore_run(store, trainer=SpyTrainer(), bootstrap=tq_plane, phase=RestorePhase(), resume_step=4))
    assert not marker.exists()
    assert run(tq_plane.is_empty())
