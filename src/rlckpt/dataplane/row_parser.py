"""Per-row parsers that TransferQueue's storage units run on every put (``data_parser=``).

Without one, each stored row is a view into the whole tensor its put arrived in, and TQ's pickle
snapshot writes that whole tensor once per row (64 rows per put -> 64x the payload on disk).
Both parsers give every row its own storage, so the snapshot is about the payload's size:

* ``split_rows_numpy`` (default) keeps rows as numpy arrays: pickling a numpy array costs a few
  microseconds, a torch tensor ~100+ us, so snapshots of many small rows save/load several times
  faster (see docs/dataplane.md). Columns numpy cannot represent (bfloat16, ...) stay tensors.
* ``split_rows`` keeps rows as cloned torch tensors.

This module runs inside the storage-unit actors, so it must stay importable there: it is part of
the installed package and imports only torch and numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _own_row(value: Any) -> Any:
    """A copy of one row that owns exactly its own bytes (non-tensors pass through)."""
    if isinstance(value, torch.Tensor):
        return value.clone(memory_format=torch.contiguous_format)
    return value


def _rows_of(column: Any) -> list[Any] | None:
    """The column's rows as a list, or None for containers this module does not know."""
    if isinstance(column, torch.Tensor):
        return list(column.unbind(0) if not column.is_nested else column.unbind())
    if isinstance(column, list | tuple):
        return list(column)
    return None


def _split(field_data: dict[str, Any], own: Callable[[Any], Any]) -> dict[str, Any]:
    """Every column as a list of rows, each made independent by ``own`` (keys, order, length kept)."""
    out: dict[str, Any] = {}
    for name, column in field_data.items():
        rows = _rows_of(column)
        out[name] = column if rows is None else [own(row) for row in rows]
    return out


def split_rows(field_data: dict[str, Any]) -> dict[str, Any]:
    """Every column as a list of independently owned torch rows (keys, order, length kept)."""
    return _split(field_data, _own_row)


def _numpy_row(row: Any) -> Any:
    if isinstance(row, torch.Tensor):
        try:
            return row.detach().numpy().copy()
        except TypeError:  # dtype without a numpy equivalent (bfloat16, float8, ...)
            return _own_row(row)
    return row


def split_rows_numpy(field_data: dict[str, Any]) -> dict[str, Any]:
    """Every column as a list of independently owned numpy rows (tensors where numpy cannot)."""
    return _split(field_data, _numpy_row)


PARSERS = {"numpy": split_rows_numpy, "torch": split_rows, "none": None}
