"""`rlckpt bench barrier`: how long finished rollouts stall at commit while a save holds the window.

For each data-plane size the benchmark fills TransferQueue through the replay buffer, then for each
destination × upload timing runs a rollout pump (fixed commit rate, oldest groups trimmed) and a save every
``save_gap_s`` seconds through the real ``save_bundle``. Per point it reports each commit's wait
at the barrier (outside saves, during saves, and for the commits that arrived while the window was
held), the window length, TransferQueue's own snapshot time and the whole save's time.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlckpt.bench.blob_trainer import BlobTrainer
from rlckpt.bench.destinations import Destination
from rlckpt.bench.participants import bench_participants
from rlckpt.bench.pump import RolloutPump
from rlckpt.bench.rows import MiB, RowShape
from rlckpt.bench.stats import Summary, summarize
from rlckpt.bench.timed_barrier import MutationEvent, TimedBarrier, WindowEvent
from rlckpt.bench.timed_plane import TimedDataPlane
from rlckpt.checkpoint.row_copy import RowCopier
from rlckpt.checkpoint.save import UploadTiming, save_bundle
from rlckpt.dataplane.base import DataPlaneClient
from rlckpt.replay import ReplayBuffer
from rlckpt.store import BundleStore

logger = logging.getLogger(__name__)

PARTITION = "bench"
# Waits below this are event-loop scheduling noise, not a stall; ratios floor both sides here so
# "0.02 ms vs 0.01 ms" does not read as a 2x miss.
STALL_RESOLUTION_MS = 1.0
PINNED_WAIT_TARGET_MS = 2.0


@dataclass
class BarrierConfig:
    """One sweep: sizes × destinations (given separately) × upload timings, and the pump/save cadence."""

    sizes_mib: list[float] = field(default_factory=lambda: [16.0, 64.0, 256.0])
    upload_timings: list[UploadTiming] = field(default_factory=lambda: ["inline", "staged", "pinned"])
    saves: int = 3
    save_gap_s: float = 2.0  # idle time between the end of one save and the start of the next
    warmup_s: float = 1.0
    tail_s: float = 0.5
    commit_rate: float = 20.0  # groups per second
    policy_mib: float = 16.0
    shape: RowShape = field(default_factory=RowShape)
    staging_root: str | None = None  # None: /dev/shm (save_bundle's default)
    compress: bool = True


@dataclass
class SaveRecord:
    """One save of a point, from its SaveReport plus the benchmark's own wall-clock bounds."""

    step: int
    window_s: float
    snapshot_s: float
    upload_s: float
    policy_s: float
    total_s: float
    bytes_written: int
    window_minus_snapshot_ms: float
    # the window minus the snapshot, split: before the listing (index capture), the listing
    # itself, between listing and snapshot (inventory check, metadata), after the snapshot
    pre_list_ms: float = 0.0
    list_ms: float = 0.0
    list_to_snapshot_ms: float = 0.0
    post_snapshot_ms: float = 0.0


@dataclass
class PointResult:
    """Everything measured at one size × destination × upload timing."""

    size_mib: float
    destination: str
    upload_timing: str
    groups: int
    rows: int
    data_plane_bytes: int
    commit_rate: float
    commits: int
    commits_idle: Summary  # requested while no save was running
    commits_during_save: Summary  # requested between a save's start and end
    commits_in_window: Summary  # requested while (or just before) the window was held
    saves: list[SaveRecord]
    # the whole commit (barrier wait + put + index update), which a copy reading the data plane can slow
    latency_idle: Summary = field(default_factory=lambda: summarize([]))
    latency_during_save: Summary = field(default_factory=lambda: summarize([]))

    @property
    def _worst_save(self) -> SaveRecord:
        return max(self.saves, key=lambda s: s.window_s)

    @property
    def window_ms(self) -> float:
        """The longest window of the point's saves."""
        return 1e3 * self._worst_save.window_s

    @property
    def snapshot_ms(self) -> float:
        """TransferQueue's snapshot time in the save with the longest window."""
        return 1e3 * self._worst_save.snapshot_s

    @property
    def window_excess_median_ms(self) -> float:
        """Median (window − TQ snapshot) over the saves."""
        return statistics.median(s.window_minus_snapshot_ms for s in self.saves)

    @property
    def window_excess_ms(self) -> float:
        """Worst (window − TQ snapshot) over the saves: what the window adds to TQ's own work."""
        return max(s.window_minus_snapshot_ms for s in self.saves)


