"""`python -m benchmarks.save_restore --async`: how long a save blocks the train pump, synchronous against async,
next to the time it takes to stage the policy to host memory.

The train pump waits for ``start_save`` (begin, policy staging, the window) and, in a synchronous
save, for ``PendingSave.finish`` too (policy and data plane written, manifest, COMMIT). The target
(issue 11): an async save's downtime is at most 1.2× the staging time. The policy here is real
tensors, staged by copying them into fresh host memory as DCP's ``async_save`` stager does, and
written with ``torch.save`` into the transaction; the data plane is real TransferQueue, saved with
the pinned upload timing (the window is the index capture alone).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from rlckpt.bench.barrier import PARTITION
from rlckpt.bench.destinations import Destination
from rlckpt.bench.participants import bench_participants
from rlckpt.bench.pump import RolloutPump
from rlckpt.bench.rows import MiB, RowShape
from rlckpt.checkpoint import layout
from rlckpt.checkpoint.row_copy import RowCopier
from rlckpt.checkpoint.save import UploadTiming, start_save
from rlckpt.dataplane.base import DataPlaneClient
from rlckpt.dataplane.threads import run_blocking
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer
from rlckpt.store import BundleStore, BundleTransaction, Receipt

logger = logging.getLogger(__name__)

TARGET_RATIO = 1.2  # async downtime / staging time
CHUNK_BYTES = 16 * MiB  # the policy is tensors of this size, like the shards of a real model


@dataclass
class DowntimeConfig:
    """Sizes, repetitions and the save path measured."""

    size_mib: float = 256.0  # data plane
    policy_mib: float = 256.0
    repeats: int = 3
    upload_timing: UploadTiming = "pinned"
    shape: RowShape = field(default_factory=RowShape)
    staging_root: str | None = None
    compress: bool | None = None  # None: zstd on object stores only


@dataclass
class DowntimeResult:
    """Per save of one destination and save mode (seconds)."""

    destination: str
    mode: str  # "sync" or "async"
    staging_s: list[float] = field(default_factory=list)  # policy copied to host memory
    downtime_s: list[float] = field(default_factory=list)  # what the train pump waited for
    total_s: list[float] = field(default_factory=list)  # begin to COMMIT

    def median(self, name: str) -> float:
        return statistics.median(getattr(self, name))

    @property
    def ratio(self) -> float:
        """Median downtime over median staging time."""
        return self.median("downtime_s") / self.median("staging_s")


class TensorPolicy:
    """A policy of real float32 tensors; staging clones them (host memory), the write ``torch.save``s
    the clone into the transaction, so training could change the originals meanwhile."""

    def __init__(self, nbytes: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        count = max(1, nbytes // CHUNK_BYTES)
        per = max(1, nbytes // count // 4)
        self.tensors = {f"layer{i}.weight": torch.randn(per, generator=g) for i in range(count)}
        self.last_staging_s = 0.0

    async def stage_policy(self) -> StagedTensors:
        t = time.perf_counter()
        copy = await run_blocking(lambda: {name: tensor.clone() for name, tensor in self.tensors.items()})
        self.last_staging_s = time.perf_counter() - t
        return StagedTensors(copy)


@dataclass
class StagedTensors:
    tensors: dict[str, torch.Tensor]

    async def write(self, txn: BundleTransaction) -> list[Receipt]:
        def write() -> None:
            with txn.open(layout.POLICY_FILE) as stream:
                torch.save(self.tensors, stream)

        await run_blocking(write)
        return []

    async def discard(self) -> None:
        self.tensors = {}


async def measure_destination(
    replay: ReplayBuffer,
    policy: TensorPolicy,
    destination: Destination,
    config: DowntimeConfig,
    row_copier: RowCopier | None,
    keepalive: list[Any],
) -> list[DowntimeResult]:
    """``repeats`` synchronous then ``repeats`` async saves of the same state to one destination."""
    store = BundleStore(destination.run_url("downtime"), destination.storage_options)
    keepalive.append(store)  # dropped after the event loop ends (see barrier.run_point)
    parts = bench_participants(
        store, policy, replay, staging_root=config.staging_root, compress=config.compress, row_copier=row_copier
    )
    out = []
    step = 0
    for mode in ("sync", "async"):
        result = DowntimeResult(destination.name, mode)
        for _ in range(config.repeats):
            step += 1
            t = time.perf_counter()
            pending = await start_save(parts, step, upload_timing=config.upload_timing)
            foreground = time.perf_counter() - t
            report = await pending.finish()  # async: what runs beside training; timed, not waited for
            result.staging_s.append(policy.last_staging_s)
            result.downtime_s.append(foreground if mode == "async" else time.perf_counter() - t)
            result.total_s.append(report.total_s)
            logger.info(
                "%s %s save %d: staging %.3fs, downtime %.3fs, total %.3fs",
                destination.name,
                mode,
                step,
                result.staging_s[-1],
                result.downtime_s[-1],
                result.total_s[-1],
            )
        out.append(result)
    return out


async def run_downtime(
    data_plane: DataPlaneClient,
    config: DowntimeConfig,
    destinations: Sequence[Destination],
    row_copier: RowCopier | None,
    keepalive: list[Any],
    on_result: Callable[[DowntimeResult], None] | None = None,
) -> list[DowntimeResult]:
    """Fill the (empty) data plane to ``size_mib`` once, then measure every destination."""
    replay = ReplayBuffer(
        data_plane, DataPlaneCheckpointBarrier(), partition_id=PARTITION, group_size=config.shape.group_size
    )
    groups = config.shape.groups_for(config.size_mib)
    await RolloutPump(replay, config.shape, rate=1.0, keep_groups=groups).fill(groups)
    policy = TensorPolicy(int(config.policy_mib * MiB))
    results = []
    for destination in destinations:
        for result in await measure_destination(replay, policy, destination, config, row_copier, keepalive):
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results


def downtime_table(results: Sequence[DowntimeResult]) -> str:
    """Markdown: medians per destination and mode, and whether the async target holds."""
    lines = [
        "| destination | save | policy staging | train-pump downtime | downtime / staging | whole save |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.destination} | {r.mode} | {r.median('staging_s') * 1e3:.0f} ms | "
            f"{r.median('downtime_s') * 1e3:.0f} ms | {r.ratio:.2f}× | {r.median('total_s'):.2f} s |"
        )
    lines.append("")
    lines.append(f"Target: async downtime ≤ {TARGET_RATIO}× the staging time (medians).")
    lines.append("")
    for r in results:
        if r.mode == "async":
            verdict = "met" if r.ratio <= TARGET_RATIO else "MISSED"
            lines.append(f"- {r.destination}: {r.ratio:.2f}× — {verdict}")
    return "\n".join(lines) + "\n"


def result_document(results: Sequence[DowntimeResult], config: DowntimeConfig, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "save_downtime",
        "config": asdict(config),
        "meta": meta,
        "target_ratio": TARGET_RATIO,
        "results": [{**asdict(r), "ratio": r.ratio} for r in results],
    }
