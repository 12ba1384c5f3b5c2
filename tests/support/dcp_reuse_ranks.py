"""Two FSDP2 ranks that save a policy with a frozen first layer twice, with reuse and compression on (the
ranks of tests/dcp/test_reuse_policy.py): between the saves only the trainable layers and their moments change."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from rlckpt.dcp import BundleStorageWriter
from support.dcp_ranks import full_state, mlp, policy_state, process_group, quiet_dcp_warnings, train_step

# fp32 768 x 768: 2.4 MB a weight, 1.2 MB a rank's shard of it at two ranks: a file of its own with reuse on
WIDTH, DEPTH = 768, 3


@dataclass(frozen=True)
class ReuseSpec:
    url: str
    storage_options: dict[str, Any] | None
    workdir: str


def frozen_first_layer(model: torch.nn.Sequential) -> torch.optim.Optimizer:
    """Freeze the model's first layer; AdamW over the rest (the frozen layer then has no moments)."""
    for param in model[0].parameters():
        param.requires_grad_(False)
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)


def save_twice(rank: int, world_size: int, port: int, spec: ReuseSpec) -> None:
    from torch.distributed.fsdp import fully_shard

    quiet_dcp_warnings()
    with process_group(rank, world_size, port) as mesh:
        model = mlp(WIDTH, DEPTH, seed=3)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optim = frozen_first_layer(model)
        for step in (1, 2):
            train_step(model, optim, WIDTH, seed=step)
            writer = BundleStorageWriter(
                spec.url, step=step, storage_options=spec.storage_options, reuse=True, compression="on"
            )
            dcp.save(policy_state(model, optim), storage_writer=writer)
        full = full_state(model, optim)
        if rank == 0:
            torch.save(full, os.path.join(spec.workdir, "full_2.pt"))
