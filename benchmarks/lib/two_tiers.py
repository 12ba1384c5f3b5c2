"""`python -m benchmarks.save_restore --two-tier`: what replication costs the train pump, and how long a bundle takes to
reach the remote tier (docs/tiers.md).

Three ways to save the same state (a real-tensor policy and a real TransferQueue data plane, async saves
with the pinned upload timing, as `python -m benchmarks.save_restore --async`):

- local only: saves to the local tier, nothing else;
- two tiers: saves to the local tier while the previous bundle is replicated to S3 by a BundleReplicator
  in a Ray actor of its own (as `rlckpt train --replicate-to` runs it): each save's downtime is measured
  with a replication in flight beside it, and each replication's lag from local COMMIT to remote COMMIT;
- straight to S3: saves to the remote store directly (its downtime, and its whole save: begin to COMMIT).

Targets (issue 20): two-tier downtime <= 1.1x local-only; lag <= 1.2x a direct S3 save of the same bundle.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.lib.save_downtime import DowntimeConfig, TensorPolicy
from rlckpt.bench.barrier import PARTITION
from rlckpt.bench.destinations import Destination
from rlckpt.bench.participants import bench_participants
from rlckpt.bench.pump import RolloutPump
from rlckpt.bench.rows import MiB
from rlckpt.checkpoint.row_copy import RowCopier
from rlckpt.checkpoint.save import SaveParticipants, start_save
from rlckpt.dataplane.base import DataPlaneClient
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer
from rlckpt.store import BundleStore
from rlckpt.tiers import ReplicationConfig

logger = logging.getLogger(__name__)

DOWNTIME_TARGET = 1.1  # two-tier downtime / local-only downtime
LAG_TARGET = 1.2  # lag from local to remote commit / a direct S3 save


@dataclass
class TwoTierResult:
    """Seconds per save of each way (lists: one value per save), medians compared against the targets."""

    local_downtime_s: list[float] = field(default_factory=list)
    two_tier_downtime_s: list[float] = field(default_factory=list)
    lag_s: list[float] = field(default_factory=list)  # local COMMIT -> remote COMMIT
    copy_s: list[float] = field(default_factory=list)  # the replication alone
    s3_downtime_s: list[float] = field(default_factory=list)
    s3_save_s: list[float] = field(default_factory=list)  # a direct S3 save: begin to COMMIT
    replicated_bytes: int = 0

    @staticmethod
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    @property
    def downtime_ratio(self) -> float:
        return self.median(self.two_tier_downtime_s) / self.median(self.local_downtime_s)

    @property
    def lag_ratio(self) -> float:
        return self.median(self.lag_s) / self.median(self.s3_save_s)


class _ActorReplicator:
    """A BundleReplicator in a Ray actor of its own (as controller.replication starts it)."""

    def __init__(self, local: Destination, remote: Destination, local_url: str, remote_url: str) -> None:
        import ray

        from rlckpt.tiers import BundleReplicator

        config = ReplicationConfig(remote_url, remote.storage_options)
        actor_class: Any = ray.remote(BundleReplicator).options(num_cpus=0)
        self.actor: Any = actor_class.remote(local_url, local.storage_options, config)

    def start(self, step: int) -> asyncio.Task[tuple[Any, float]]:
        """The replication of `step`, started: a task giving its report and the wall-clock time it ended."""
        ref = self.actor.replicate.remote(step)

        async def done() -> tuple[Any, float]:
            report = await ref
            return report, time.time()

        return asyncio.ensure_future(done())

    def stop(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)


async def _save(parts: SaveParticipants, step: int) -> tuple[float, float, float]:
    """One async save: (downtime, begin to COMMIT, COMMIT's wall-clock time)."""
    t = time.perf_counter()
    pending = await start_save(parts, step, upload_timing="pinned")
    downtime = time.perf_counter() - t
    report = await pending.finish()
    return downtime, report.total_s, time.time()


async def measure_two_tiers(
    data_plane: DataPlaneClient,
    config: DowntimeConfig,
    local: Destination,
    remote: Destination,
    row_copier: RowCopier | None,
    keepalive: list[Any],
    on_line: Callable[[str], None] = lambda line: None,
) -> TwoTierResult:
    """Fill the data plane once, then `repeats` saves each way (module doc)."""
    replay = ReplayBuffer(
        data_plane, DataPlaneCheckpointBarrier(), partition_id=PARTITION, group_size=config.shape.group_size
    )
    groups = config.shape.groups_for(config.size_mib)
    await RolloutPump(replay, config.shape, rate=1.0, keep_groups=groups).fill(groups)
    policy = TensorPolicy(int(config.policy_mib * MiB))
    result = TwoTierResult()
    # the data plane is compressed as a two-tier run stores it (zstd by default when the remote is S3)
    compress = True if config.compress is None else config.compress

    def parts_for(destination: Destination, label: str) -> tuple[SaveParticipants, str]:
        url = destination.run_url(label)
        store = BundleStore(url, destination.storage_options)
        keepalive.append(store)
        parts = bench_participants(
            store, policy, replay, staging_root=config.staging_root, compress=compress, row_copier=row_copier
        )
        parts.retention = None  # every bundle stays: replication reads them
        return parts, url

    local_only, _ = parts_for(local, "local-only")
    await _save(local_only, 1)  # warm-up, as the two-tier saves 1-2 are: the first staging allocates
    for step in range(2, config.repeats + 2):
        downtime, _total, _at = await _save(local_only, step)
        result.local_downtime_s.append(downtime)
        on_line(f"local only    save {step}: downtime {downtime * 1e3:.0f} ms")

    tiered, tiered_url = parts_for(local, "two-tier")
    remote_url = remote.run_url("two-tier")
    replicator = _ActorReplicator(local, remote, tiered_url, remote_url)
    try:
        _d, _t, committed_at = await _save(tiered, 1)
        # a warm-up replication first (the actor opens its stores, the remote store probes create-exclusive
        # once): a long-running run pays that once, so it is not measured
        report, _ended = await replicator.start(1)
        on_line(f"two tiers     warm-up replication of 1: copy {report.copy.seconds:.2f}s (not measured)")
        _d, _t, committed_at = await _save(tiered, 2)  # its replication runs beside save 3, and so on
        for step in range(3, config.repeats + 3):
            in_flight = replicator.start(step - 1)
            downtime, _total, next_committed_at = await _save(tiered, step)
            report, replicated_at = await in_flight
            lag = replicated_at - committed_at
            result.two_tier_downtime_s.append(downtime)
            result.lag_s.append(lag)
            result.copy_s.append(report.copy.seconds)
            result.replicated_bytes = report.copy.bytes
            on_line(
                f"two tiers     save {step}: downtime {downtime * 1e3:.0f} ms beside the replication of "
                f"{step - 1} (lag {lag:.2f}s, copy {report.copy.seconds:.2f}s)"
            )
            committed_at = next_committed_at
            # the replication of the last save is not beside any save: not measured
    finally:
        replicator.stop()

    straight, _ = parts_for(remote, "straight")
    for step in range(1, config.repeats + 1):
        downtime, total, _at = await _save(straight, step)
        result.s3_downtime_s.append(downtime)
        result.s3_save_s.append(total)
        on_line(f"straight S3   save {step}: downtime {downtime * 1e3:.0f} ms, whole save {total:.2f}s")
    return result


def _lag_note() -> str:
    return (
        "Lag: from the local COMMIT of a bundle to the end of its replication (remote COMMIT), measured while "
        "the next save runs beside it; a direct S3 save is begin to COMMIT of the same state."
    )


def two_tier_table(result: TwoTierResult) -> str:
    """Markdown: medians of each way and the two targets."""
    m = TwoTierResult.median
    lines = [
        "| way | train-pump downtime | whole save / lag |",
        "|---|---:|---:|",
        f"| local only | {m(result.local_downtime_s) * 1e3:.0f} ms | - |",
        f"| two tiers (replication beside the save) | {m(result.two_tier_downtime_s) * 1e3:.0f} ms | "
        f"lag {m(result.lag_s):.2f} s (copy {m(result.copy_s):.2f} s, {result.replicated_bytes / MiB:.0f} MiB) |",
        f"| straight to S3 | {m(result.s3_downtime_s) * 1e3:.0f} ms | save {m(result.s3_save_s):.2f} s |",
        "",
        _lag_note(),
        "",
    ]
    for name, ratio, target in (
        ("downtime, two tiers / local only", result.downtime_ratio, DOWNTIME_TARGET),
        ("lag / direct S3 save", result.lag_ratio, LAG_TARGET),
    ):
        verdict = "met" if ratio <= target else "MISSED"
        lines.append(f"- {name}: {ratio:.2f}× (target ≤ {target}×) — {verdict}")
    return "\n".join(lines) + "\n"


def two_tier_document(result: TwoTierResult, config: DowntimeConfig, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "save_two_tier",
        "config": asdict(config),
        "meta": meta,
        "targets": {"downtime_ratio": DOWNTIME_TARGET, "lag_ratio": LAG_TARGET},
        "result": {**asdict(result), "downtime_ratio": result.downtime_ratio, "lag_ratio": result.lag_ratio},
    }


def run_two_tiers(
    data_plane: DataPlaneClient,
    config: DowntimeConfig,
    local: Destination,
    remote: Destination,
    row_copier: RowCopier | None,
    on_line: Callable[[str], None],
) -> TwoTierResult:
    """measure_two_tiers on a fresh event loop; the stores are dropped after it ends."""
    keepalive: list[Any] = []
    try:
        return asyncio.run(measure_two_tiers(data_plane, config, local, remote, row_copier, keepalive, on_line))
    finally:
        keepalive.clear()
