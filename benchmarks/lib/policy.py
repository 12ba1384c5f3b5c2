"""`python -m benchmarks.policy`: save and load a sharded policy (FSDP2 MLP + AdamW state) through rlckpt.dcp and
through the systems a user would compare it with, on the same state, in the same processes, one after the other.

For each rank count, N ranks are spawned once (gloo on 127.0.0.1, FSDP2 on a CPU mesh); for each destination and
size they build the state, then per repeat save and load it through every system (the order rotates between
repeats), after one untimed save and load of each at that size (the first write of that many bytes is slow on
some VMs, likely while the host backs again memory the guest gave back: a 1 GiB file took 3.5 s to write there
the first time and 0.22 s each time after). A save or load is timed on rank 0 from a barrier before it to a
barrier after it, so its time is the slowest rank's; its extra memory is each rank's peak resident set during it
over the one before it (the kernel's high-water mark, reset just before, after the heap's free memory went back
to the kernel), the largest of the ranks. rlckpt's buffer pools, kept between operations, count as extra memory
of every one of its operations; what another system's native client keeps between operations (the CRT's buffer
pool) is not seen, so its figure is a lower bound. Before each load the state is zeroed, after it the loaded
state is compared bitwise with what was saved.

Systems:
- rlckpt: standalone `BundleStorageWriter(store, step=k)` (one BundleStore per rank, kept across saves as a
  trainer would), `BundleStorageReader(store, step=k)`: files fsynced (local disk) and digested, one commit.
- dcp (local disk): DCP's `FileSystemWriter(dir)` (sync_files=True: each file fsynced) and `FileSystemReader`.
- fsspec (S3): DCP's `FsspecWriter(url, sync_files=False)` and `FsspecReader` over s3fs (with sync_files=True
  it would call a machine-wide `os.sync()` per file).
- s3torchconnector (S3, optional extra `peers`): the AWS connector's `S3StorageWriter/Reader` (its CRT client,
  8 MiB parts, path-style addressing, one client per rank). Skipped with a note when it is not installed, and
  on a Ceph 16 RGW reached directly (its CompleteMultipartUpload sends no ETag, which the connector requires:
  measure it through the ETag proxy, bench/etag_proxy.py).
- rlckpt-zstd (with `--compress`): rlckpt with `BundleStorageWriter(..., compression="on")`: each shard file in
  byte planes + zstd where its first MiB shrinks, raw otherwise; read by the same BundleStorageReader.
- the checked floor (local disk): after each DCP load, every rank hashes the shard files it wrote
  (`__<rank>_*.distcp`, read into memory first, untimed) with BLAKE3 as rlckpt's reader does; DCP's load
  plus that pass is what a load that refuses unverified bytes cannot beat.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import json
import logging
import math
import os
import shlex
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from rlckpt.bench.rows import MiB

logger = logging.getLogger(__name__)

DEPTH = 8  # Linear layers; the width follows from the size asked for
RLCKPT, DCP, FSSPEC, S3TC = "rlckpt", "dcp", "fsspec", "s3torchconnector"
RLCKPT_Z = "rlckpt-zstd"  # rlckpt with compression="on" (--compress)
LOCAL_SYSTEMS = (RLCKPT, DCP)
S3_SYSTEMS = (RLCKPT, S3TC, FSSPEC)
LABELS = {
    RLCKPT: "rlckpt.dcp",
    RLCKPT_Z: "rlckpt.dcp, byte planes + zstd",
    DCP: "DCP FileSystemWriter/Reader",
    FSSPEC: "DCP FsspecWriter/Reader (s3fs)",
    S3TC: "s3torchconnector.dcp",
}
S3TC_REGION = "us-east-1"
RECLAIM_TIMEOUT_S = 120.0  # a reclaim command taking longer is given up on (and logged)
MEMORY_FLAT_MIB = 64.0  # local load: rlckpt's extra memory may grow by at most this much from the smallest size up
# How the state's values are drawn (`--draws`), each `<how>-<dtype>`: init (the MLP's own init, one AdamW step:
# the policy benchmark's state), trained (weights redrawn normal with std 0.02, as trained weights are, then
# three AdamW steps: real moments) or random (every bit of every tensor uniform: nothing to compress); dtype
# fp32 or bf16 (the model cast before sharding; AdamW's moments follow it).
DRAWS = tuple(f"{how}-{dtype}" for how in ("init", "trained", "random") for dtype in ("fp32", "bf16"))
DEFAULT_DRAW = "init-fp32"


@dataclass(frozen=True)
class Target:
    """rlckpt's median over another system's (or the checked floor), at most `limit`, on one kind of destination.
    `memory`: compares extra memory per rank instead of time."""

    kind: str  # "local" or "s3"
    op: str  # "save" or "load"
    against: str  # a system, or "floor"
    limit: float
    memory: bool = False

    @property
    def name(self) -> str:
        other = "checked floor" if self.against == "floor" else self.against
        what = f"extra memory on {self.op}" if self.memory else self.op
        return f"{what} <= {self.limit:.2f}x {other}"


TARGETS = (
    Target("s3", "save", S3TC, 0.90),
    Target("s3", "save", FSSPEC, 0.80),
    Target("s3", "load", S3TC, 0.90),
    Target("s3", "load", FSSPEC, 0.50),
    Target("s3", "save", FSSPEC, 1.00, memory=True),
    Target("s3", "load", FSSPEC, 1.00, memory=True),
    Target("local", "save", DCP, 1.25),
    Target("local", "load", "floor", 1.15),
)


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
    thread_count: int = 1  # writer threads per rank, the same for every system (DCP's default is 1)
    warm_up: bool = True  # an untimed save + load of every system at each size before its repeats
    rgw_reclaim: str | None = None  # run after each removal from RGW (DestinationJob.reclaim_command)
    draws: list[str] = field(default_factory=lambda: [DEFAULT_DRAW])  # DRAWS
    compress: bool = False  # measure RLCKPT_Z beside the others


@dataclass(frozen=True)
class DestinationJob:
    """Where one destination's saves go: the rlckpt run, the other systems' checkpoint root (a dir or s3:// URL),
    and for S3 the endpoint and credentials the connector's own client needs. `skip` names systems not run
    here, with the reason. `s3tc_save_options`: the connector saves through these (the ETag proxy before the
    same server) and loads from `storage_options`, so its load is measured where rlckpt's is. `reclaim_command`:
    run (untimed) after each removal of a measured checkpoint, so the server frees it before the next one."""

    destination: str
    run_url: str
    other_root: str
    storage_options: dict[str, Any] | None
    skip: dict[str, str] = field(default_factory=dict)
    s3tc_save_options: dict[str, Any] | None = None
    reclaim_command: str | None = None
    compress: bool = False  # RLCKPT_Z measured too

    @property
    def kind(self) -> str:
        return "local" if self.storage_options is None else "s3"

    @property
    def systems(self) -> tuple[str, ...]:
        base = LOCAL_SYSTEMS if self.kind == "local" else S3_SYSTEMS
        return tuple(s for s in (*base[:1], *([RLCKPT_Z] if self.compress else []), *base[1:]) if s not in self.skip)


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
    warm_up: bool = False  # see PolicyBenchConfig.warm_up
    draws: list[str] = field(default_factory=lambda: [DEFAULT_DRAW])


@dataclass
class Measurement:
    """One save + load of one system at one point: times (s), and extra memory (MiB, the largest rank's)."""

    system: str
    repeat: int
    save_s: float
    load_s: float
    verified: bool
    digest_s: float | None = None  # DCP's measurements on local disk: the BLAKE3 pass over its files
    save_extra_mib: float | None = None
    load_extra_mib: float | None = None
    stored_bytes: int | None = None  # what the checkpoint occupies at its destination (all ranks' files)
    save_cpu_s: float | None = None  # CPU time of the save, every rank's process summed


@dataclass
class PointResult:
    """Every measurement at one (size, ranks, destination), and the systems skipped there (with why)."""

    size_mib: float
    state_bytes: int
    width: int
    ranks: int
    destination: str
    measurements: list[Measurement] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    kind: str = "s3"
    proxied_saves: list[str] = field(default_factory=list)  # systems that saved through a proxy, not compared
    run: str = ""  # the run it came from, in a result merged from several (benchmarks.lib.policy_merge)
    draw: str = DEFAULT_DRAW  # how the state's values were drawn (DRAWS)

    def compared(self, system: str, op: str) -> bool:
        """Whether `system`'s `op` ran where rlckpt's did (a save through the ETag proxy did not)."""
        return self.measured(system) and not (op == "save" and system in self.proxied_saves)

    @property
    def systems(self) -> list[str]:
        """The systems measured here, in the benchmark's order."""
        seen = {m.system for m in self.measurements}
        return [s for s in (RLCKPT, RLCKPT_Z, DCP, S3TC, FSSPEC) if s in seen]

    def times(self, system: str, op: str) -> list[float]:
        return [getattr(m, f"{op}_s") for m in self.measurements if m.system == system]

    def median(self, system: str, op: str) -> float:
        values = self.times(system, op)
        return statistics.median(values) if values else float("nan")

    def median_of(self, system: str, name: str) -> float:
        """Median of a measurement's field (`stored_bytes`, `save_cpu_s`) over `system`'s repeats (nan: none)."""
        values = [v for m in self.measurements if m.system == system and (v := getattr(m, name)) is not None]
        return statistics.median(values) if values else float("nan")

    def memory(self, system: str, op: str) -> float:
        """Median extra memory per rank (MiB) of `system` on `op` (nan where not measured)."""
        values = [
            v for m in self.measurements if m.system == system and (v := getattr(m, f"{op}_extra_mib")) is not None
        ]
        return statistics.median(values) if values else float("nan")

    def mib_per_s(self, system: str, op: str) -> float:
        """Aggregate throughput over all ranks: the whole state over the median time."""
        return self.state_bytes / MiB / self.median(system, op)

    def floor_times(self) -> list[float]:
        """The checked floor of each repeat: DCP's load plus the BLAKE3 pass after it (local disk only)."""
        return [m.load_s + m.digest_s for m in self.measurements if m.system == DCP and m.digest_s is not None]

    @property
    def floor(self) -> float:
        """Median checked floor (nan where none was measured)."""
        times = self.floor_times()
        return statistics.median(times) if times else float("nan")

    def ratio(self, op: str, against: str, memory: bool = False) -> float:
        """rlckpt's median over `against`'s (a system or "floor"); below 1: rlckpt faster or smaller."""
        if memory:
            return self.memory(RLCKPT, op) / self.memory(against, op)
        base = self.floor if against == "floor" else self.median(against, op)
        return self.median(RLCKPT, op) / base

    def measured(self, system: str) -> bool:
        return any(m.system == system for m in self.measurements) or system == "floor" and bool(self.floor_times())


# --- inside each spawned rank ------------------------------------------------------------------------


def _proc_status_kib(field_name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    """Give the heap's free memory back to the kernel (glibc keeps what earlier operations freed, and the next
    one would reuse it without its RSS growing: its extra memory would depend on what ran before), then reset
    the kernel's high-water mark of this process's resident set (VmHWM) to its current size."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def _pooled_bytes() -> int:
    """Memory rlckpt's buffer pools keep between operations (reused read buffers, idle upload parts)."""
    from rlckpt.store import READ_BUFFERS
    from rlckpt.store.backends.s3_io import PART_BUFFERS

    return READ_BUFFERS.idle_bytes + PART_BUFFERS.idle_bytes


def _measured(fn: Callable[[], Any], counts_pools: bool) -> tuple[float, float, str | None]:
    """(seconds, extra MiB, failure) of `fn` on every rank: the time from a barrier before to the ranks'
    agreement after (`_try_together`), the largest rank's peak RSS during it over its RSS before (plus rlckpt's
    pooled buffers when `counts_pools`), and None, or the first line of a failure on any rank."""
    import torch
    import torch.distributed as dist

    gc.collect()
    _reset_peak_rss()
    base = _proc_status_kib("VmRSS") * 1024 - (_pooled_bytes() if counts_pools else 0)
    dist.barrier()
    start = time.perf_counter()
    error = _try_together(fn)
    seconds = time.perf_counter() - start
    extra = torch.tensor([max(0, _proc_status_kib("VmHWM") * 1024 - base)], dtype=torch.int64)
    dist.all_reduce(extra, op=dist.ReduceOp.MAX)
    return seconds, int(extra.item()) / MiB, error


def _shared_client(options: dict[str, Any]) -> dict[str, Any]:
    """DCP's writer and reader build their filesystem per checkpoint: let fsspec hand back one cached
    client, as rlckpt keeps its BundleStore, so neither pays for a new S3 client per save."""
    return {k: v for k, v in options.items() if k != "skip_instance_cache"}


class _Systems:
    """One rank's writers and readers of every system at one destination (clients made once, reused)."""

    def __init__(self, dest: DestinationJob, thread_count: int) -> None:
        from rlckpt.store import BundleStore

        self.dest = dest
        self.thread_count = thread_count
        self.store = BundleStore(dest.run_url, dest.storage_options)
        self._s3tc_clients: dict[bool, Any] = {}  # one for saves, one for loads (the same one without a proxy)

    def where(self, system: str, k: int) -> str:
        return f"{self.store.root}/step_{k}" if system in (RLCKPT, RLCKPT_Z) else f"{self.dest.other_root}/{system}_{k}"

    def writer(self, system: str, k: int) -> Any:
        import torch.distributed.checkpoint as dcp

        from rlckpt.dcp import BundleStorageWriter

        path = self.where(system, k)
        if system in (RLCKPT, RLCKPT_Z):
            compression = "on" if system == RLCKPT_Z else None
            return BundleStorageWriter(self.store, step=k, thread_count=self.thread_count, compression=compression)
        if system == DCP:
            return dcp.FileSystemWriter(path, thread_count=self.thread_count)
        if system == FSSPEC:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # DCP's S3 writer (public)

            options = _shared_client(self.dest.storage_options or {})
            return FsspecWriter(path, sync_files=False, thread_count=self.thread_count, **options)
        from s3torchconnector.dcp import S3StorageWriter
        from s3torchconnector.dcp.s3_file_system import S3FileSystem

        writer = S3StorageWriter(S3TC_REGION, path, thread_count=self.thread_count)
        # its endpoint; typed through Any: the peers extra may be absent where mypy runs
        cast(Any, writer).fs = S3FileSystem(S3TC_REGION, s3_client=self._s3tc(saving=True))
        writer.path = writer.fs.init_path(path)
        return writer

    def reader(self, system: str, k: int) -> Any:
        import torch.distributed.checkpoint as dcp

        from rlckpt.dcp import BundleStorageReader

        path = self.where(system, k)
        if system in (RLCKPT, RLCKPT_Z):
            return BundleStorageReader(self.store, step=k)
        if system == DCP:
            return dcp.FileSystemReader(path)
        if system == FSSPEC:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

            return FsspecReader(path, **_shared_client(self.dest.storage_options or {}))
        from s3torchconnector.dcp import S3StorageReader
        from s3torchconnector.dcp.s3_file_system import S3FileSystem

        reader = S3StorageReader(S3TC_REGION, path)
        reader.fs = S3FileSystem(
            S3TC_REGION, s3_client=self._s3tc(saving=False), reader_constructor=reader._reader_constructor
        )
        reader.path = reader.fs.init_path(path)
        return reader

    def _s3tc(self, saving: bool) -> Any:
        """The connector's client for saves (through `s3tc_save_options` when given) or for loads."""
        via_proxy = saving and self.dest.s3tc_save_options is not None
        if via_proxy not in self._s3tc_clients:
            from s3torchconnector import S3ClientConfig
            from s3torchconnector._s3client import S3Client

            options = (self.dest.s3tc_save_options if via_proxy else self.dest.storage_options) or {}
            os.environ["AWS_ACCESS_KEY_ID"] = options.get("key", "testing")  # its client reads credentials here
            os.environ["AWS_SECRET_ACCESS_KEY"] = options.get("secret", "testing")
            self._s3tc_clients[via_proxy] = S3Client(
                S3TC_REGION,
                endpoint=options.get("endpoint_url"),
                s3client_config=S3ClientConfig(force_path_style=True),
            )
        return self._s3tc_clients[via_proxy]

    def save(self, system: str, k: int, state: Any) -> None:
        """`dcp.save` of `state` as checkpoint `k` through `system` (its writer made here: part of the time)."""
        import torch.distributed.checkpoint as dcp

        dcp.save(state, storage_writer=self.writer(system, k))

    def load(self, system: str, k: int, state: Any) -> None:
        """`dcp.load` of checkpoint `k` into `state` through `system` (its reader made here: rlckpt's opens and
        checks the bundle and its `.metadata`, which is part of the time)."""
        import torch.distributed.checkpoint as dcp

        dcp.load(state, storage_reader=self.reader(system, k))

    def stored_bytes(self, system: str, k: int) -> int:
        """What checkpoint `k` of `system` occupies: its manifest's files for rlckpt, its files for the others."""
        if system in (RLCKPT, RLCKPT_Z):
            return self.store.open(k).manifest.total_size
        where = self.where(system, k)
        if self.dest.storage_options is None:
            return sum(f.stat().st_size for f in Path(where).rglob("*") if f.is_file())
        return int(self.store.fs.du(where.removeprefix("s3://")))

    def remove(self, system: str, k: int, rank: int) -> None:
        """Rank 0 drops a measured checkpoint (moto and RGW keep objects in RAM); then every rank meets at a
        barrier, whatever the removal did. A rank that skipped it would run one collective ahead of the others
        from there on: the next gather would hang, or the wrong collectives pair up."""
        import torch.distributed as dist

        if rank == 0:
            self._drop(self.where(system, k))
            if self.dest.reclaim_command:
                _reclaim(self.dest.reclaim_command)
        dist.barrier()

    def _drop(self, where: str) -> None:
        """Remove checkpoint `where`; nothing there (a save that failed before writing) is not an error, and a
        removal that fails is logged: it costs the server's memory, not the measurement."""
        try:
            if self.dest.storage_options is None:
                shutil.rmtree(where, ignore_errors=True)
            else:
                self.store.fs.rm(where.removeprefix("s3://"), recursive=True)
        except FileNotFoundError:
            pass
        except Exception as exc:
            logger.warning("could not remove the measured checkpoint %s: %s", where, exc)


def _reclaim(command: str) -> None:
    """Run the server's reclaim command (e.g. `bash scripts/rgw.sh gc`): Ceph RGW frees deleted objects in its
    garbage collector, every 10 s as scripts/rgw.sh sets it, which otherwise ran in the middle of the next
    measurement (a 1 GiB save swung 3.5-7.9 s; 3.4-3.9 s with the collector run to completion before each). A
    failure is logged: it costs the measurement's steadiness, not its result."""
    try:
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=RECLAIM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("reclaim command %r failed: %s", command, exc)
        return
    if done.returncode != 0:
        logger.warning("reclaim command %r exited %d: %s", command, done.returncode, done.stderr.strip()[-300:])


def _own_shards(path: str, rank: int) -> list[bytes]:
    """The shard files rank `rank` wrote into DCP's checkpoint dir, read (into the page cache and memory)."""
    out = []
    for name in sorted(os.listdir(path)):
        if name.startswith(f"__{rank}_") and name.endswith(".distcp"):
            with open(os.path.join(path, name), "rb") as src:
                out.append(src.read())
    return out


def _blake3_pass(files: list[bytes]) -> None:
    from rlckpt.store.io.digest import BLAKE3, Digest

    for data in files:
        Digest.of(data, BLAKE3)


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
    from support.dcp_ranks import process_group, quiet_dcp_warnings

    quiet_dcp_warnings()
    points: list[dict[str, Any]] = []

    def measured(point: dict[str, Any]) -> None:  # rank 0 keeps every point as it ends: a spawn lost later keeps it
        points.append(point)
        if rank == 0:
            _write_points(job.out_path, points)

    with process_group(rank, world_size, port) as mesh:
        for dest in job.destinations:
            _measure_destination(rank, world_size, mesh, dest, job, on_point=measured)
    if rank == 0:  # also when no point was measured: the sweep reads the file of every spawn that ends
        _write_points(job.out_path, points)


def _write_points(path: str, points: list[dict[str, Any]]) -> None:
    """The points measured so far, replacing the file whole (a rank killed mid-write leaves the last one)."""
    with open(f"{path}.tmp", "w") as out:
        json.dump(points, out)
    os.replace(f"{path}.tmp", path)


def _read_points(path: str) -> list[PointResult]:
    """The points a spawn's rank 0 wrote (`_write_points`)."""
    with open(path) as src:
        return points_from_document({"points": json.load(src)})


def _points_written(path: str) -> list[PointResult]:
    """What a spawn that failed had measured before it did (its rank 0 writes each point as it ends): none when
    it wrote nothing readable."""
    try:
        return _read_points(path)
    except (OSError, ValueError):
        return []


def _try_together(fn: Callable[[], Any]) -> str | None:
    """Run `fn` on every rank; None if it succeeded on all, else the first line of a failure (every rank
    agrees, so all go on or skip together)."""
    import torch
    import torch.distributed as dist

    error: str | None = None
    try:
        fn()
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        error = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
    failed = torch.tensor([1 if error else 0], dtype=torch.int64)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item() and error is None:
        error = "failed on another rank"
    return error


def _untimed(systems: _Systems, system: str, step: int, state: Any, rank: int) -> str | None:
    """Save `state` as `step` through `system` and load it back, untimed, on every rank, then remove it; None,
    or the first line of the failure (every rank agrees)."""
    error = _try_together(functools.partial(systems.save, system, step, state))
    error = error or _try_together(functools.partial(systems.load, system, step, state))
    systems.remove(system, step, rank)
    return error


def _measure_destination(
    rank: int,
    world_size: int,
    mesh: Any,
    dest: DestinationJob,
    job: RankJob,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    from support.dcp_ranks import bitwise_equal, flat_tensors, policy_state, sharded_policy, train_step

    systems = _Systems(dest, job.thread_count)
    skipped = dict(dest.skip)
    step = 0

    # untimed warm-up of every system: imports, the store's create-exclusive probe, S3 clients, threads; a
    # system that cannot save or load here (e.g. the connector against a server it refuses) is skipped
    model, optim = sharded_policy(mesh, 64, 2, seed=0)
    train_step(model, optim, 64, seed=1)
    warm = policy_state(model, optim)
    for system in dest.systems:
        step += 1
        error = _untimed(systems, system, step, warm, rank)
        if error:
            skipped[system] = f"failed: {error}"
    order = [s for s in dest.systems if s not in skipped]

    points: list[dict[str, Any]] = []
    for draw, size in ((d, z) for d in job.draws for z in job.sizes_mib):
        width = width_for(size)
        model, optim, state = _trained_policy(mesh, width, draw)
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
            "draw": draw,
            "destination": dest.destination,
            "kind": dest.kind,
            "skipped": skipped,
            "proxied_saves": [S3TC] if dest.s3tc_save_options is not None and S3TC in order else [],
            "measurements": [],
        }
        failed: dict[str, str] = {}  # peers that failed at this size: not measured here, tried again at the next
        if job.warm_up:
            for system in order:
                step += 1
                error = _untimed(systems, system, step, state, rank)
                if error is not None:
                    _peer_failed(system, error, f"{world_size} ranks, {size:g} MiB, warm-up", failed)
                    del model, optim, state  # half loaded, perhaps: the same bits again
                    model, optim, state = _trained_policy(mesh, width, draw)
        for repeat in range(job.repeats):
            shift = repeat % len(order)
            for system in order[shift:] + order[:shift]:
                if system in failed:
                    continue
                step += 1
                pools = system in (RLCKPT, RLCKPT_Z)
                cpu = time.process_time()
                save_s, save_mib, error = _measured(functools.partial(systems.save, system, step, state), pools)
                save_cpu = torch.tensor([time.process_time() - cpu], dtype=torch.float64)
                dist.all_reduce(save_cpu)
                stored = systems.stored_bytes(system, step) if error is None and rank == 0 else None
                _zero(state)
                load_s, load_mib = 0.0, 0.0
                if error is None:
                    load_s, load_mib, error = _measured(functools.partial(systems.load, system, step, state), pools)
                if error is not None:
                    _peer_failed(system, error, f"{world_size} ranks, {size:g} MiB, repeat {repeat + 1}", failed)
                    systems.remove(system, step, rank)
                    del model, optim, state  # zeroed for the load, or half loaded: the same bits again
                    model, optim, state = _trained_policy(mesh, width, draw)
                    continue
                digest_s = None
                if system == DCP:
                    shards = _own_shards(systems.where(system, step), rank)
                    digest_s, _, _ = _measured(functools.partial(_blake3_pass, shards), False)
                    del shards
                ok = True
                if job.verify:
                    flags = torch.tensor(
                        [0 if bitwise_equal(flat_tensors(state), reference) == [] else 1], dtype=torch.int64
                    )
                    dist.all_reduce(flags)
                    ok = flags.item() == 0
                systems.remove(system, step, rank)
                point["measurements"].append(
                    {
                        "system": system,
                        "repeat": repeat,
                        "save_s": save_s,
                        "load_s": load_s,
                        "verified": ok,
                        "digest_s": digest_s,
                        "save_extra_mib": save_mib,
                        "load_extra_mib": load_mib,
                        "stored_bytes": stored,
                        "save_cpu_s": float(save_cpu.item()),
                    }
                )
                if rank == 0:
                    print(
                        f"  {dest.destination:<18} {world_size} ranks {size:>6g} MiB {draw:<13} {system:<16} "
                        f"save {save_s:6.2f} s (+{save_mib:5.0f} MiB)  load {load_s:6.2f} s (+{load_mib:5.0f} MiB)  "
                        f"{'ok' if ok else 'MISMATCH'}",
                        flush=True,
                    )
        point["skipped"] = {**skipped, **failed}
        point["measurements"] = [m for m in point["measurements"] if m["system"] not in failed]
        points.append(point)
        if on_point is not None:
            on_point(point)
        del model, optim, state, reference
    return points


def _trained_policy(mesh: Any, width: int, draw: str = DEFAULT_DRAW) -> tuple[Any, Any, Any]:
    """The measured policy at `width`, drawn as `draw` says (DRAWS), and its state dict: the same bits on every
    call (fixed seeds, and gloo sums in a fixed order), so a state a failed system left behind can be made again."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from support.dcp_ranks import mlp, policy_state

    how, dtype_name = draw.split("-")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    model = mlp(width, DEPTH, 0)
    generator = torch.Generator().manual_seed(0)
    if how in ("trained", "random"):
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(0.0, 0.02, generator=generator)
    model = model.to(dtype)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3 if how == "trained" else 1e-2)
    for step in range(3 if how == "trained" else 1):
        batch = torch.randn(8, width, generator=torch.Generator().manual_seed(1 + step)).to(dtype)
        optim.zero_grad()
        model(batch).float().pow(2).mean().backward()
        optim.step()
    state = policy_state(model, optim)
    if how == "random":  # every floating tensor's bits drawn anew (the step counters kept)
        noise = torch.Generator().manual_seed(1000 + mesh.get_rank())
        tensors = [*model.parameters(), *(t for st in optim.state.values() for k, t in st.items() if k != "step")]
        for tensor in tensors:
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            flat = local.detach().view(-1).view(torch.uint8)
            flat.copy_(torch.randint(0, 256, flat.shape, generator=noise, dtype=torch.uint8))
    return model, optim, state


def _peer_failed(system: str, error: str, where: str, failed: dict[str, str]) -> None:
    """A peer that fails once at a point (a server that timed it out) is not measured at that point, and the
    sweep goes on; rlckpt failing is the benchmark's own failure."""
    if system == RLCKPT:
        raise RuntimeError(f"rlckpt failed at {where}: {error}")
    failed[system] = f"failed at {where}: {error}"


# --- the driver ----------------------------------------------------------------------------------------


def s3torchconnector_missing() -> str | None:
    """Why the connector cannot be measured here (not installed), or None."""
    try:
        import s3torchconnector.dcp  # noqa: F401
    except ImportError as exc:
        return f"not installed (pip install 'rlckpt[peers]'): {exc}"
    return None


def run_sweep(
    config: PolicyBenchConfig,
    destinations: list[Any],
    workdir: str,
    on_points: Callable[[list[PointResult]], None] | None = None,
    timeout: float = 3600.0,
    skip: dict[str, dict[str, str]] | None = None,
    on_failure: Callable[[int, Exception], None] | None = None,
    reclaim: dict[str, str] | None = None,
) -> list[PointResult]:
    """One spawn per rank count; every destination, size and repeat inside it. `skip`: per destination name,
    systems not to run there and why (the connector is skipped everywhere when it is not installed). `reclaim`:
    per destination name, a command run after each removal (DestinationJob.reclaim_command).
    `on_points` gets each spawn's points as it ends (a long sweep keeps what it measured); a spawn that fails
    raises, or with `on_failure` is reported to it (after `on_points` got the points it finished before it
    failed) and the sweep goes on with the next rank count."""
    from support.dcp_ranks import run_ranks

    missing = s3torchconnector_missing()
    results: list[PointResult] = []
    for ranks in config.ranks:
        jobs = []
        for d in destinations:
            reasons = dict((skip or {}).get(d.name, {}))
            if missing and d.storage_options is not None:
                reasons.setdefault(S3TC, missing)
            jobs.append(
                DestinationJob(
                    d.name,
                    d.run_url(f"policy-{ranks}r"),
                    d.run_url(f"peers-{ranks}r"),
                    d.storage_options,
                    reasons,
                    d.s3tc_save_options,
                    (reclaim or {}).get(d.name),
                    config.compress,
                )
            )
        job = RankJob(
            destinations=jobs,
            sizes_mib=list(config.sizes_mib),
            repeats=config.repeats,
            verify=config.verify,
            thread_count=config.thread_count,
            out_path=os.path.join(workdir, f"policy-{ranks}r.json"),
            warm_up=config.warm_up,
            draws=list(config.draws),
        )
        try:
            run_ranks(rank_main, ranks, job, timeout=timeout)
        except Exception as exc:
            if on_failure is None:
                raise
            partial = _points_written(job.out_path)  # the points it finished before it failed
            if partial and on_points is not None:
                on_points(partial)
            results.extend(partial)
            on_failure(ranks, exc)
            continue
        points = _read_points(job.out_path)
        if on_points is not None:
            on_points(points)
        results.extend(points)
    names = [d.name for d in destinations]
    return sorted(results, key=lambda p: (names.index(p.destination), p.draw, p.ranks, p.size_mib))


@dataclass(frozen=True)
class TargetCheck:
    target: str
    where: str
    ratio: float
    limit: float
    met: bool
    detail: str


def evaluate_targets(points: list[PointResult]) -> list[TargetCheck]:
    """rlckpt against every target at every point where the system it is compared with was measured (TARGETS),
    and, on local disk, load memory flat in size: at each rank count, rlckpt's extra memory on load at every
    size at most MEMORY_FLAT_MIB above the smallest size's."""
    checks = []
    for p in points:
        where = f"{p.destination}, {p.ranks} ranks, {p.size_mib:g} MiB"
        for t in TARGETS:
            if t.kind != p.kind or not p.compared(t.against, t.op):
                continue
            ratio = p.ratio(t.op, t.against, t.memory)
            if math.isnan(ratio):
                continue
            if t.memory:
                detail = f"rlckpt +{p.memory(RLCKPT, t.op):.0f} MiB vs {t.against} +{p.memory(t.against, t.op):.0f} MiB"
            else:
                base = p.floor if t.against == "floor" else p.median(t.against, t.op)
                detail = f"rlckpt {p.median(RLCKPT, t.op):.3f} s vs {t.against} {base:.3f} s"
            checks.append(TargetCheck(t.name, where, ratio, t.limit, ratio <= t.limit, detail))
    groups: dict[tuple[str, int], list[PointResult]] = {}
    for p in points:
        if p.kind == "local" and not math.isnan(p.memory(RLCKPT, "load")):
            groups.setdefault((p.destination, p.ranks), []).append(p)
    for (dest, ranks), series in groups.items():
        smallest = min(series, key=lambda p: p.size_mib)
        for p in series:
            grown = p.memory(RLCKPT, "load") - smallest.memory(RLCKPT, "load")
            checks.append(
                TargetCheck(
                    target=f"load memory flat in size (+<= {MEMORY_FLAT_MIB:.0f} MiB)",
                    where=f"{dest}, {ranks} ranks, {p.size_mib:g} MiB",
                    ratio=grown / MEMORY_FLAT_MIB,
                    limit=1.0,
                    met=grown <= MEMORY_FLAT_MIB,
                    detail=f"rlckpt +{p.memory(RLCKPT, 'load'):.0f} MiB vs +{smallest.memory(RLCKPT, 'load'):.0f} MiB "
                    f"at {smallest.size_mib:g} MiB",
                )
            )
    return checks


def result_document(
    points: list[PointResult], config: PolicyBenchConfig, meta: dict[str, Any], digests: list[Any] | None = None
) -> dict[str, Any]:
    def summary(p: PointResult) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for s in p.systems:
            for op in ("save", "load"):
                out[f"{s}_{op}_median_s"] = p.median(s, op)
                out[f"{s}_{op}_mib_s"] = p.mib_per_s(s, op)
                out[f"{s}_{op}_extra_mib"] = p.memory(s, op)
        out["checked_floor_median_s"] = p.floor if p.floor_times() else None
        return out

    return {
        "benchmark": "policy",
        "config": asdict(config),
        "meta": meta,
        "systems": LABELS,
        "digests": [d.to_json() for d in digests or []],
        "points": [{**asdict(p), **summary(p)} for p in points],
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
            dict(p.get("skipped", {})),
            p.get("kind", "local" if p["destination"] == "local" else "s3"),
            list(p.get("proxied_saves", [])),
            p.get("run", ""),
            p.get("draw", DEFAULT_DRAW),
        )
        for p in document["points"]
    ]
