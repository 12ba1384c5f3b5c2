"""In-process data plane with the same contract and restore guards as the TransferQueue adapter.

For fast unit tests only: rows live in a Python dict, snapshots are torch.save files.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlckpt.dataplane.base import SNAPSHOT_METADATA_FILE, DataPlaneClient, FieldValue
from rlckpt.dataplane.fields import (
    batch_fields,
    check_json_metadata,
    check_keys,
    densify,
)
from rlckpt.errors import DataPlaneError, MissingSamplesError, RestoreRefusedError
from rlckpt.formats import load_json
from rlckpt.safeload import load_torch_bytes

_ROWS_FILE = "memory_rows.pt"


@dataclass
class InMemoryStore:
    """The shared state several InMemoryDataPlane clients can point at (like one TQ cluster)."""

    rows: dict[str, dict[str, dict[str, torch.Tensor]]] = field(default_factory=dict)
    tags: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def is_empty(self) -> bool:
        """True when no partition exists at all (TQ keeps a partition after its rows are cleared)."""
        return not self.rows


class InMemoryDataPlane(DataPlaneClient):
    """A DataPlaneClient over an InMemoryStore; pass another client's ``store`` to share it.

    Every data call yields to the event loop once, as a real client's would, so concurrent
    callers interleave.
    """

    def __init__(self, store: InMemoryStore | None = None) -> None:
        super().__init__()
        self.store = store if store is not None else InMemoryStore()

    async def _pause(self) -> None:
        await asyncio.sleep(0)

    async def put_samples(
        self,
        partition_id: str,
        keys: Sequence[str],
        fields: Mapping[str, FieldValue],
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        where = f"put_samples(partition={partition_id!r})"
        keys = check_keys(keys, where)
        batched = batch_fields(fields, len(keys), where)
        if tags is not None and len(tags) != len(keys):
            raise DataPlaneError(f"{where}: {len(tags)} tags for {len(keys)} keys")
        self._guard.mark_touched()
        await self._pause()
        partition = self.store.rows.setdefault(partition_id, {})
        part_tags = self.store.tags.setdefault(partition_id, {})
        for i, key in enumerate(keys):
            row = partition.setdefault(key, {})
            for name, column in batched.items():
                row[name] = column[i].clone()
            if tags is not None:
                part_tags[key] = dict(tags[i])
            else:
                part_tags.setdefault(key, {})

    async def get_samples(
        self,
        partition_id: str,
        keys: Sequence[str],
        fields: Sequence[str] | None = None,
    ) -> dict[str, torch.Tensor]:
        where = f"get_samples(partition={partition_id!r})"
        rows = await self._rows(partition_id, keys, fields, where)
        return {name: densify(name, column, where) for name, column in rows.items()}

    async def get_rows(
        self, partition_id: str, keys: Sequence[str], fields: Sequence[str]
    ) -> dict[str, list[torch.Tensor]]:
        return await self._rows(partition_id, keys, fields, f"get_rows(partition={partition_id!r})")

    async def _rows(
        self, partition_id: str, keys: Sequence[str], fields: Sequence[str] | None, where: str
    ) -> dict[str, list[torch.Tensor]]:
        keys = check_keys(keys, where)
        if not keys:
            return {}
        self._guard.mark_touched()
        await self._pause()
        partition = self.store.rows.get(partition_id, {})
        missing = [k for k in keys if k not in partition]
        if missing:
            raise MissingSamplesError(f"{where}: {len(missing)} of {len(keys)} keys missing: {missing[:20]}")
        rows = [partition[k] for k in keys]
        names = list(fields) if fields is not None else sorted({n for row in rows for n in row})
        out: dict[str, list[torch.Tensor]] = {}
        for name in names:
            lacking = [k for k, row in zip(keys, rows, strict=True) if name not in row]
            if lacking:
                raise DataPlaneError(f"{where}: field {name!r} not written for keys {lacking[:20]}")
            out[name] = [row[name] for row in rows]
        return out

    async def is_empty(self) -> bool:
        return self.store.is_empty()

    async def clear_samples(self, partition_id: str, keys: Sequence[str]) -> None:
        keys = check_keys(keys, f"clear_samples(partition={partition_id!r})")
        self._guard.mark_touched()
        await self._pause()
        partition = self.store.rows.get(partition_id, {})
        part_tags = self.store.tags.get(partition_id, {})
        for key in keys:
            partition.pop(key, None)
            part_tags.pop(key, None)

    async def list_sample_ids(self, partition_id: str) -> list[str]:
        await self._pause()
        return sorted(self.store.rows.get(partition_id, {}))

    async def save_checkpoint(self, local_dir: str | Path, metadata: Mapping[str, Any]) -> None:
        local_dir = Path(local_dir)
        meta = check_json_metadata(metadata, f"save_checkpoint({local_dir})")
        tmp = local_dir.with_name(local_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save({"rows": self.store.rows, "tags": self.store.tags}, tmp / _ROWS_FILE)
        (tmp / SNAPSHOT_METADATA_FILE).write_text(json.dumps({"storage_saved": True, "user_metadata": meta}))
        shutil.rmtree(local_dir, ignore_errors=True)
        tmp.rename(local_dir)

    async def load_checkpoint(self, local_dir: str | Path) -> dict[str, Any]:
        local_dir = Path(local_dir)
        self._guard.check_may_load(str(local_dir))
        if not self.store.is_empty():
            raise RestoreRefusedError(
                f"restore from {local_dir} refused: the data plane already holds partitions "
                f"{sorted(self.store.rows)[:10]} (another client wrote before the restore)"
            )
        with self._guard.loading(str(local_dir)):
            meta = load_json((local_dir / SNAPSHOT_METADATA_FILE).read_bytes(), SNAPSHOT_METADATA_FILE)
            state = load_torch_bytes((local_dir / _ROWS_FILE).read_bytes(), str(local_dir / _ROWS_FILE))
            self.store.rows = state["rows"]
            self.store.tags = state["tags"]
        return dict(meta.get("user_metadata", {}))

    async def close(self) -> None:
        """Nothing to release."""
