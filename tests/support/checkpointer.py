"""Small trainer states for the Checkpointer's tests: an MLP + AdamW (plain, or FSDP2-sharded on a mesh), its
DCP state dict, and a failing DCP save planner to break a save on one rank at one exact point."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from support.dcp_ranks import flat_tensors, plain_policy, policy_state, train_step

WIDTH, DEPTH = 16, 2


class Trainer:
    """An unsharded MLP and its AdamW, trained a step at a time on batches drawn from the step."""

    def __init__(self, seed: int = 0) -> None:
        self.model, self.optim = plain_policy(WIDTH, DEPTH, seed)

    def step(self, step: int) -> None:
        train_step(self.model, self.optim, WIDTH, seed=1000 + step)

    def state(self) -> dict[str, Any]:
        """The DCP state dict (live tensors: a load writes into the model and optimizer)."""
        return policy_state(self.model, self.optim)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Copies of every tensor of the state, by dotted path."""
        return flat_tensors(self.state())


class PlannerFault(RuntimeError):
    """What FailingSavePlanner raises."""


class FailingSavePlanner(DefaultSavePlanner):
    """DCP's default planner, failing in `finish_plan` on `rank` (before that rank writes a byte): DCP then
    raises on every rank."""

    def __init__(self, rank: int = 0) -> None:
        super().__init__()
        self.rank = rank

    def finish_plan(self, new_plan: Any) -> Any:
        import torch.distributed as dist

        here = dist.get_rank() if dist.is_initialized() else 0
        if here == self.rank:
            raise PlannerFault(f"injected: rank {here} fails to plan its write")
        return super().finish_plan(new_plan)
