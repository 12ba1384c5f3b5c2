"""The data-plane contract the controller and replay buffer program against.

Every method is async because the controller runs one asyncio loop that must never block; an
adapter whose backend is synchronous runs it in a worker thread and does not return (not even
on cancellation) before that call has finished, so a barrier around a call really covers it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlckpt.dataplane.restore_guard import RestoreGuard

# A column as callers hand it in: one batched tensor (first dim = rows) or one tensor per row.
FieldValue = torch.Tensor | Sequence[torch.Tensor]

# Name of the metadata file inside a data-plane snapshot directory (TQ's own name).
SNAPSHOT_METADATA_FILE = "metadata.json"


class DataPlaneClient(abc.ABC):
    """Rows keyed by sample id inside named partitions, plus snapshot/restore of the whole plane.

    Restore guard (two layers): ``load_checkpoint`` is refused after any data operation through
    this client (put/get/clear), and refused whenever the data plane itself already holds any
    partition or row, whoever put it there. A failed load leaves the client unusable for loads.
    """

    def __init__(self) -> None:
        self._guard = RestoreGuard()

    @abc.abstractmethod
    async def put_samples(
        self,
        partition_id: str,
        keys: Sequence[str],
        fields: Mapping[str, FieldValue],
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Write ``fields`` for ``keys``; fields put on existing keys are added/overwritten columns."""

    @abc.abstractmethod
    async def get_samples(
        self,
        partition_id: str,
        keys: Sequence[str],
        fields: Sequence[str] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Dense tensors (first dim = ``len(keys)``, in ``keys`` order) for ``fields`` (None: all).

        Raises MissingSamplesError naming every missing key; never returns fewer rows.
        """

    @abc.abstractmethod
    async def get_rows(
        self, partition_id: str, keys: Sequence[str], fields: Sequence[str]
    ) -> dict[str, list[torch.Tensor]]:
        """One tensor per row for each of ``fields`` (rows in ``keys`` order; rows may differ in shape).

        Raises MissingSamplesError naming every missing key.
        """

    @abc.abstractmethod
    async def is_empty(self) -> bool:
        """True when the data plane holds no partition at all, whoever wrote it."""

    @abc.abstractmethod
    async def clear_samples(self, partition_id: str, keys: Sequence[str]) -> None:
        """Delete the rows of ``keys`` (absent keys are ignored)."""

    @abc.abstractmethod
    async def list_sample_ids(self, partition_id: str) -> list[str]:
        """Sorted sample ids stored in ``partition_id`` (metadata only; [] if it does not exist)."""

    @abc.abstractmethod
    async def save_checkpoint(self, local_dir: str | Path, metadata: Mapping[str, Any]) -> None:
        """Snapshot the whole data plane into ``local_dir`` with JSON-serializable ``metadata``.

        Not a consistent snapshot while writers are active: callers hold the checkpoint barrier.
        """

    @abc.abstractmethod
    async def load_checkpoint(self, local_dir: str | Path) -> dict[str, Any]:
        """Restore a snapshot onto an untouched data plane; returns the metadata saved with it.

        Raises RestoreRefusedError (see the class docstring). A snapshot may hold pickles: an adapter
        unpickles nothing of it where code could run (allowlist or weights-only loads; UnsafeContentError
        otherwise), and a restore loads only a snapshot whose digests were verified first.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Release this client; an owning (bootstrap) client also shuts the data plane down."""

    @property
    def restore_guard(self) -> RestoreGuard:
        """This client's restore guard (for restore procedures outside the adapter)."""
        return self._guard

    @property
    def touched(self) -> bool:
        """True once a data operation went through this client (loads are then refused)."""
        return self._guard.touched
