"""`torch.load` of bundle bytes, behind two checks of rlckpt's own.

1. The bytes must be a torch.save zip archive: torch's older formats (a bare pickle, the tar
   format) take other code paths through `torch.load`, where its past weights-only bypasses were.
2. Every global the archive's `data.pkl` names must be in the caller's allowlist. The record is read
   with torch's own archive reader, as `torch.load` reads it, and scanned before anything unpickles
   it. This keeps to rlckpt's own table whatever else the process has added to torch's weights-only
   allowlist (`torch.serialization.add_safe_globals` is process-wide; tensordict, which
   TransferQueue imports, adds its classes at import).

Only then `torch.load(weights_only=True)`, torch's own allowlist unpickler, loads it.

`load_storage_bytes` is the one exception to 1: a tensor pickled with plain `pickle` (TransferQueue's
snapshot) carries its storage as `torch.storage._load_from_bytes(<legacy-format torch.save>)`, which
torch loads with `weights_only=False`. rlckpt loads those bytes instead: each of the legacy format's
five pickles is scanned first, then `torch.load(weights_only=True)`, and only a storage is accepted.
"""

from __future__ import annotations

import io
from collections.abc import Collection
from typing import Any, BinaryIO

import torch

from rlckpt.errors import UnsafeContentError

from .allowlists import TENSORS
from .pickle_scan import UnreadablePickle, pickle_globals

ZIP_MAGIC = b"PK\x03\x04"  # what torch.load looks for to take its zip path (torch.serialization._is_zipfile)
PICKLE_RECORD = "data.pkl"  # the record torch.load unpickles from the archive
# torch's legacy format, as torch.load reads it from a stream: magic number, protocol version, system
# info, the object, the storage keys (then raw storage bytes, which are not unpickled)
LEGACY_PICKLES = 5


def check_pickle_globals(pickled: bytes | BinaryIO, allowed: Collection[tuple[str, str]], origin: str) -> None:
    """Refuse (UnsafeContentError naming `origin` and the global) a pickle that names any global
    outside `allowed`, or whose globals cannot be read for certain."""
    try:
        found = pickle_globals(pickled)
    except UnreadablePickle as exc:
        raise UnsafeContentError(f"{origin}: refused to unpickle: {exc}") from None
    for item in found:
        if (item.module, item.name) not in allowed:
            raise UnsafeContentError(
                f"{origin}: refused to unpickle: it asks for {item.dotted}, which is not allowed in this file"
            )


def load_torch_bytes(data: bytes, origin: str, allowed: Collection[tuple[str, str]] = TENSORS.keys()) -> Any:
    """What `torch.save` wrote into `data`, on the CPU, if it names only `allowed` globals.

    Args:
        data: the bytes (already digest-checked by the store).
        origin: names the file (and item) in errors.
        allowed: the (module, name) pairs the pickle may name; default: tensors and plain containers.
    Raises:
        UnsafeContentError: not a torch.save archive, a global outside `allowed`, or refused by torch.
    """
    check_torch_bytes(data, origin, allowed)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for bad input
        raise UnsafeContentError(f"{origin}: refused by torch's weights-only unpickler: {exc}") from exc


def check_torch_bytes(data: bytes, origin: str, allowed: Collection[tuple[str, str]] = TENSORS.keys()) -> None:
    """The checks `load_torch_bytes` makes before it loads anything: a torch.save zip archive whose pickle
    names only `allowed` globals. A writer runs them on what it is about to save, so that what no reader
    would load is refused at the save (rlckpt.checkpointer's extra pieces).

    Raises:
        UnsafeContentError: not a torch.save archive, or a global outside `allowed` (named).
    """
    if data[: len(ZIP_MAGIC)] != ZIP_MAGIC:
        raise UnsafeContentError(
            f"{origin}: refused to load: not a torch.save archive (starts {bytes(data[:8])!r}); "
            "torch's legacy formats are never loaded"
        )
    try:
        pickled = torch._C.PyTorchFileReader(io.BytesIO(data)).get_record(PICKLE_RECORD)
    except Exception as exc:  # torch raises RuntimeError with the reader's message
        raise UnsafeContentError(f"{origin}: refused to load: not a readable torch.save archive ({exc})") from exc
    check_pickle_globals(pickled, allowed, origin)


def load_storage_bytes(data: bytes, origin: str) -> torch.storage.TypedStorage | torch.storage.UntypedStorage:
    """The storage in `data`, a legacy-format torch.save of one storage (what torch.storage._load_from_bytes
    is given), if its pickles name tensor machinery only.

    Raises:
        UnsafeContentError: a global outside TENSORS, not that format, or not a storage.
    """
    if data[: len(ZIP_MAGIC)] == ZIP_MAGIC:
        raise UnsafeContentError(f"{origin}: refused to load: a pickled storage must be in torch's legacy format")
    stream = io.BytesIO(data)
    for _ in range(LEGACY_PICKLES):
        check_pickle_globals(stream, TENSORS.keys(), origin)
    try:
        value = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for bad input
        raise UnsafeContentError(f"{origin}: refused by torch's weights-only unpickler: {exc}") from exc
    if not isinstance(value, (torch.storage.TypedStorage, torch.storage.UntypedStorage)):
        raise UnsafeContentError(f"{origin}: a pickled storage holds a {type(value).__name__}")
    return value


def save_torch_bytes(value: Any) -> bytes:
    """`torch.save` of `value` into bytes (the zip archive `load_torch_bytes` reads)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()
