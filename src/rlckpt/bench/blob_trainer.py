"""A stand-in trainer for the benchmarks: hands out a fixed blob of incompressible bytes as its state."""

from __future__ import annotations

import os

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.restore import PolicyLocation
from rlckpt.checkpoint.save import StagedBytes
from rlckpt.dataplane.threads import run_blocking
from rlckpt.errors import CheckpointError
from rlckpt.store import BundleStore


class BlobTrainer:
    """Stages a fixed blob as its policy, like the trainer handle; the bytes are made once, up front."""

    def __init__(self, nbytes: int) -> None:
        self._blob = os.urandom(nbytes)

    async def state_bytes(self) -> bytes:
        return self._blob

    async def stage_policy(self) -> StagedBytes:
        return StagedBytes(self._blob)

    async def load_policy(self, location: PolicyLocation) -> None:
        """Restore side (``TrainerStateSink``): read the blob back, digest-checked, as the ranks would."""
        store = BundleStore(location.url, location.storage_options)
        self.load_state_bytes(await run_blocking(lambda: store.open(location.step).read_bytes(layout.POLICY_FILE)))

    def load_state_bytes(self, data: bytes) -> None:
        """Restore side: accept the verified bytes (only their length is checked)."""
        if len(data) != len(self._blob):
            raise CheckpointError(f"BlobTrainer: restored {len(data)} bytes, saved {len(self._blob)}")
