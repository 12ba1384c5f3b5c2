"""`python -m benchmarks.save_restore`: end-to-end save and restore of a whole bundle (policy + data plane) through
rlckpt, against a raw fsspec copy of the same bytes, on each destination.

rlckpt save  = ``save_bundle`` (policy write, window with TQ snapshot to local staging, digest +
               zstd + upload, manifest, COMMIT).
raw save     = TQ's snapshot to local staging, then ``fs.put`` of those files and ``fs.pipe`` of the
               policy bytes (no digests, no compression, no commit protocol).
rlckpt restore = ``restore_run`` (newest committed bundle, every digest verified, TQ loaded) onto an
               emptied TransferQueue.
raw restore  = ``fs.get`` of the raw copy, then TQ's load of it onto an emptied TransferQueue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlckpt.bench.barrier import PARTITION
from rlckpt.bench.blob_trainer import BlobTrainer
from rlckpt.bench.destinations import Destination
from rlckpt.bench.participants import bench_participants
from rlckpt.bench.pump import RolloutPump
from rlckpt.bench.rows import MiB, RowShape
from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.restore import restore_run
from rlckpt.checkpoint.save import save_bundle
from rlckpt.checkpoint.staging import staging_dir
from rlckpt.dataplane.base import DataPlaneClient
from rlckpt.dataplane.threads import run_blocking
from rlckpt.errors import CheckpointError
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer
from rlckpt.store import BundleStore

logger = logging.getLogger(__name__)


@dataclass
class SaveRestoreConfig:
    """Bundle size and repetitions of the end-to-end benchmark."""

    size_mib: float = 256.0
    policy_mib: float = 64.0
    repeats: int = 2
    shape: RowShape = field(default_factory=RowShape)
    staging_root: str | None = None
    compress: bool = True


@dataclass
class SaveRestoreResult:
    """Seconds per repetition for one destination; bytes of what was moved."""

    destination: str
    data_plane_bytes: int
    policy_bytes: int
    snapshot_bytes: int  # TQ's snapshot files as written to staging (what a raw copy moves, plus policy)
    bundle_bytes: int  # what rlckpt wrote (manifest sizes: compressed data plane + policy + sidecars)
    save_s: list[float] = field(default_factory=list)
    save_window_s: list[float] = field(default_factory=list)
    save_upload_s: list[float] = field(default_factory=list)
    raw_snapshot_s: list[float] = field(default_factory=list)
    raw_copy_s: list[float] = field(default_factory=list)
    restore_s: list[float] = field(default_factory=list)
    raw_download_s: list[float] = field(default_factory=list)
    raw_load_s: list[float] = field(default_factory=list)

    @property
    def raw_save_s(self) -> list[float]:
        """Raw save end to end: TQ snapshot to staging + copy."""
        return [a + b for a, b in zip(self.raw_snapshot_s, self.raw_copy_s, strict=True)]

    @property
    def raw_restore_s(self) -> list[float]:
        """Raw restore end to end: download + TQ load."""
        return [a + b for a, b in zip(self.raw_download_s, self.raw_load_s, strict=True)]


def _dir_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


class _Bench:
    """State shared by the repetitions: the replay index and the current data-plane client."""

    def __init__(
        self,
        replay: ReplayBuffer,
        trainer: BlobTrainer,
        config: SaveRestoreConfig,
        connect: Callable[[], DataPlaneClient],
        reset: Callable[[], None],
    ) -> None:
        self.replay = replay
        self.trainer = trainer
        self.config = config
        self.connect = connect
        self.reset = reset

    async def fresh_client(self) -> DataPlaneClient:
        """Empty TransferQueue and a new, untouched connect-only client (a restore may follow)."""
        await run_blocking(self.reset)
        return await run_blocking(self.connect)

    async def rlckpt_save(self, store: BundleStore, step: int, result: SaveRestoreResult) -> None:
        parts = bench_participants(
            store, self.trainer, self.replay, staging_root=self.config.staging_root, compress=self.config.compress
        )
        report = await save_bundle(parts, step, upload_timing="staged")
        result.save_s.append(report.total_s)
        result.save_window_s.append(report.window_s)
        result.save_upload_s.append(report.upload_s)
        result.bundle_bytes = report.bytes_written

    async def raw_save(self, destination: Destination, raw_url: str, result: SaveRestoreResult) -> None:
        fs = destination.filesystem()
        with staging_dir(self.config.staging_root, prefix="rlckpt-bench-raw-") as staging:
            snap = staging / "data_plane"
            t = time.perf_counter()
            async with self.replay.barrier.checkpoint():
                await self.replay.data_plane.save_checkpoint(snap, metadata={"bench": "raw"})
            result.raw_snapshot_s.append(time.perf_counter() - t)
            result.snapshot_bytes = _dir_bytes(snap)
            blob = await self.trainer.state_bytes()
            t = time.perf_counter()
            await run_blocking(_raw_put, fs, snap, raw_url, blob)
            result.raw_copy_s.append(time.perf_counter() - t)

    async def rlckpt_restore(self, store: BundleStore, result: SaveRestoreResult) -> None:
        client = await self.fresh_client()
        t = time.perf_counter()
        restored = await restore_run(
            store, trainer=self.trainer, bootstrap=client, phase=RestorePhase(), staging_root=self.config.staging_root
        )
        result.restore_s.append(time.perf_counter() - t)
        if restored is None:
            raise CheckpointError(f"save_restore: nothing to restore at {store.url}")
        await self._adopt(client)

    async def raw_restore(self, destination: Destination, raw_url: str, result: SaveRestoreResult) -> None:
        fs = destination.filesystem()
        with staging_dir(self.config.staging_root, prefix="rlckpt-bench-rawget-") as staging:
            t = time.perf_counter()
            blob = await run_blocking(_raw_get, fs, raw_url, staging / "data_plane")
            result.raw_download_s.append(time.perf_counter() - t)
            self.trainer.load_state_bytes(blob)
            client = await self.fresh_client()
            t = time.perf_counter()
            await client.load_checkpoint(staging / "data_plane")
            result.raw_load_s.append(time.perf_counter() - t)
        await self._adopt(client)

    async def _adopt(self, client: DataPlaneClient) -> None:
        """Point the replay buffer at the restored data plane and check it holds the indexed rows."""
        self.replay.data_plane = client
        self.replay.validate_inventory(await client.list_sample_ids(PARTITION))


def _raw_put(fs: Any, snap: Path, raw_url: str, blob: bytes) -> None:
    fs.put(str(snap), f"{raw_url}/data_plane", recursive=True)
    fs.pipe_file(f"{raw_url}/policy/state.pt", blob)


def _raw_get(fs: Any, raw_url: str, local: Path) -> bytes:
    local.parent.mkdir(parents=True, exist_ok=True)
    fs.get(f"{raw_url}/data_plane", str(local), recursive=True)
    return fs.cat_file(f"{raw_url}/policy/state.pt")


async def run_destinations(
    data_plane: DataPlaneClient,
    *,
    config: SaveRestoreConfig,
    destinations: Sequence[Destination],
    connect: Callable[[], DataPlaneClient],
    reset: Callable[[], None],
    keepalive: list[Any] | None = None,
) -> list[SaveRestoreResult]:
    """Fill the (empty) data plane once, then save/restore through rlckpt and raw on each destination."""
    replay = ReplayBuffer(
        data_plane, DataPlaneCheckpointBarrier(), partition_id=PARTITION, group_size=config.shape.group_size
    )
    groups = config.shape.groups_for(config.size_mib)
    await RolloutPump(replay, config.shape, rate=1.0, keep_groups=groups).fill(groups)
    trainer = BlobTrainer(int(config.policy_mib * MiB))
    bench = _Bench(replay, trainer, config, connect, reset)
    results = []
    for destination in destinations:
        result = SaveRestoreResult(
            destination.name, groups * config.shape.group_bytes, int(config.policy_mib * MiB), 0, 0
        )
        store = BundleStore(destination.run_url("save"), destination.storage_options)
        if keepalive is not None:  # dropped after the event loop ends (see barrier.run_point)
            keepalive.append(store)
        for rep in range(config.repeats):
            raw_url = destination.run_url("raw")
            await bench.rlckpt_save(store, rep + 1, result)
            await bench.raw_save(destination, raw_url, result)
            await bench.rlckpt_restore(store, result)
            await bench.raw_restore(destination, raw_url, result)
            await run_blocking(destination.filesystem().rm, raw_url, recursive=True)
            logger.info(
                "%s rep %d: save %.2fs (raw %.2fs), restore %.2fs (raw %.2fs)",
                destination.name,
                rep,
                result.save_s[-1],
                result.raw_save_s[-1],
                result.restore_s[-1],
                result.raw_restore_s[-1],
            )
        results.append(result)
    return results


def run_save_restore(
    config: SaveRestoreConfig,
    destinations: Sequence[Destination],
    *,
    connect: Callable[[], DataPlaneClient],
    reset: Callable[[], None],
) -> list[SaveRestoreResult]:
    """Sync entry point: an emptied TransferQueue, a fresh client, every destination; empties TQ after."""
    reset()
    keepalive: list[Any] = []
    try:
        return asyncio.run(
            run_destinations(
                connect(), config=config, destinations=destinations, connect=connect, reset=reset, keepalive=keepalive
            )
        )
    finally:
        keepalive.clear()
        reset()
