"""TransferQueue's own snapshot (the `staged` and `inline` upload timings), made safe to hand to TQ.

TQ's `load_checkpoint` unpickles its snapshot with plain `pickle` inside its actors (controller and
storage units): a snapshot whose digests all match can still run code there. So the adapter never
hands TQ the snapshot it was given. `vetted_copy` unpickles each pickle of it here, with only the
globals an honest snapshot of TransferQueue 0.1.11 names reachable (tq_snapshot_globals()), and writes
a copy TQ then loads: its pickles are rlckpt's own re-pickling of those vetted values, its JSON files
rewritten from what was parsed, and nothing else of the source directory is copied. A tensor's
storage, which plain pickle carries as `torch.storage._load_from_bytes(...)` (a `torch.load` with
`weights_only=False`), is loaded here by `safeload.load_storage_bytes` instead.

The rows snapshot (`pinned`, the default) needs none of this: it holds no pickle at all.
"""

from __future__ import annotations

import functools
import json
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np

from rlckpt.errors import DataPlaneError, UnsafeContentError
from rlckpt.formats import load_json
from rlckpt.safeload import TENSORS, Allowlist, load_storage_bytes, restricted_loads

# TQ's own names for the files of its snapshot (transfer_queue.interface, its simple_storage_manager);
# the round-trip tests of tests/dataplane fail if a TQ upgrade renames them.
METADATA_FILE = "metadata.json"
CONTROLLER_FILE = "controller_state.pkl"
STORAGE_DIR = "simple_storage"
STORAGE_INFO_FILE = "storage_unit_info.json"
_UNIT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # a storage unit id names a file: no separators


@functools.cache
def tq_snapshot_globals() -> Allowlist:
    """What an honest TQ snapshot names: TQ's partition records, numpy arrays and dtypes (the numpy row
    parser), tensors (TQ's status tensors, columns numpy cannot hold), torch values, OrderedDict. Each
    file's own table adds a stand-in for the storages of tensors (_file_globals). Built on first use: it
    imports TransferQueue."""
    from transfer_queue.controller import DataPartitionStatus, FieldMeta

    return {
        **TENSORS,
        ("transfer_queue.controller", "DataPartitionStatus"): DataPartitionStatus,
        ("transfer_queue.controller", "FieldMeta"): FieldMeta,
        ("numpy", "dtype"): np.dtype,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy._core.numeric", "_frombuffer"): np._core.numeric._frombuffer,  # type: ignore[attr-defined]
        ("numpy._core.multiarray", "_reconstruct"): np._core.multiarray._reconstruct,  # type: ignore[attr-defined]
        ("numpy._core.multiarray", "scalar"): np._core.multiarray.scalar,  # type: ignore[attr-defined]
    }


def _file_globals(source: Path) -> Allowlist:
    """tq_snapshot_globals() with torch.storage._load_from_bytes (torch.load, weights_only=False) replaced
    by safeload's loader naming `source`. The stand-in is a local function: it cannot be pickled, so it
    can never reach the copy TQ loads."""

    def storage_from_bytes(data: bytes) -> Any:
        return load_storage_bytes(data, f"{source}: a tensor's storage")

    return {**tq_snapshot_globals(), ("torch.storage", "_load_from_bytes"): storage_from_bytes}


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataPlaneError(f"{path}: cannot read this file of a TransferQueue snapshot: {exc}") from exc


def _vetted_pickle(source: Path, dest: Path) -> Any:
    """Unpickle `source` through the allowlist and write rlckpt's own pickle of the value to `dest`."""
    value = restricted_loads(_read(source), _file_globals(source), str(source))
    try:
        with open(dest, "wb") as out:
            pickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL)  # as TQ pickles its snapshot
    except (pickle.PicklingError, TypeError, AttributeError) as exc:  # e.g. it holds the storage stand-in
        raise UnsafeContentError(f"{source}: what it holds cannot be pickled again: {exc}") from exc
    return value


def _read_json(path: Path) -> Any:
    try:
        return load_json(_read(path), path.name)
    except ValueError as exc:
        raise UnsafeContentError(f"{path}: not JSON, as this file of a TransferQueue snapshot must be: {exc}") from exc


def _storage_units(source: Path) -> list[tuple[int, str]]:
    """(position, unit id) of each storage unit file, as TQ's storage manager reads them."""
    path = source / STORAGE_DIR / STORAGE_INFO_FILE
    entries = _read_json(path)
    units: list[tuple[int, str]] = []
    if isinstance(entries, list):
        for entry in entries:
            position = entry.get("position") if isinstance(entry, dict) else None
            unit_id = entry.get("storage_unit_id") if isinstance(entry, dict) else None
            if type(position) is not int or not isinstance(unit_id, str) or not _UNIT_ID.fullmatch(unit_id):
                break
            units.append((position, unit_id))
        else:
            if sorted(p for p, _ in units) == list(range(len(units))):
                return units
    raise UnsafeContentError(f"{path}: not a list of storage units numbered 0..n-1 with plain ids: {entries!r:.200}")


def vetted_copy(source: str | Path, dest: str | Path) -> Path:
    """Write into `dest` (an empty or new directory) the copy of TQ snapshot `source` that TQ may load.

    Raises:
        UnsafeContentError: a pickle names a global outside tq_snapshot_globals() (the file and the global
            are named), a storage unit is kept on SSD (rlckpt's TQ never offloads), or a file is not what
            TQ's snapshot holds there.
        DataPlaneError: a file of the snapshot is missing or unreadable.
    """
    source, dest = Path(source), Path(dest)
    metadata = _read_json(source / METADATA_FILE)
    if not isinstance(metadata, dict):
        raise UnsafeContentError(f"{source / METADATA_FILE}: not a TransferQueue snapshot's metadata")
    (dest / STORAGE_DIR).mkdir(parents=True, exist_ok=True)
    _vetted_pickle(source / CONTROLLER_FILE, dest / CONTROLLER_FILE)
    if metadata.get("storage_saved"):
        units = _storage_units(source)
        for position, unit_id in units:
            name = f"{STORAGE_DIR}/su_{position}_{unit_id}.pkl"
            state = _vetted_pickle(source / name, dest / name)
            if not isinstance(state, dict) or "format" in state:  # the hybrid (SSD) format keeps pickled blobs
                raise UnsafeContentError(f"{source / name}: not an in-memory storage unit's state")
        units_json = [{"position": p, "storage_unit_id": u} for p, u in units]
        (dest / STORAGE_DIR / STORAGE_INFO_FILE).write_text(json.dumps(units_json))
    (dest / METADATA_FILE).write_text(json.dumps(metadata))
    return dest


__all__ = ["tq_snapshot_globals", "vetted_copy"]
