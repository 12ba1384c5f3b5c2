"""`rlckpt bench policy`: save and load a sharded policy (FSDP2 MLP + AdamW state) through rlckpt.dcp and
through DCP's own writer/reader, on the same state, in the same processes, one after the other.

For each rank count, N ranks are spawned once (gloo on 127.0.0.1, FSDP2 on a CPU mesh); for each
destination and size they build the state, then per repeat save and load it through both systems (the
order alternates between repeats). A save or load is timed on rank 0 from a barrier before it to a barrier
after it, so its time is the slowest rank's. Before each load the state is zeroed, after it the loaded
state is compared bitwise with what was saved.

- rlckpt: standalone `BundleStorageWriter(store, step=k)` (one BundleStore per rank, kept across saves as
  a trainer would), `BundleStorageReader(store, step=k)`: files fsynced (local) and digested.
- DCP: `FileSystemWriter(dir)` (its default sync_files=True: each file fsynced) and `FileSystemReader` on
  local disk; `FsspecWriter(url, sync_files=False)` and `FsspecReader` on S3 (with sync_files=True it
  would call a machine-wide `os.sync()` per file, which would only slow DCP down).
- the checked floor (local disk): after each DCP load, every rank hashes the shard files it wrote
  (`__<rank>_*.distcp`, read into memory first, untimed) with BLAKE3 as rlckpt's reader does; DCP's
  load plus that pass is what a load that refuses unverified bytes cannot beat.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rlckpt.bench.rows import MiB

DEPTH = 8  # Linear layers; the width follows from the size asked for
S3_TARGET = 1.10  # save and load, against DCP
LOCAL_SAVE_TARGET = 1.25  # against DCP's FileSystemWriter (both fsync)
LOCAL_LOAD_TARGET = 1.15  # against the checked floor: DCP's load + one BLAKE3 pass over the same bytes
SYSTEMS = ("rlckpt", "dcp")


def width_for(size_mib: float, depth: int = DEPTH) -> int:
    """MLP width whose parameters + AdamW's two moments (fp32) come to about `size_mib`."""
    per_layer = size_mib * MiB / (3 * 4 * depth)  # 3 fp32 tensors (param, exp_avg, exp_avg_sq) per weight
    return max(8, int(round(math.sqrt(per_layer) / 8)) * 8)


@dataclass(frozen=True)
class PolicyBenchConfig:
    sizes_mib: list[float]
    ranks: list[int]
    repeats: int = 3
    verify: bool = True
    thread_count: int = 1  # writer threads per rank, the same for both systems (DCP's default is 1)


@dataclass(frozen=True)
class DestinationJob:
    """Where one destination's saves go: the rlckpt run and DCP's checkpoint root (a dir or s3:// URL)."""

    destination: str
    run_url: str
    dcp_root: str
    storage_options: dict[str, Any] | None


@dataclass(frozen=True)
class RankJob:
    """What the ranks of one spawn do (every destination, size and repeat at one rank count), and where
    rank 0 writes its measurements."""

    destinations: list[DestinationJob]
    sizes_mib: list[float]
    repeats: int
    verify: bool
    thread_count: int
    out_path: str


@dataclass
class Measurement:
    """One save + load of one system at one point."""

    system: str
    repeat: int
    save_s: float
    load_s: float
    verified: bool
    digest_s: float | None = None  # DCP's measurements on local disk: the BLAKE3 pass over its files


