"""The training batch: rollout rows (as the data plane holds them) plus their advantages.

A row is a dict with tensors ``prompt`` int64 [P], ``completion`` int64 [L], ``logprobs``
float32 [L], ``reward`` float32 [1], ``advantages`` float32 [1] (or a float), and the plain ints
``prompt_id``, ``sample_index``, ``weight_version``. ``TrainBatch.from_rows`` sorts rows by
(weight_version, prompt_id, sample_index) so the same rows in any order give the same step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlckpt.errors import InvalidBatchError

ROW_TENSOR_FIELDS = ("prompt", "completion", "logprobs", "reward")
ROW_ID_FIELDS = ("prompt_id", "sample_index", "weight_version")


@dataclass
class TrainBatch:
    """Stacked rows: prompts int64 [N, P], completions int64 [N, L], old_logprobs float32 [N, L],
    rewards float32 [N], advantages float32 [N]."""

    prompts: torch.Tensor
    completions: torch.Tensor
    old_logprobs: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor

    def __post_init__(self) -> None:
        n = self.prompts.shape[0]
        shapes = {
            "prompts": (self.prompts, torch.int64, 2),
            "completions": (self.completions, torch.int64, 2),
            "old_logprobs": (self.old_logprobs, torch.float32, 2),
            "rewards": (self.rewards, torch.float32, 1),
            "advantages": (self.advantages, torch.float32, 1),
        }
        for name, (tensor, dtype, dims) in shapes.items():
            if tensor.dtype != dtype or tensor.dim() != dims or tensor.shape[0] != n:
                raise InvalidBatchError(
                    f"TrainBatch.{name} must be {dtype} with {dims} dims and {n} rows, "
                    f"got {tensor.dtype} shape {tuple(tensor.shape)}"
                )
        if self.completions.shape != self.old_logprobs.shape:
            raise InvalidBatchError(
                f"TrainBatch completions {tuple(self.completions.shape)} and old_logprobs "
                f"{tuple(self.old_logprobs.shape)} differ in shape"
            )
        if n == 0:
            raise InvalidBatchError("TrainBatch is empty")

    def __len__(self) -> int:
        return int(self.prompts.shape[0])

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]]) -> TrainBatch:
        """Stack rollout rows that already carry ``advantages``; sorted for determinism."""
        if not rows:
            raise InvalidBatchError("TrainBatch.from_rows got no rows")
        for i, row in enumerate(rows):
            missing = [f for f in (*ROW_TENSOR_FIELDS, "advantages") if f not in row]
            if missing:
                raise InvalidBatchError(f"row {i} lacks field(s) {missing}")
        ordered = sorted(rows, key=_row_order) if all(_has_ids(r) for r in rows) else list(rows)
        try:
            return cls(
                prompts=torch.stack([torch.as_tensor(r["prompt"]).reshape(-1) for r in ordered]),
                completions=torch.stack([torch.as_tensor(r["completion"]).reshape(-1) for r in ordered]),
                old_logprobs=torch.stack([torch.as_tensor(r["logprobs"]).reshape(-1) for r in ordered]),
                rewards=_scalars(ordered, "reward"),
                advantages=_scalars(ordered, "advantages"),
            )
        except RuntimeError as exc:  # torch.stack on ragged rows
            raise InvalidBatchError(f"rows do not stack into a batch: {exc}") from exc


def _has_ids(row: Mapping[str, Any]) -> bool:
    return all(f in row for f in ROW_ID_FIELDS)


def _row_order(row: Mapping[str, Any]) -> tuple[int, int, int]:
    return int(row["weight_version"]), int(row["prompt_id"]), int(row["sample_index"])


def _scalars(rows: Sequence[Mapping[str, Any]], field: str) -> torch.Tensor:
    values = [torch.as_tensor(r[field], dtype=torch.float32).reshape(-1) for r in rows]
    for i, v in enumerate(values):
        if v.numel() != 1:
            raise InvalidBatchError(f"row {i} field {field!r} must hold one value, has {v.numel()}")
    return torch.cat(values)
