"""Rollout-shaped rows for the benchmarks, sized like the main job's (token-id int64 tensors dominate).

A row holds ``prompt`` and ``completion`` token ids (int64, random ids below ``vocab``, which
zstd compresses about 4x as it does real token ids), per-token ``logprobs`` (float32), a
``reward`` and the id columns the main job stores. A group is ``group_size`` such rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MiB = 1 << 20


@dataclass(frozen=True)
class RowShape:
    """Lengths of one row's tensors; the byte size of a row and a group follow from them."""

    prompt_len: int = 512
    completion_len: int = 3584
    group_size: int = 8
    vocab: int = 32_000

    @property
    def row_bytes(self) -> int:
        """Payload bytes of one row (sum of its tensors' nbytes)."""
        ids = 3 * 8  # prompt_id, sample_index, weight_version: one int64 each
        return self.prompt_len * 8 + self.completion_len * 8 + self.completion_len * 4 + 4 + ids

    @property
    def group_bytes(self) -> int:
        return self.row_bytes * self.group_size

    def groups_for(self, size_mib: float) -> int:
        """How many groups make a data plane of at least ``size_mib`` MiB (at least one)."""
        return max(1, math.ceil(size_mib * MiB / self.group_bytes))


def make_group(
    shape: RowShape, group_seq: int, weight_version: int, generator: torch.Generator
) -> list[dict[str, torch.Tensor]]:
    """Fresh random rows of one group (new tensors each call, so no two groups share bytes)."""
    rows = []
    prompt = torch.randint(0, shape.vocab, (shape.prompt_len,), dtype=torch.int64, generator=generator)
    for i in range(shape.group_size):
        rows.append(
            {
                "prompt": prompt.clone(),
                "completion": torch.randint(
                    0, shape.vocab, (shape.completion_len,), dtype=torch.int64, generator=generator
                ),
                "logprobs": -torch.rand(shape.completion_len, generator=generator) * 5,
                "reward": torch.rand(1, generator=generator),
                "prompt_id": torch.tensor([group_seq], dtype=torch.int64),
                "sample_index": torch.tensor([i], dtype=torch.int64),
                "weight_version": torch.tensor([weight_version], dtype=torch.int64),
            }
        )
    return rows
