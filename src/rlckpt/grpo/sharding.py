"""Data parallelism for the GRPO trainer: FSDP2 on a CPU device mesh over a gloo group.

Every rank holds the same policy built from the seed, sharded with ``fully_shard``; each rank trains
on a contiguous slice of the step's batch and FSDP reduce-scatters the gradients. The loss of a
slice is its *sum* divided by the element count of the whole batch, and FSDP's gradient divide
factor is 1, so the summed gradients are those of the whole batch's mean: the update does not
depend on the world size except through the order of float additions (docs/sharded-policy.md,
"Exact resume").

Imports torch only; the process group is formed by the caller (``controller.ranks.trainer_rank``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlckpt.errors import InvalidBatchError


@dataclass(frozen=True)
class DataParallel:
    """This process's place in a data-parallel trainer group (the gloo group is already up)."""

    rank: int
    world_size: int
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh, 1-D over the trainer group

    @property
    def group(self) -> Any:
        """The process group of the mesh (for the metric all-reduce)."""
        return self.mesh.get_group()


def shard_policy(model: nn.Module, parallel: DataParallel) -> nn.Module:
    """Shard ``model`` in place with FSDP2 over ``parallel.mesh``; gradients are summed, never averaged."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, mesh=parallel.mesh)
    model.set_gradient_divide_factor(1.0)  # type: ignore[operator]  # an FSDPModule method after fully_shard
    model.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]  # gloo: plain sums, no PreMulSum
    return model


def rank_rows(num_rows: int, rank: int, world_size: int) -> slice:
    """The contiguous rows of a batch of ``num_rows`` that ``rank`` trains on (sizes differ by at most 1).

    Raises:
        InvalidBatchError: fewer rows than ranks (a rank with no rows would have nothing to train on).
    """
    if num_rows < world_size:
        raise InvalidBatchError(f"a batch of {num_rows} rows cannot be split over {world_size} trainer ranks")
    return slice(rank * num_rows // world_size, (rank + 1) * num_rows // world_size)


def sum_over_ranks(values: torch.Tensor, parallel: DataParallel | None) -> torch.Tensor:
    """``values`` summed over the trainer group (unchanged without one). Gloo sums in a fixed order."""
    if parallel is None or parallel.world_size == 1:
        return values
    import torch.distributed as dist

    out = values.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=parallel.group)
    return out