def classify_commit_waits(
    events: Sequence[MutationEvent],
    saves: Sequence[tuple[float, float]],
    windows: Sequence[WindowEvent],
) -> tuple[list[float], list[float], list[float]]:
    """Split commit waits into (idle, during a save, arrived for a window).

    A commit is *during a save* when it asked for the barrier between a save's start and end; it
    *arrived for a window* when it asked while the window was held or queued behind it (asked
    before the window opened but was let in only after it closed).
    """
    idle, during, in_window = [], [], []
    for ev in events:
        if ev.role != "commit":
            continue
        if any(start <= ev.requested <= end for start, end in saves):
            during.append(ev.wait)
        else:
            idle.append(ev.wait)
        if any(w.start <= ev.requested <= w.end or (ev.requested < w.start and ev.granted >= w.end) for w in windows):
            in_window.append(ev.wait)
    return idle, during, in_window


async def run_point(
    replay: ReplayBuffer,
    barrier: TimedBarrier,
    timed: TimedDataPlane,
    pump: RolloutPump,
    *,
    config: BarrierConfig,
    size_mib: float,
    destination: Destination,
    upload_timing: UploadTiming,
    trainer: BlobTrainer,
    keepalive: list[Any] | None = None,
    row_copier: RowCopier | None = None,
) -> PointResult:
    """Pump rollouts, save ``config.saves`` times, and summarize what the commits waited.

    ``replay`` indexes rows through ``timed`` and guards them with ``barrier``: the save reads the
    listing and snapshot times from the one and the window from the other.

    The store is appended to ``keepalive`` so the caller can drop it after its event loop has
    ended: s3fs closing a filesystem that is garbage-collected while an asyncio loop runs in
    this thread schedules the close on the wrong loop and logs an error.
    """
    store = BundleStore(destination.run_url(f"barrier-{size_mib:g}MiB-{upload_timing}"), destination.storage_options)
    if keepalive is not None:
        keepalive.append(store)
    parts = bench_participants(
        store, trainer, replay, staging_root=config.staging_root, compress=config.compress, row_copier=row_copier
    )
    barrier.clear_events()
    pump.latencies.clear()
    stop = asyncio.Event()
    pump_task = asyncio.create_task(pump.run(stop), name="bench-pump")
    started_commits = pump.committed
    save_bounds: list[tuple[float, float]] = []
    records: list[SaveRecord] = []
    t_begin = time.perf_counter()
    try:
        await asyncio.sleep(config.warmup_s)
        for step in range(1, config.saves + 1):
            await asyncio.sleep(config.save_gap_s)
            if pump_task.done():
                break
            t0 = time.perf_counter()
            windows_before = len(barrier.window_events)
            report = await save_bundle(parts, step, upload_timing=upload_timing)
            save_bounds.append((t0, time.perf_counter()))
            record = SaveRecord(
                step=step,
                window_s=report.window_s,
                snapshot_s=report.snapshot_s,
                upload_s=report.upload_s,
                policy_s=report.policy_s,
                total_s=report.total_s,
                bytes_written=report.bytes_written,
                window_minus_snapshot_ms=1e3 * (report.window_s - report.snapshot_s),
            )
            if len(barrier.window_events) > windows_before:  # pinned saves hold no window
                window, c = barrier.window_events[windows_before], timed.calls
                record.pre_list_ms = 1e3 * (c.list_start - window.start)
                record.list_ms = 1e3 * (c.list_end - c.list_start)
                record.list_to_snapshot_ms = 1e3 * (c.snapshot_start - c.list_end)
                record.post_snapshot_ms = 1e3 * (window.end - c.snapshot_end)
            records.append(record)
        await asyncio.sleep(config.tail_s)
    finally:
        stop.set()
        await pump_task  # re-raises a pump failure: the point is invalid then
    elapsed = time.perf_counter() - t_begin
    idle, during, in_window = classify_commit_waits(barrier.mutation_events, save_bounds, barrier.window_events)
    latency_during = [s for start, s in pump.latencies if any(a <= start <= b for a, b in save_bounds)]
    latency_idle = [s for start, s in pump.latencies if not any(a <= start <= b for a, b in save_bounds)]
    groups = sum(1 for g in replay.groups() if g.committed)
    commits = pump.committed - started_commits
    return PointResult(
        size_mib=size_mib,
        destination=destination.name,
        upload_timing=upload_timing,
        groups=groups,
        rows=groups * config.shape.group_size,
        data_plane_bytes=groups * config.shape.group_bytes,
        commit_rate=commits / elapsed if elapsed > 0 else 0.0,
        commits=commits,
        commits_idle=summarize(idle),
        commits_during_save=summarize(during),
        commits_in_window=summarize(in_window),
        saves=records,
        latency_idle=summarize(latency_idle),
        latency_during_save=summarize(latency_during),
    )


