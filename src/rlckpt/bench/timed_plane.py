"""A pass-through data-plane client that times the calls a save makes inside its window.

The save path reports the window and TransferQueue's snapshot; this proxy splits the rest of the
window into the inventory listing and everything else, so a window longer than the snapshot can
be attributed. The replay buffer indexes rows through the proxy, so the save (which snapshots the
replay buffer's data plane) goes through it too; every other call is passed straight on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlckpt.dataplane.base import DataPlaneClient


@dataclass
class SaveCalls:
    """perf_counter bounds of the last save's listing and snapshot calls."""

    list_start: float = 0.0
    list_end: float = 0.0
    snapshot_start: float = 0.0
    snapshot_end: float = 0.0
    history: list[tuple[float, float, float, float]] = field(default_factory=list)


class TimedDataPlane:
    """Delegates every attribute to ``inner``; records ``list_sample_ids`` and ``save_checkpoint`` times."""

    def __init__(self, inner: DataPlaneClient) -> None:
        self.inner = inner
        self.calls = SaveCalls()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def list_sample_ids(self, partition_id: str) -> list[str]:
        self.calls.list_start = time.perf_counter()
        try:
            return await self.inner.list_sample_ids(partition_id)
        finally:
            self.calls.list_end = time.perf_counter()

    async def save_checkpoint(self, local_dir: str | Path, metadata: Any) -> None:
        self.calls.snapshot_start = time.perf_counter()
        try:
            await self.inner.save_checkpoint(local_dir, metadata)
        finally:
            self.calls.snapshot_end = time.perf_counter()