@dataclass
class PointResult:
    """Every measurement at one (size, ranks, destination)."""

    size_mib: float
    state_bytes: int
    width: int
    ranks: int
    destination: str
    measurements: list[Measurement] = field(default_factory=list)

    def times(self, system: str, op: str) -> list[float]:
        return [getattr(m, f"{op}_s") for m in self.measurements if m.system == system]

    def median(self, system: str, op: str) -> float:
        values = self.times(system, op)
        return statistics.median(values) if values else float("nan")

    def ratio(self, op: str) -> float:
        """rlckpt's median time over DCP's (below 1: rlckpt faster)."""
        return self.median("rlckpt", op) / self.median("dcp", op)

    def mib_per_s(self, system: str, op: str) -> float:
        """Aggregate throughput over all ranks: the whole state over the median time."""
        return self.state_bytes / MiB / self.median(system, op)

    def floor_times(self) -> list[float]:
        """The checked floor of each repeat: DCP's load plus the BLAKE3 pass after it (local disk only)."""
        return [m.load_s + m.digest_s for m in self.measurements if m.system == "dcp" and m.digest_s is not None]

    @property
    def floor(self) -> float:
        """Median checked floor (nan where none was measured)."""
        times = self.floor_times()
        return statistics.median(times) if times else float("nan")

    def target(self, op: str) -> tuple[float, str]:
        """(limit, what rlckpt's median is compared with) for `op` at this point's destination."""
        if self.destination != "local":
            return S3_TARGET, "DCP"
        return (LOCAL_SAVE_TARGET, "DCP") if op == "save" else (LOCAL_LOAD_TARGET, "checked floor")

    def target_ratio(self, op: str) -> float:
        """rlckpt's median over what the target compares it with."""
        _limit, against = self.target(op)
        return self.median("rlckpt", op) / (self.floor if against == "checked floor" else self.median("dcp", op))


# --- inside each spawned rank ------------------------------------------------------------------------


def _dcp_writer(job: DestinationJob, path: str, thread_count: int) -> Any:
    import torch.distributed.checkpoint as dcp

    if job.storage_options is None:
        return dcp.FileSystemWriter(path, thread_count=thread_count)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # DCP's S3 writer (public, module named _)

    return FsspecWriter(path, sync_files=False, thread_count=thread_count, **_shared_client(job.storage_options))


def _dcp_reader(job: DestinationJob, path: str) -> Any:
    import torch.distributed.checkpoint as dcp

    if job.storage_options is None:
        return dcp.FileSystemReader(path)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(path, **_shared_client(job.storage_options))


def _shared_client(options: dict[str, Any]) -> dict[str, Any]:
    """DCP's writer and reader build their filesystem per checkpoint: let fsspec hand back one cached
    client, as rlckpt keeps its BundleStore, so neither pays for a new S3 client per save."""
    return {k: v for k, v in options.items() if k != "skip_instance_cache"}


def _own_shards(path: str, rank: int) -> list[bytes]:
    """The shard files rank `rank` wrote into DCP's checkpoint dir, read (into the page cache and memory)."""
    out = []
    for name in sorted(os.listdir(path)):
        if name.startswith(f"__{rank}_") and name.endswith(".distcp"):
            with open(os.path.join(path, name), "rb") as src:
                out.append(src.read())
    return out


def _blake3_pass(files: list[bytes]) -> None:
    from rlckpt.store.digest import BLAKE3, Digest

    for data in files:
        Digest.of(data, BLAKE3)


