"""Plain values at the entry of an API whose arguments end up in a record: a NumPy or tensor integer scalar
is taken as the int it holds, anything else that is not an int refused there, so a save long after cannot
fail to write it (or write what no reader takes back)."""

from __future__ import annotations

import operator
from typing import Any

from rlckpt.formats.spec import Refusal, type_name


def plain_int(value: Any, path: str) -> int:
    """`value` as a Python int: an int, or a NumPy or tensor integer scalar (``operator.index``).

    Raises:
        Refusal: naming `path`: a bool (or bool scalar), a float, an array or tensor of more than a scalar,
            anything else.
    """
    dtype = str(getattr(value, "dtype", ""))
    if isinstance(value, bool) or dtype in ("bool", "torch.bool") or getattr(value, "ndim", 0) != 0:
        raise Refusal(f"expected int, got {type_name(value)}{_dtype(value)}", path)
    try:
        return operator.index(value)
    except TypeError:
        raise Refusal(f"expected int, got {type_name(value)}{_dtype(value)}", path) from None


def plain_optional_int(value: Any, path: str) -> int | None:
    """None, or `value` as ``plain_int`` takes it."""
    if value is None:
        return None
    try:
        return plain_int(value, path)
    except Refusal as refusal:
        raise Refusal(refusal.problem.replace("expected int", "expected int or None", 1), path) from None


def _dtype(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is None:
        return ""
    return f" of {str(dtype).removeprefix('torch.')}" + (f", shape {tuple(shape)}" if shape else "")
