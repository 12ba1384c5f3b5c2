"""Benchmark TransferQueue through rlckpt's TransferQueueClient: put/get throughput and snapshot
save/load speed and bytes on disk vs payload, for each storage-side row parser: "numpy"
(default), "torch" (cloned tensor rows) and "none" (no per-row fix: TQ's own behaviour).

Rows look like the main job's: prompt int64[256], completion int64[1024], logprobs float32[1024],
reward float32 scalar (~14 KiB a row), put 64 rows at a time. Starts its own private local Ray
cluster (address="local", loopback) and shuts it down. Prints a table and writes JSON. A load through
the adapter includes the vetted copy TQ is given (docs/security.md); "vet" times that copy alone.

    .venv/bin/python benchmarks/dataplane_snapshot.py [--sizes 16 64 256] [--no-fix-max 64]
        [--parsers numpy torch none]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from support.tq import connect_client, reset_tq_state, start_tq_session, stop_tq_session

MIB = 1024 * 1024
PARTITION = "bench"
PROMPT, COMPLETION = 256, 1024
ROW_BYTES = PROMPT * 8 + COMPLETION * 8 + COMPLETION * 4 + 4
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "dataplane_snapshot.json"


@dataclass
class Result:
    """One (payload size, parser on/off) measurement."""

    payload_mib: float
    row_parser: str
    rows: int
    rows_per_put: int
    put_mib_s: float
    get_mib_s: float
    save_mib_s: float
    load_mib_s: float
    vet_mib_s: float
    disk_mib: float
    disk_over_payload: float


def make_batch(n: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "prompt": torch.randint(0, 32000, (n, PROMPT), generator=gen, dtype=torch.int64),
        "completion": torch.randint(0, 32000, (n, COMPLETION), generator=gen, dtype=torch.int64),
        "logprobs": torch.randn(n, COMPLETION, generator=gen, dtype=torch.float32),
        "reward": torch.rand(n, generator=gen, dtype=torch.float32),
    }


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def measure(size_mib: int, row_parser: str, rows_per_put: int, work: Path) -> Result:
    from rlckpt.dataplane.tq_client import TransferQueueClient
    from rlckpt.dataplane.tq_snapshot_check import vetted_copy

    reset_tq_state()
    rows = max(rows_per_put, (size_mib * MIB // ROW_BYTES) // rows_per_put * rows_per_put)
    payload = rows * ROW_BYTES
    keys = [f"g{i // 8:08d}:{i % 8}" for i in range(rows)]
    batches = [make_batch(rows_per_put, seed=i) for i in range(rows // rows_per_put)]
    writer = TransferQueueClient(bootstrap=False, row_parser=row_parser)

    t0 = time.perf_counter()
    for i, batch in enumerate(batches):
        await writer.put_samples(PARTITION, keys[i * rows_per_put : (i + 1) * rows_per_put], batch)
    put_s = time.perf_counter() - t0
    del batches

    t0 = time.perf_counter()
    for start in range(0, rows, 256):
        await writer.get_samples(PARTITION, keys[start : start + 256])
    get_s = time.perf_counter() - t0

    snap = work / f"snap_{size_mib}_{row_parser}"
    t0 = time.perf_counter()
    await writer.save_checkpoint(snap, {"payload_bytes": payload})
    save_s = time.perf_counter() - t0
    disk = dir_bytes(snap)

    t0 = time.perf_counter()
    vetted_copy(snap, work / "vetted")
    vet_s = time.perf_counter() - t0
    shutil.rmtree(work / "vetted")

    reset_tq_state()
    restorer = connect_client()
    t0 = time.perf_counter()
    await restorer.load_checkpoint(snap)
    load_s = time.perf_counter() - t0
    restored = len(await restorer.list_sample_ids(PARTITION))
    if restored != rows:
        raise RuntimeError(f"restored {restored} rows, expected {rows}")
    shutil.rmtree(snap)
    reset_tq_state()
    mib = payload / MIB
    return Result(
        payload_mib=round(mib, 2),
        row_parser=row_parser,
        rows=rows,
        rows_per_put=rows_per_put,
        put_mib_s=round(mib / put_s, 1),
        get_mib_s=round(mib / get_s, 1),
        save_mib_s=round(mib / save_s, 1),
        load_mib_s=round(mib / load_s, 1),
        vet_mib_s=round(mib / vet_s, 1),
        disk_mib=round(disk / MIB, 2),
        disk_over_payload=round(disk / payload, 3),
    )


def print_table(results: list[Result]) -> None:
    head = f"{'payload MiB':>11} {'parser':>6} {'rows':>6} {'put MiB/s':>9} {'get MiB/s':>9} "
    head += f"{'save MiB/s':>10} {'load MiB/s':>10} {'vet MiB/s':>9} {'disk MiB':>9} {'disk/payload':>12}"
    print(head)
    for r in results:
        print(
            f"{r.payload_mib:>11.1f} {r.row_parser:>6} {r.rows:>6} {r.put_mib_s:>9.1f} "
            f"{r.get_mib_s:>9.1f} {r.save_mib_s:>10.1f} {r.load_mib_s:>10.1f} {r.vet_mib_s:>9.1f} {r.disk_mib:>9.1f} "
            f"{r.disk_over_payload:>12.3f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256], help="payload sizes, MiB")
    parser.add_argument("--parsers", nargs="+", default=["numpy", "torch", "none"], help="row parsers to compare")
    parser.add_argument("--no-fix-max", type=int, default=64, help="largest size also run with parser 'none'")
    parser.add_argument("--rows-per-put", type=int, default=64)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rlckpt-bench-", dir="/tmp"))
    session = start_tq_session(work / "ray")
    results: list[Result] = []
    try:
        for size in args.sizes:
            for row_parser in args.parsers:
                if row_parser == "none" and size > args.no_fix_max:
                    continue  # 64x the payload on disk: 256 MiB would write 16 GiB
                result = asyncio.run(measure(size, row_parser, args.rows_per_put, work))
                print(f"done: {asdict(result)}", flush=True)
                results.append(result)
    finally:
        stop_tq_session(session)
        shutil.rmtree(work, ignore_errors=True)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "dataplane_snapshot",
        "machine": {"cpus": torch.get_num_threads(), "python": platform.python_version()},
        "row_bytes": ROW_BYTES,
        "results": [asdict(r) for r in results],
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
