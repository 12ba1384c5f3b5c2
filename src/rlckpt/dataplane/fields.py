"""Checks and conversions of row columns shared by every data-plane adapter."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlckpt.errors import DataPlaneError
from rlckpt.formats import MAX_JSON_DEPTH, nested_deeper_than


def check_keys(keys: Sequence[str], where: str) -> list[str]:
    """Keys as a list of unique non-empty strings, or a DataPlaneError naming the problem."""
    keys = list(keys)
    bad = [k for k in keys if not isinstance(k, str) or not k]
    if bad:
        raise DataPlaneError(f"{where}: sample keys must be non-empty strings, got {bad[:5]!r}")
    if len(set(keys)) != len(keys):
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        raise DataPlaneError(f"{where}: duplicate sample keys {dupes[:5]}")
    return keys


def batch_fields(fields: Mapping[str, Any], num_rows: int, where: str) -> dict[str, torch.Tensor]:
    """Each column as one batched tensor with ``num_rows`` rows.

    A column is either a tensor whose first dim is the row count, or a sequence of per-row
    tensors of one shape (stacked). Ragged rows are refused: pad them before the put.
    """
    if not fields:
        raise DataPlaneError(f"{where}: no fields given")
    out: dict[str, torch.Tensor] = {}
    for name, column in fields.items():
        if isinstance(column, torch.Tensor):
            tensor = column
        elif isinstance(column, Sequence) and all(isinstance(row, torch.Tensor) for row in column):
            shapes = {tuple(row.shape) for row in column}
            if len(shapes) > 1:
                raise DataPlaneError(
                    f"{where}: field {name!r} has rows of different shapes {sorted(shapes)[:3]}; pad them"
                )
            tensor = torch.stack(list(column)) if column else torch.empty(0)
        else:
            raise DataPlaneError(f"{where}: field {name!r} must be a tensor or a list of tensors")
        if tensor.dim() == 0 or tensor.shape[0] != num_rows:
            shape = tuple(tensor.shape)
            raise DataPlaneError(f"{where}: field {name!r} has shape {shape}, expected {num_rows} rows")
        out[name] = tensor
    return out


def rows_of(name: str, value: Any, where: str) -> list[torch.Tensor]:
    """One tensor per row from what a backend returned: a dense or nested tensor, a list of tensors,
    or a list-like of numpy rows (TQ hands numpy rows back as a NonTensorStack)."""
    if isinstance(value, torch.Tensor):
        return list(value.unbind(0) if not value.is_nested else value.unbind())
    listlike = hasattr(value, "tolist") and not isinstance(value, list | tuple)
    rows = list(value.tolist()) if listlike else list(value)
    rows = [torch.from_numpy(np.array(row)) if isinstance(row, np.ndarray) else row for row in rows]
    if not all(isinstance(row, torch.Tensor) for row in rows):
        kinds = sorted({type(row).__name__ for row in rows})
        raise DataPlaneError(f"{where}: field {name!r} holds non-tensor values {kinds}")
    return rows


def densify(name: str, value: Any, where: str) -> torch.Tensor:
    """A dense tensor from what a backend returned.

    Accepts a dense tensor, a nested tensor, a list of tensors, or a list-like of numpy rows
    (TQ hands numpy rows back as a NonTensorStack); rows must share one shape.
    """
    if isinstance(value, torch.Tensor) and not value.is_nested:
        return value
    rows = rows_of(name, value, where)
    shapes = {tuple(row.shape) for row in rows}
    if len(shapes) > 1:
        raise DataPlaneError(f"{where}: field {name!r} has ragged rows {sorted(shapes)[:3]}; cannot densify")
    return torch.stack(rows)


def check_json_metadata(metadata: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Metadata as a plain dict that survives a JSON round trip unchanged, nested no deeper than its reader
    takes (the snapshot's record holds it one level down)."""
    if nested_deeper_than(metadata, MAX_JSON_DEPTH - 1):  # checked first: json.dumps recurses per level
        raise DataPlaneError(
            f"{where}: snapshot metadata is nested deeper than {MAX_JSON_DEPTH - 1} levels of objects and arrays"
        )
    try:
        text = json.dumps(dict(metadata), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise DataPlaneError(f"{where}: snapshot metadata must be JSON-serializable: {exc}") from exc
    return json.loads(text)
