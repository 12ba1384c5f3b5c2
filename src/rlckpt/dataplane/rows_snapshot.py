"""The rows snapshot: a data-plane snapshot made of the rows themselves, read through the client API.

A pinned save copies exactly the rows its index captured, batch by batch, while rollouts keep
committing; it cannot use TransferQueue's own save (not a point in time, and it stalls every put
for its whole length). Each batch is one file in a format of our own: a JSON header (keys, and
per field and row: dtype, shape, offset, length) and the raw tensor bytes. No pickle anywhere, so
restoring it deserializes nothing but tensors. ``metadata.json`` keeps TransferQueue's layout
(``user_metadata``) so the pairing checks of a restore read it the same way, and says which
partition and files the rows belong to.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlckpt.dataplane.base import SNAPSHOT_METADATA_FILE, DataPlaneClient
from rlckpt.errors import DataPlaneError, RestoreRefusedError

logger = logging.getLogger(__name__)

ROWS_FORMAT = 1
ROWS_MARKER = "rlckpt_rows"  # key of the rows section in metadata.json
MAGIC = b"RLCKROWS"
_HEADER = struct.Struct("<8sQ")  # magic, header length
MAX_HEADER_BYTES = 64 << 20

DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    )
}  # fmt: skip

Rows = dict[str, list[torch.Tensor]]  # field -> one tensor per row, in key order


def encode_rows(keys: Sequence[str], rows: Mapping[str, Sequence[torch.Tensor]]) -> bytes:
    """One batch file: header + the rows' raw bytes (each field's rows in key order)."""
    header: dict[str, Any] = {"format": ROWS_FORMAT, "keys": list(keys), "fields": {}}
    chunks: list[bytes] = []
    offset = 0
    for name, column in sorted(rows.items()):
        if len(column) != len(keys):
            raise DataPlaneError(f"encode_rows: field {name!r} has {len(column)} rows for {len(keys)} keys")
        entries = []
        for tensor in column:
            dtype = str(tensor.dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                raise DataPlaneError(
                    f"encode_rows: field {name!r} has dtype {tensor.dtype}, not one of {sorted(DTYPES)}"
                )
            raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            entries.append([dtype, list(tensor.shape), offset, len(raw)])
            chunks.append(raw)
            offset += len(raw)
        header["fields"][name] = entries
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    return _HEADER.pack(MAGIC, len(head)) + head + b"".join(chunks)


def decode_rows(data: bytes, where: str) -> tuple[list[str], Rows]:
    """Keys and rows of one batch file; DataPlaneError naming `where` if anything does not add up."""
    if len(data) < _HEADER.size:
        raise DataPlaneError(f"{where}: too short for a rows file ({len(data)} bytes)")
    magic, head_len = _HEADER.unpack_from(data)
    if magic != MAGIC or head_len > min(MAX_HEADER_BYTES, len(data) - _HEADER.size):
        raise DataPlaneError(f"{where}: not a rows file (magic {magic!r}, header {head_len} bytes)")
    try:
        header = json.loads(data[_HEADER.size : _HEADER.size + head_len])
    except ValueError as exc:
        raise DataPlaneError(f"{where}: unreadable rows header: {exc}") from exc
    found = header.get("format") if isinstance(header, dict) else None
    if found != ROWS_FORMAT:
        raise DataPlaneError(f"{where}: rows format {found!r}, expected {ROWS_FORMAT}")
    payload = memoryview(data)[_HEADER.size + head_len :]
    keys = header.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise DataPlaneError(f"{where}: rows header has no key list")
    rows: Rows = {}
    for name, entries in dict(header.get("fields", {})).items():
        if not isinstance(entries, list) or len(entries) != len(keys):
            raise DataPlaneError(f"{where}: field {name!r} does not have one entry per key")
        rows[name] = [_tensor(payload, entry, f"{where}: field {name!r}") for entry in entries]
    return keys, rows


def _tensor(payload: memoryview, entry: Any, where: str) -> torch.Tensor:
    try:
        dtype_name, shape, offset, length = entry
        dtype = DTYPES[dtype_name]
        count = 1
        for dim in shape:
            count *= int(dim)
        itemsize = torch.empty((), dtype=dtype).element_size()
    except (KeyError, TypeError, ValueError) as exc:
        raise DataPlaneError(f"{where}: bad row entry {entry!r}") from exc
    if length != count * itemsize or offset < 0 or offset + length > len(payload):
        raise DataPlaneError(f"{where}: row entry {entry!r} does not fit the file")
    raw = bytearray(payload[offset : offset + length])  # owned: the tensor outlives the file bytes
    flat = torch.frombuffer(raw, dtype=torch.uint8) if length else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape([int(d) for d in shape])


def rows_metadata(partition_id: str, files: Sequence[str], user_metadata: Mapping[str, Any]) -> bytes:
    """metadata.json of a rows snapshot (TransferQueue's layout plus the rows section)."""
    document = {
        "storage_saved": True,
        "user_metadata": dict(user_metadata),
        ROWS_MARKER: {"format": ROWS_FORMAT, "partition_id": partition_id, "files": list(files)},
    }
    return json.dumps(document, sort_keys=True).encode()


def is_rows_snapshot(local_dir: str | Path) -> bool:
    """Whether the snapshot in `local_dir` is a rows snapshot (else TransferQueue's own)."""
    try:
        return ROWS_MARKER in json.loads((Path(local_dir) / SNAPSHOT_METADATA_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return False


def _uniform_runs(keys: Sequence[str], rows: Rows) -> list[list[int]]:
    """Consecutive row indexes whose tensors have the same shapes in every column."""
    runs: list[list[int]] = []
    previous: tuple[Any, ...] | None = None
    for i in range(len(keys)):
        shapes = tuple(tuple(column[i].shape) for _name, column in sorted(rows.items()))
        if shapes != previous:
            runs.append([])
            previous = shapes
        runs[-1].append(i)
    return runs


async def restore_snapshot(client: DataPlaneClient, local_dir: str | Path) -> dict[str, Any]:
    """Restore a staged snapshot of either kind onto an untouched data plane; the user metadata."""
    if not is_rows_snapshot(local_dir):
        return await client.load_checkpoint(local_dir)
    return await _load_rows(client, Path(local_dir))


async def _load_rows(client: DataPlaneClient, local_dir: Path) -> dict[str, Any]:
    """Put every row of a rows snapshot back, under the same restore guards as load_checkpoint."""
    client.restore_guard.check_may_load(str(local_dir))
    if not await client.is_empty():
        raise RestoreRefusedError(
            f"restore from {local_dir} refused: the data plane already holds data (another client wrote first)"
        )
    with client.restore_guard.loading(str(local_dir)):
        document = json.loads((local_dir / SNAPSHOT_METADATA_FILE).read_text())
        section = document[ROWS_MARKER]
        if section.get("format") != ROWS_FORMAT:
            raise DataPlaneError(f"rows snapshot format {section.get('format')!r}, expected {ROWS_FORMAT}")
        partition = str(section["partition_id"])
        restored = 0
        for name in section["files"]:
            keys, rows = decode_rows((local_dir / name).read_bytes(), f"{local_dir / name}")
            for run in _uniform_runs(keys, rows):  # a put takes rows of one shape per column
                await client.put_samples(
                    partition, [keys[i] for i in run], {f: [c[i] for i in run] for f, c in rows.items()}
                )
            restored += len(keys)
    logger.info("restored %d rows into partition %s from %s", restored, partition, local_dir)
    return dict(document.get("user_metadata", {}))