async def run_size(
    data_plane: DataPlaneClient,
    *,
    config: BarrierConfig,
    size_mib: float,
    destinations: Sequence[Destination],
    on_point: Callable[[PointResult], None] = lambda p: None,
    keepalive: list[Any] | None = None,
    row_copier: RowCopier | None = None,
) -> list[PointResult]:
    """Fill an empty data plane to ``size_mib`` and run every destination × upload timing on it."""
    barrier = TimedBarrier()
    timed = TimedDataPlane(data_plane)  # a pass-through proxy: times the save's listing and snapshot
    replay = ReplayBuffer(timed, barrier, partition_id=PARTITION, group_size=config.shape.group_size)
    keep = config.shape.groups_for(size_mib)
    pump = RolloutPump(replay, config.shape, rate=config.commit_rate, keep_groups=keep)
    t = time.perf_counter()
    await pump.fill(keep)
    logger.info(
        "filled %d groups (%.1f MiB) in %.1fs", keep, keep * config.shape.group_bytes / MiB, time.perf_counter() - t
    )
    trainer = BlobTrainer(int(config.policy_mib * MiB))
    results = []
    for destination in destinations:
        for upload_timing in config.upload_timings:
            point = await run_point(
                replay,
                barrier,
                timed,
                pump,
                config=config,
                size_mib=size_mib,
                destination=destination,
                upload_timing=upload_timing,
                trainer=trainer,
                keepalive=keepalive,
                row_copier=row_copier,
            )
            on_point(point)
            results.append(point)
    return results


def run_sweep(
    config: BarrierConfig,
    destinations: Sequence[Destination],
    *,
    connect: Callable[[], DataPlaneClient],
    reset: Callable[[], None],
    on_point: Callable[[PointResult], None] = lambda p: None,
    row_copier: RowCopier | None = None,
) -> list[PointResult]:
    """Every size on an emptied TransferQueue with a fresh connect-only client (sync entry point)."""
    results: list[PointResult] = []
    for size in config.sizes_mib:
        reset()
        client = connect()
        keepalive: list[Any] = []  # stores die after the loop (see run_point)
        results += asyncio.run(
            run_size(
                client,
                config=config,
                size_mib=size,
                destinations=destinations,
                on_point=on_point,
                keepalive=keepalive,
                row_copier=row_copier,
            )
        )
        keepalive.clear()
    reset()
    return results


# --- targets (shown, never asserted) --------------------------------------------------------------


@dataclass
class TargetCheck:
    """One target at one place: the measured ratio or excess, the limit, and whether it held."""

    target: str
    where: str
    value: float
    limit: float
    met: bool
    detail: str


def _find(points: Sequence[PointResult], size: float, dest: str, timing: str) -> PointResult | None:
    return next((p for p in points if p.size_mib == size and p.destination == dest and p.upload_timing == timing), None)


def _floored(ms: float) -> float:
    return max(ms, STALL_RESOLUTION_MS)


