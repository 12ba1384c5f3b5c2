"""`rlckpt train` resuming a run whose newest bundle someone forged through the store's own API: the
trainer ranks (Ray actors) refuse its policy's non-tensor item before DCP's planner could load it with
`torch.load(weights_only=False)`, and the run stops naming the item and the global (docs/security.md)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
import torch.distributed.checkpoint as dcp

from rlckpt.checkpoint import layout
from rlckpt.controller.config import TrainConfig
from rlckpt.dcp import BundleStorageWriter
from rlckpt.grpo.trainer import Trainer
from rlckpt.store import BundleStore
from support.controller import run_in_process
from support.forge import RunsCode, forge_step
from support.train_cli import RUN_TIMEOUT_S, train_command

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def test_rlckpt_train_refuses_a_policy_item_that_runs_code_before_it_runs(tmp_path, shared_ray):
    run_dir = str(tmp_path / "run")
    config = TrainConfig(run_dir=run_dir, steps=2, save_every=2)  # the CLI's defaults, trained in-process
    asyncio.run(run_in_process(config))
    store = BundleStore(run_dir)
    marker = tmp_path / "ran"
    state = Trainer(config.grpo).checkpoint_state()
    state["trainer"] = RunsCode(marker)  # DCP writes a non-tensor value as a BYTE_IO item
    scratch = BundleStore(str(tmp_path / "scratch"))
    dcp.save(state, storage_writer=BundleStorageWriter(scratch, step=1))
    policy = {rel: None for rel in store.open(2).files_under(layout.POLICY_DIR)}
    policy |= {rel: scratch.open(1).read_bytes(rel) for rel in scratch.open(1).files_under(layout.POLICY_DIR)}
    forge_step(store, 2, 4, policy)

    cmd = train_command(run_dir, 6, "--ray-address", shared_ray)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert "item 'trainer': refused to unpickle" in proc.stderr and "exec, which is not allowed" in proc.stderr
    assert not marker.exists()
