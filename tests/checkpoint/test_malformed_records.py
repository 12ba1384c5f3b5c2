"""A bundle whose digests all match but one of whose records does not read (a field of another type,
missing, unknown) does not verify: restore refuses it before anything is installed — no policy loaded, no
row put back — naming the file, the record and the field, and a resume passes over it to the one before."""

from __future__ import annotations

import asyncio
import json
import shutil
import struct

import pytest
import torch

from rlckpt.checkpoint import codec, layout
from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.restore import PolicyLocation, restore_run
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.loop_state import LOADER_STATE_FORMATS
from rlckpt.dataplane.memory import InMemoryDataPlane, InMemoryStore
from rlckpt.dataplane.rows_snapshot import encode_rows
from rlckpt.errors import CheckpointError, CorruptBundleError
from rlckpt.grpo import GRPOConfig
from rlckpt.store import BundleStore
from support.controller import run_in_process
from support.dcp_ranks import quiet_dcp_warnings
from support.forge import forge_step

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SMALL = GRPOConfig(group_size=4, prompts_per_step=4)


class SpyTrainer:
    def __init__(self) -> None:
        self.loaded: list[PolicyLocation] = []

    async def load_policy(self, location: PolicyLocation) -> None:
        self.loaded.append(location)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> str:
    """A run dir with committed bundles at steps 2 and 4 (local disk, pinned saves: rows snapshots)."""
    run_dir = str(tmp_path_factory.mktemp("trained") / "run")
    asyncio.run(run_in_process(TrainConfig(run_dir=run_dir, steps=4, save_every=2, grpo=SMALL)))
    return run_dir


@pytest.fixture
def run(trained_run, tmp_path) -> BundleStore:
    shutil.copytree(trained_run, tmp_path / "run")
    return BundleStore(str(tmp_path / "run"))


def restore(store: BundleStore):
    """restore_run as `rlckpt train` calls it."""
    bootstrap = InMemoryDataPlane(InMemoryStore())
    return asyncio.run(
        restore_run(
            store, trainer=SpyTrainer(), bootstrap=bootstrap, phase=RestorePhase(), loader_formats=LOADER_STATE_FORMATS
        )
    )


def refused_pinned(store: BundleStore, step: int) -> str:
    """`--resume-step step` is refused with the bundle's record error as cause, nothing installed."""
    trainer, plane = SpyTrainer(), InMemoryStore()
    with pytest.raises(CheckpointError, match=f"cannot resume step {step}") as refused:
        asyncio.run(
            restore_run(
                store,
                trainer=trainer,
                bootstrap=InMemoryDataPlane(plane),
                phase=RestorePhase(),
                resume_step=step,
                loader_formats=LOADER_STATE_FORMATS,
            )
        )
    assert isinstance(refused.value.__cause__, CorruptBundleError)
    assert trainer.loaded == [] and plane.is_empty()
    return str(refused.value)


def edited(store: BundleStore, rel: str, edit) -> bytes:
    """Step 4's torch.save piece `rel` with `edit` applied to its state."""
    state = codec.loads(store.open(4).read_bytes(rel), origin=rel)
    edit(state)
    return codec.dumps(state)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (
            lambda g: g.__setitem__("target_step", torch.tensor(3)),
            "target_step: expected int or null, got torch.Tensor",
        ),
        (lambda g: g.__setitem__("payload", torch.zeros(4)), "payload: unknown field (the group is a closed record)"),
    ],
    ids=["tensor-target-step", "tensor-payload"],
)
def test_a_replay_index_whose_group_carries_a_tensor_is_refused_naming_the_group_and_the_field(run, edit, problem):
    forge_step(run, 4, 6, {layout.REPLAY_FILE: edited(run, layout.REPLAY_FILE, lambda s: edit(s["groups"][1]))})
    message = refused_pinned(run, 6)
    gid = codec.loads(run.open(6).read_bytes(layout.REPLAY_FILE), origin="x")["groups"][1]["group_id"]
    assert f"step 6: {layout.REPLAY_FILE}: replay index: groups[1].{problem} (in the group {gid!r})" in message
    restored = restore(run)  # without a pinned step: the bundle before it
    assert restored.step == 4 and [s.step for s in restored.skipped] == [6]


def test_a_loader_state_of_another_type_is_refused_before_anything_loads(run):
    forge_step(run, 4, 6, {layout.LOADER_FILE: edited(run, layout.LOADER_FILE, lambda s: s.update(step=4.0))})
    message = refused_pinned(run, 6)
    assert f"step 6: {layout.LOADER_FILE}: loader state: step: expected int ≥ 0, got float" in message


def test_data_plane_metadata_missing_a_field_is_refused_naming_it(run):
    document = json.loads(run.open(4).read_bytes(layout.DATA_PLANE_METADATA))
    del document["user_metadata"]["partition_id"]
    forge_step(run, 4, 6, {layout.DATA_PLANE_METADATA: json.dumps(document).encode()})
    message = refused_pinned(run, 6)
    assert f"step 6: {layout.DATA_PLANE_METADATA}: data-plane metadata: partition_id: missing" in message


def test_a_rows_file_whose_header_does_not_read_is_refused_before_any_row_goes_back(run):
    rows = encode_rows(["g00000099:0"], {"reward": [torch.zeros(1)]})
    head_len = struct.unpack_from("<Q", rows, 8)[0]
    header = json.loads(rows[16 : 16 + head_len])
    header["keys"][0] = 7
    head = json.dumps(header).encode()
    document = json.loads(run.open(4).read_bytes(layout.DATA_PLANE_METADATA))
    document["rlckpt_rows"]["files"].append("rows-000099.bin")  # after the bundle's own (if it has any)
    forge_step(
        run,
        4,
        6,
        {
            f"{layout.DATA_PLANE_DIR}/rows-000099.bin": rows[:8]
            + struct.pack("<Q", len(head))
            + head
            + rows[16 + head_len :],
            layout.DATA_PLANE_METADATA: json.dumps(document).encode(),
        },
    )
    message = refused_pinned(run, 6)
    assert "rows-000099.bin: rows header: keys[0]: expected str, got int" in message
