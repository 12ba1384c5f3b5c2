"""Bytes <-> plain state dicts for the small ``.pt`` pieces of a bundle (dataloader position, replay index).

Loading goes through ``safeload.load_torch_bytes``: a torch.save archive whose pickle names only tensor
machinery and torch values (rlckpt's own pieces name no global at all: ints, strings, lists, dicts),
then ``torch.load(weights_only=True)``. Callers still hand in bytes the store verified first.
"""

from __future__ import annotations

from typing import Any

from rlckpt.safeload import load_torch_bytes, save_torch_bytes


def dumps(state: Any) -> bytes:
    """Serialize a state dict of tensors and plain Python values."""
    return save_torch_bytes(state)


def loads(data: bytes, *, origin: str) -> Any:
    """Deserialize bytes written by ``dumps``; ``origin`` names the file in errors.

    Raises:
        UnsafeContentError: (a CorruptBundleError) not a torch.save archive, or a global outside the
            allowlist (named), or refused by torch's weights-only unpickler.
    """
    return load_torch_bytes(data, origin)
