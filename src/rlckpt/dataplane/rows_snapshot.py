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
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlckpt.dataplane.base import SNAPSHOT_METADATA_FILE, DataPlaneClient
from rlckpt.dataplane.snapshot_metadata import read_snapshot_document
from rlckpt.dataplane.snapshot_records import DTYPE_NAMES, ROWS_FORMAT, ROWS_HEADER, ROWS_MARKER, ROWS_SECTION
from rlckpt.errors import DataPlaneError, RestoreRefusedError
from rlckpt.formats import load_json, read_format

logger = logging.getLogger(__name__)

MAGIC = b"RLCKROWS"
_HEADER = struct.Struct("<8sQ")  # magic, header length
MAX_HEADER_BYTES = 64 << 20

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}

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
    header, head_len = _read_header(data, len(data), where)
    payload = memoryview(data)[_HEADER.size + head_len :]
    keys: list[str] = header["keys"]
    rows: Rows = {
        name: [_tensor(payload, entry, f"{where}: field {name!r}") for entry in entries]
        for name, entries in header["fields"].items()
    }
    return keys, rows


def _read_header(head: bytes, file_size: int, where: str) -> tuple[dict[str, Any], int]:
    """The checked header of a rows file of `file_size` bytes from its first bytes `head` (at least the
    header's), and the header's length: ``ROWS_HEADER``, one entry per key in every field, and every entry
    inside the file."""
    if file_size < _HEADER.size or len(head) < _HEADER.size:
        raise DataPlaneError(f"{where}: too short for a rows file ({file_size} bytes)")
    magic, head_len = _HEADER.unpack_from(head)
    if magic != MAGIC or head_len > min(MAX_HEADER_BYTES, file_size - _HEADER.size, len(head) - _HEADER.size):
        raise DataPlaneError(f"{where}: not a rows file (magic {magic!r}, header {head_len} bytes)")
    try:
        header = load_json(head[_HEADER.size : _HEADER.size + head_len], "rows header")
    except ValueError as exc:
        raise DataPlaneError(f"{where}: unreadable rows header: {exc}") from exc
    read_format((ROWS_HEADER,), header, where)
    payload_size = file_size - _HEADER.size - head_len
    for name, entries in header["fields"].items():
        if len(entries) != len(header["keys"]):
            raise DataPlaneError(f"{where}: field {name!r} does not have one entry per key")
        for entry in entries:
            _check_entry(entry, payload_size, f"{where}: field {name!r}")
    return header, head_len


def _check_entry(entry: list[Any], payload_size: int, where: str) -> None:
    """A row entry (already of ``ROWS_ENTRY``'s kinds) whose length is its shape's and that lies in the payload."""
    dtype_name, shape, offset, length = entry
    count = 1
    for dim in shape:
        count *= dim
    itemsize = torch.empty((), dtype=DTYPES[dtype_name]).element_size()
    if length != count * itemsize or offset + length > payload_size:
        raise DataPlaneError(f"{where}: row entry {entry!r:.200} does not fit the file")


def _tensor(payload: memoryview, entry: list[Any], where: str) -> torch.Tensor:
    dtype_name, shape, offset, length = entry  # checked by _read_header
    raw = bytearray(payload[offset : offset + length])  # owned: the tensor outlives the file bytes
    flat = torch.frombuffer(raw, dtype=torch.uint8) if length else torch.empty(0, dtype=torch.uint8)
    return flat.view(DTYPES[dtype_name]).reshape(shape)


def check_rows_snapshot(local_dir: str | Path) -> dict[str, Any]:
    """Check everything of the rows snapshot in `local_dir` but the row bytes themselves: its metadata and
    every file's header, each entry inside its file. Reads only the headers; returns the metadata.

    Raises:
        DataPlaneError: naming the file and the field, before anything is restored.
    """
    local_dir = Path(local_dir)
    document = read_snapshot_document(local_dir)
    where = str(local_dir / SNAPSHOT_METADATA_FILE)
    if ROWS_MARKER not in document:
        raise DataPlaneError(f"{where}: no {ROWS_MARKER!r} section: not a rows snapshot")
    section: dict[str, Any] = document[ROWS_MARKER]
    read_format((ROWS_SECTION,), section, where)
    for name in section["files"]:
        path = local_dir / name
        try:
            with open(path, "rb") as rows_file:
                size = os.fstat(rows_file.fileno()).st_size
                head = rows_file.read(_HEADER.size)
                if len(head) == _HEADER.size:
                    head += rows_file.read(min(_HEADER.unpack_from(head)[1], MAX_HEADER_BYTES))
        except OSError as exc:
            raise DataPlaneError(f"{path}: cannot read this rows file: {exc}") from exc
        _read_header(head, size, str(path))
    return document


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
        document = load_json((Path(local_dir) / SNAPSHOT_METADATA_FILE).read_bytes(), SNAPSHOT_METADATA_FILE)
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and ROWS_MARKER in document


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
    """Put every row of a rows snapshot back, under the same restore guards as load_checkpoint; every
    header is checked before the first row goes back."""
    client.restore_guard.check_may_load(str(local_dir))
    document = check_rows_snapshot(local_dir)
    section = document[ROWS_MARKER]
    if not await client.is_empty():
        raise RestoreRefusedError(
            f"restore from {local_dir} refused: the data plane already holds data (another client wrote first)"
        )
    partition = section["partition_id"]
    with client.restore_guard.loading(str(local_dir)):
        restored = 0
        for name in section["files"]:
            keys, rows = decode_rows((local_dir / name).read_bytes(), f"{local_dir / name}")
            for run in _uniform_runs(keys, rows):  # a put takes rows of one shape per column
                await client.put_samples(
                    partition, [keys[i] for i in run], {f: [c[i] for i in run] for f, c in rows.items()}
                )
            restored += len(keys)
    logger.info("restored %d rows into partition %s from %s", restored, partition, local_dir)
    user_metadata: dict[str, Any] = document["user_metadata"]
    return user_metadata
