"""The user metadata beside a data-plane snapshot (``metadata.json``, TransferQueue's own format).

Both adapters write ``{"storage_saved": true, "user_metadata": {...}}`` (``SNAPSHOT_METADATA``). Reading
it is plain JSON, so a restore can check a snapshot's pairing before any pickle in it is loaded; updating
it lets a save finish the metadata (e.g. the index digest) after the barrier window is released.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlckpt.dataplane.base import SNAPSHOT_METADATA_FILE
from rlckpt.dataplane.snapshot_records import SNAPSHOT_METADATA
from rlckpt.errors import DataPlaneError
from rlckpt.formats import load_json


def read_snapshot_document(local_dir: str | Path) -> dict[str, Any]:
    """The whole ``metadata.json`` of the snapshot in ``local_dir``, checked against ``SNAPSHOT_METADATA``.

    Raises:
        DataPlaneError: naming the file (and the field): unreadable, not JSON, or not that record.
    """
    path = Path(local_dir) / SNAPSHOT_METADATA_FILE
    try:
        document = load_json(path.read_bytes(), SNAPSHOT_METADATA_FILE)
    except (OSError, ValueError) as exc:
        raise DataPlaneError(f"{path}: not a data-plane snapshot's metadata ({type(exc).__name__}: {exc})") from exc
    SNAPSHOT_METADATA.check(document, str(path))
    document_dict: dict[str, Any] = document
    return document_dict


def read_snapshot_metadata(local_dir: str | Path) -> dict[str, Any]:
    """The user metadata of the snapshot in ``local_dir``; DataPlaneError naming the file (and the field)
    if unreadable or not a snapshot's metadata."""
    user: dict[str, Any] = read_snapshot_document(local_dir)["user_metadata"]
    return user


def update_snapshot_metadata(local_dir: str | Path, extra: Mapping[str, Any]) -> None:
    """Merge ``extra`` into the user metadata of a staged snapshot (atomic replace of the file)."""
    path = Path(local_dir) / SNAPSHOT_METADATA_FILE
    try:
        document = load_json(path.read_bytes(), SNAPSHOT_METADATA_FILE)
        document["user_metadata"] = {**document["user_metadata"], **extra}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataPlaneError(f"{path}: cannot update the snapshot's metadata ({type(exc).__name__}: {exc})") from exc
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, path)
