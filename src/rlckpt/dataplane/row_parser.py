"""Per-row parser that TransferQueue's storage units run on every put (``data_parser=``).

Without it each stored row is a view into the whole tensor its put arrived in, and TQ's pickle
snapshot writes that whole tensor once per row (64 rows per put -> 64x the payload on disk).
Cloning each row into its own storage makes the snapshot about the size of the payload.

This module runs inside the storage-unit actors, so it must stay importable there: it is part
of the installed package and imports only torch.
"""

from __future__ import annotations

from typing import Any

import torch


def _own_row(value: Any) -> Any:
    """A copy of one row that owns exactly its own bytes (non-tensors pass through)."""
    if isinstance(value, torch.Tensor):
        return value.clone(memory_format=torch.contiguous_format)
    return value


def split_rows(field_data: dict[str, Any]) -> dict[str, Any]:
    """Turn every column into a list of independently owned rows, keeping keys, order and length."""
    out: dict[str, Any] = {}
    for name, column in field_data.items():
        if isinstance(column, torch.Tensor) and not column.is_nested:
            out[name] = [_own_row(row) for row in column.unbind(0)]
        elif isinstance(column, torch.Tensor):  # nested (jagged or strided): one tensor per row
            out[name] = [_own_row(row) for row in column.unbind()]
        elif isinstance(column, list | tuple):
            out[name] = [_own_row(row) for row in column]
        else:  # unknown container (e.g. NonTensorStack): leave it exactly as TQ gave it
            out[name] = column
    return out