def evaluate_targets(points: Sequence[PointResult]) -> list[TargetCheck]:
    """The issue's three targets, on p99 of commit waits during saves (and windows for the third),
    for every S3-like destination (name starting with ``s3``) against local disk."""
    checks: list[TargetCheck] = []
    sizes = sorted({p.size_mib for p in points})
    s3_names = sorted({p.destination for p in points if p.destination.startswith("s3")})
    for s3_name in s3_names:
        for size in sizes:
            local, s3 = _find(points, size, "local", "staged"), _find(points, size, s3_name, "staged")
            if local and s3:
                ratio = _floored(s3.commits_during_save.p99_ms) / _floored(local.commits_during_save.p99_ms)
                checks.append(
                    TargetCheck(
                        "staged S3 p99 <= 1.25x staged local",
                        f"{size:g} MiB {s3_name}",
                        ratio,
                        1.25,
                        ratio <= 1.25,
                        f"S3 {s3.commits_during_save.p99_ms:.1f} ms vs local {local.commits_during_save.p99_ms:.1f} ms",
                    )
                )
        if sizes:
            big = max(sizes)
            inline, staged = _find(points, big, s3_name, "inline"), _find(points, big, s3_name, "staged")
            if inline and staged:
                ratio = _floored(inline.commits_during_save.p99_ms) / _floored(staged.commits_during_save.p99_ms)
                checks.append(
                    TargetCheck(
                        "staged >= 5x lower p99 than inline on S3",
                        f"{big:g} MiB {s3_name}",
                        ratio,
                        5.0,
                        ratio >= 5.0,
                        f"inline {inline.commits_during_save.p99_ms:.1f} ms "
                        f"vs staged {staged.commits_during_save.p99_ms:.1f} ms",
                    )
                )
    for p in points:
        if p.upload_timing == "pinned":
            d = p.commits_during_save
            checks.append(
                TargetCheck(
                    "pinned: p99 commit wait during a save <= 2 ms",
                    f"{p.size_mib:g} MiB {p.destination}",
                    d.p99_ms,
                    PINNED_WAIT_TARGET_MS,
                    d.p99_ms <= PINNED_WAIT_TARGET_MS,
                    f"max {d.max_ms:.2f} ms over {d.n} commits; whole commit p99 "
                    f"{p.latency_during_save.p99_ms:.1f} ms during saves vs {p.latency_idle.p99_ms:.1f} ms idle",
                )
            )
    for p in points:
        if p.upload_timing != "staged" or not p.saves:
            continue
        worst = max(p.saves, key=lambda s: s.window_minus_snapshot_ms)
        checks.append(
            TargetCheck(
                "window <= TQ snapshot + 10 ms",
                f"{p.size_mib:g} MiB {p.destination}",
                p.window_excess_ms,
                10.0,
                p.window_excess_ms <= 10.0,
                f"worst of {len(p.saves)} saves: window {1e3 * worst.window_s:.1f} ms, "
                f"snapshot {1e3 * worst.snapshot_s:.1f} ms (listing {worst.list_ms:.1f} ms, "
                f"index capture {worst.pre_list_ms:.1f} ms); median excess {p.window_excess_median_ms:.1f} ms",
            )
        )
    return checks


def result_document(points: Sequence[PointResult], config: BarrierConfig, meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON written to ``barrier_stall.json``: config, machine, points (with derived fields), targets."""
    from dataclasses import asdict

    out_points = []
    for p in points:
        d = asdict(p)
        d.update(
            window_ms=p.window_ms,
            snapshot_ms=p.snapshot_ms,
            window_excess_ms=p.window_excess_ms,
            window_excess_median_ms=p.window_excess_median_ms,
        )
        out_points.append(d)
    return {
        "benchmark": "barrier_stall",
        "config": asdict(config),
        "meta": meta,
        "points": out_points,
        "targets": [asdict(c) for c in evaluate_targets(points)],
    }


def points_from_document(document: dict[str, Any]) -> list[PointResult]:
    """PointResults back from a ``barrier_stall.json`` (to redraw the table and plot without measuring)."""
    out = []
    derived = {"window_ms", "snapshot_ms", "window_excess_ms", "window_excess_median_ms"}
    for raw in document["points"]:
        d = {k: v for k, v in raw.items() if k not in derived}
        for name in ("commits_idle", "commits_during_save", "commits_in_window", "latency_idle", "latency_during_save"):
            if name in d:
                d[name] = Summary(**d[name])
        d["saves"] = [SaveRecord(**s) for s in d["saves"]]
        out.append(PointResult(**d))
    return out
