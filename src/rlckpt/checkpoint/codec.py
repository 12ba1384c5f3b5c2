"""Bytes <-> plain state dicts for the small ``.pt`` pieces of a bundle.

Loading uses ``torch.load(weights_only=True)``: only tensors and plain containers, never code.
Callers still hand in bytes the store verified against the manifest first.
"""

from __future__ import annotations

import io
from typing import Any

import torch

from rlckpt.errors import CorruptBundleError


def dumps(state: Any) -> bytes:
    """Serialize a state dict of tensors and plain Python values."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def loads(data: bytes, *, origin: str) -> Any:
    """Deserialize bytes written by ``dumps``; ``origin`` names the file in errors."""
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises several unrelated types for bad input
        raise CorruptBundleError(f"{origin}: cannot be loaded as a weights-only state dict: {exc}") from exc