def _timed(fn: Callable[[], Any]) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def _zero(state: Any) -> None:
    """Zero every tensor of the state in place (DTensors: their local shard), so a load must fill it."""
    import torch
    from torch.distributed.tensor import DTensor

    def walk(obj: Any) -> None:
        if isinstance(obj, DTensor):
            obj.to_local().zero_()
        elif isinstance(obj, torch.Tensor):
            obj.zero_()
        elif isinstance(obj, dict):
            for value in obj.values():
                walk(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                walk(value)

    walk(state)


def rank_main(rank: int, world_size: int, port: int, job: RankJob) -> None:
    """Entry point of each spawned rank: see the module docstring."""
    from rlckpt.testing.dcp_ranks import process_group, quiet_dcp_warnings

    quiet_dcp_warnings()
    points: list[dict[str, Any]] = []
    with process_group(rank, world_size, port) as mesh:
        for dest in job.destinations:
            points.extend(_measure_destination(rank, world_size, mesh, dest, job))
    if rank == 0:
        with open(job.out_path, "w") as out:
            json.dump(points, out)


def _measure_destination(
    rank: int, world_size: int, mesh: Any, dest: DestinationJob, job: RankJob
) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from rlckpt.dcp import BundleStorageReader, BundleStorageWriter
    from rlckpt.store import BundleStore
    from rlckpt.testing.dcp_ranks import bitwise_equal, flat_tensors, policy_state, sharded_policy, train_step

    store = BundleStore(dest.run_url, dest.storage_options)
    step = 0

    def save(system: str, state: Any, k: int) -> None:
        if system == "rlckpt":
            dcp.save(state, storage_writer=BundleStorageWriter(store, step=k, thread_count=job.thread_count))
        else:
            dcp.save(state, storage_writer=_dcp_writer(dest, f"{dest.dcp_root}/ckpt_{k}", job.thread_count))

    def load(system: str, state: Any, k: int) -> None:
        if system == "rlckpt":
            dcp.load(state, storage_reader=BundleStorageReader(store, step=k))
        else:
            dcp.load(state, storage_reader=_dcp_reader(dest, f"{dest.dcp_root}/ckpt_{k}"))

    def remove(system: str, k: int) -> None:
        """Rank 0 drops a measured checkpoint (moto and RGW keep objects in RAM)."""
        if rank == 0:
            where = f"{store.root}/step_{k}" if system == "rlckpt" else f"{dest.dcp_root}/ckpt_{k}"
            if dest.storage_options is None:
                shutil.rmtree(where, ignore_errors=True)
            else:
                store.fs.rm(where.removeprefix("s3://"), recursive=True)
        dist.barrier()

    # untimed warm-up of both systems: imports, the store's create-exclusive probe, S3 clients, threads
    model, optim = sharded_policy(mesh, 64, 2, seed=0)
    train_step(model, optim, 64, seed=1)
    warm = policy_state(model, optim)
    for system in SYSTEMS:
        step += 1
        save(system, warm, step)
        load(system, warm, step)
        remove(system, step)

    points: list[dict[str, Any]] = []
    for size in job.sizes_mib:
        width = width_for(size)
        model, optim = sharded_policy(mesh, width, DEPTH, seed=0)
        train_step(model, optim, width, seed=1)
        state = policy_state(model, optim)
        reference = flat_tensors(state) if job.verify else {}
        local_bytes = torch.tensor(
            [sum(t.numel() * t.element_size() for t in flat_tensors(state).values())], dtype=torch.int64
        )
        dist.all_reduce(local_bytes)
        point: dict[str, Any] = {
            "size_mib": size,
            "state_bytes": int(local_bytes.item()),
            "width": width,
            "ranks": world_size,
            "destination": dest.destination,
            "measurements": [],
        }
        for repeat in range(job.repeats):
            order = SYSTEMS if repeat % 2 == 0 else tuple(reversed(SYSTEMS))
            for system in order:
                step += 1
                save_s = _timed(functools.partial(save, system, state, step))
                _zero(state)
                load_s = _timed(functools.partial(load, system, state, step))
                digest_s = None
                if system == "dcp" and dest.storage_options is None:
                    shards = _own_shards(f"{dest.dcp_root}/ckpt_{step}", rank)
                    digest_s = _timed(functools.partial(_blake3_pass, shards))
                    del shards
                ok = True
                if job.verify:
                    flags = torch.tensor(
                        [0 if bitwise_equal(flat_tensors(state), reference) == [] else 1], dtype=torch.int64
                    )
                    dist.all_reduce(flags)
                    ok = flags.item() == 0
                remove(system, step)
                point["measurements"].append(
                    {
                        "system": system,
                        "repeat": repeat,
                        "save_s": save_s,
                        "load_s": load_s,
                        "verified": ok,
                        "digest_s": digest_s,
                    }
                )
                if rank == 0:
                    print(
                        f"  {dest.destination:<8} {world_size} ranks {size:>5g} MiB  {system:<6} save {save_s:6.2f} s  "
                        f"load {load_s:6.2f} s  {'ok' if ok else 'MISMATCH'}",
                        flush=True,
                    )
        points.append(point)
        del model, optim, state, reference
    return points


# --- the driver ----------------------------------------------------------------------------------------


def run_sweep(
    config: PolicyBenchConfig,
    destinations: list[Any],
    workdir: str,
    on_points: Callable[[list[PointResult]], None] | None = None,
    timeout: float = 3600.0,
) -> list[PointResult]:
    """One spawn per rank count; every destination, size and repeat inside it."""
    from rlckpt.testing.dcp_ranks import run_ranks

    results: list[PointResult] = []
    for ranks in config.ranks:
        job = RankJob(
            destinations=[
                DestinationJob(d.name, d.run_url(f"policy-{ranks}r"), d.run_url(f"dcp-{ranks}r"), d.storage_options)
                for d in destinations
            ],
            sizes_mib=list(config.sizes_mib),
            repeats=config.repeats,
            verify=config.verify,
            thread_count=config.thread_count,
            out_path=os.path.join(workdir, f"policy-{ranks}r.json"),
        )
        run_ranks(rank_main, ranks, job, timeout=timeout)
        with open(job.out_path) as src:
            points = points_from_document({"points": json.load(src)})
        if on_points is not None:
            on_points(points)
        results.extend(points)
    return sorted(results, key=lambda p: ([d.name for d in destinations].index(p.destination), p.ranks, p.size_mib))


@dataclass(frozen=True)
class TargetCheck:
    target: str
    where: str
    ratio: float
    limit: float
    met: bool
    detail: str


def evaluate_targets(points: list[PointResult]) -> list[TargetCheck]:
    """rlckpt's median save and load time at every point against its target: S3 save and load <= 1.10x
    DCP; local save <= 1.25x DCP's; local load <= 1.15x the checked floor (DCP's load + one BLAKE3 pass)."""
    checks = []
    for p in points:
        for op in ("save", "load"):
            limit, against = p.target(op)
            ratio = p.target_ratio(op)
            base = p.floor if against == "checked floor" else p.median("dcp", op)
            checks.append(
                TargetCheck(
                    target=f"{op} <= {limit:.2f}x {against}",
                    where=f"{p.destination}, {p.ranks} ranks, {p.size_mib:g} MiB",
                    ratio=ratio,
                    limit=limit,
                    met=ratio <= limit,
                    detail=f"rlckpt {p.median('rlckpt', op):.3f} s vs {against} {base:.3f} s",
                )
            )
    return checks


def result_document(
    points: list[PointResult], config: PolicyBenchConfig, meta: dict[str, Any], digests: list[Any] | None = None
) -> dict[str, Any]:
    return {
        "benchmark": "policy",
        "config": asdict(config),
        "meta": meta,
        "digests": [d.to_json() for d in digests or []],
        "points": [
            {
                **asdict(p),
                **{f"{s}_{op}_median_s": p.median(s, op) for s in SYSTEMS for op in ("save", "load")},
                "save_ratio": p.ratio("save"),
                "load_ratio": p.ratio("load"),
                "checked_floor_median_s": p.floor if p.floor_times() else None,
                "load_floor_ratio": p.median("rlckpt", "load") / p.floor if p.floor_times() else None,
                **{f"{s}_{op}_mib_s": p.mib_per_s(s, op) for s in SYSTEMS for op in ("save", "load")},
            }
            for p in points
        ],
        "targets": [asdict(c) for c in evaluate_targets(points)],
    }


def points_from_document(document: dict[str, Any]) -> list[PointResult]:
    return [
        PointResult(
            p["size_mib"],
            p["state_bytes"],
            p["width"],
            p["ranks"],
            p["destination"],
            [Measurement(**m) for m in p["measurements"]],
        )
        for p in document["points"]
    ]
