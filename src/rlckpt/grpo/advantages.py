"""Group-normalized advantages: each sample's reward relative to its own prompt group."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlckpt.errors import InvalidBatchError

DEFAULT_EPS = 1e-6


def group_advantages(rewards: Sequence[float] | torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """``(r - mean) / (std + eps)`` over one group, population std; float32 [G].

    A group whose rewards are all equal gets all-zero advantages (it carries no signal).
    """
    values = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    if values.numel() == 0:
        raise InvalidBatchError("group_advantages got an empty group")
    if bool((values == values[0]).all()):  # exact zeros, not rounding noise / eps
        return torch.zeros(values.numel(), dtype=torch.float32)
    centred = values - values.mean()
    std = values.std(correction=0)
    return (centred / (std + eps)).float()


def grouped_advantages(rewards: torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """Advantages for a [num_groups, G] reward matrix, each row normalized on its own."""
    if rewards.dim() != 2:
        raise InvalidBatchError(f"grouped_advantages wants [num_groups, G], got shape {tuple(rewards.shape)}")
    return torch.stack([group_advantages(row, eps) for row in rewards])


def with_group_advantages(rows: Sequence[dict], eps: float = DEFAULT_EPS) -> list[dict]:
    """Copies of ``rows`` with an ``advantages`` float32 [1] field, normalized per
    (weight_version, prompt_id) group — the advantage stage for rows held in memory."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault((int(row["weight_version"]), int(row["prompt_id"])), []).append(i)
    out = [dict(row) for row in rows]
    for members in groups.values():
        rewards = [float(torch.as_tensor(rows[i]["reward"]).reshape(-1)[0]) for i in members]
        advantages = group_advantages(rewards, eps)
        for i, value in zip(members, advantages, strict=True):
            out[i]["advantages"] = value.reshape(1)
    return out
