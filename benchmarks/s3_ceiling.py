"""S3 ceiling: how fast the server itself takes and gives whole objects, with no checkpoint around them.

Raw PUTs and GETs of 16 MiB objects (a shard file's size) through the S3 client the store builds (s3fs's, with
the store's options), N at once, no hashing, no DCP: what no checkpoint library reaching this endpoint from one
process can beat. `python -m benchmarks.policy` puts rlckpt and its peers against each other; this says how close the
best of them is to the server.

    scripts/rgw.sh start   # Ceph RGW on 127.0.0.1:7480
    PYTHONPATH=src .venv/bin/python benchmarks/s3_ceiling.py --endpoint http://127.0.0.1:7480 --proxy \
        --out benchmarks/results/s3_ceiling.json

--proxy also measures through the ETag proxy (bench/etag_proxy.py; needs nginx). Writes JSON and a markdown
table beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import resource
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fsspec.asyn import sync

from benchmarks.lib.etag_proxy import etag_proxy
from rlckpt.s3local import s3_options_for
from rlckpt.store import open_location

OBJECT = 16 << 20


def _client(endpoint: str, key: str, secret: str) -> Any:
    """The S3 client the store itself builds for this endpoint (its config: no payload signing, deadlines)."""
    return open_location("s3://ceiling", s3_options_for(endpoint, key, secret))[0]


async def _at_once(count: int, at_once: int, request: Callable[[int], Awaitable[Any]]) -> None:
    """`request(i)` for i in range(count), at most `at_once` in flight."""
    slots = asyncio.Semaphore(at_once)

    async def one(i: int) -> None:
        async with slots:
            await request(i)

    await asyncio.gather(*(one(i) for i in range(count)))


def _timed(fs: Any, run: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds of `run()` on the client's loop."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    sync(fs.loop, run)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(endpoint: str, key: str, secret: str, mib: int, at_once: list[int], repeats: int) -> list[dict[str, Any]]:
    fs = _client(endpoint, key, secret)
    bucket = f"ceiling-{uuid.uuid4().hex[:8]}"
    fs.call_s3("create_bucket", Bucket=bucket)
    body = os.urandom(OBJECT)
    count = max(1, (mib << 20) // OBJECT)
    rows = []
    try:
        for n in at_once:
            for op in ("put", "get"):
                walls, cpus = [], []
                for r in range(repeats):
                    prefix = f"n{n}-r{r}"

                    async def put(i: int, prefix: str = prefix) -> None:
                        await fs._call_s3("put_object", Bucket=bucket, Key=f"{prefix}/{i}", Body=body)

                    async def get(i: int, prefix: str = prefix) -> None:
                        await fs._cat_file(f"{bucket}/{prefix}/{i}")

                    if op == "get":  # the objects to read, put untimed
                        sync(fs.loop, _at_once, count, 8, put)
                    wall, cpu = _timed(fs, functools.partial(_at_once, count, n, put if op == "put" else get))
                    walls.append(wall)
                    cpus.append(cpu)
                    fs.rm(f"{bucket}/{prefix}", recursive=True)
                wall = statistics.median(walls)
                rows.append(
                    {
                        "op": op,
                        "at_once": n,
                        "mib": count * OBJECT >> 20,
                        "seconds": wall,
                        "mib_per_s": (count * OBJECT >> 20) / wall,
                        "client_cpu_s": statistics.median(cpus),
                    }
                )
                print(f"  {op} {n} at once: {rows[-1]['mib_per_s']:.0f} MiB/s ({wall:.2f} s)", flush=True)
    finally:
        fs.rm(bucket, recursive=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", required=True, help="S3 endpoint, e.g. http://127.0.0.1:7480")
    parser.add_argument("--key", default="testing")
    parser.add_argument("--secret", default="testing")
    parser.add_argument("--mib", type=int, default=1024, help="bytes moved per run (default 1024)")
    parser.add_argument("--at-once", default="1,2,4,8", help="requests in flight, comma list (default 1,2,4,8)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--proxy", action="store_true", help="also measure through the ETag proxy (nginx)")
    parser.add_argument("--out", type=Path, help="results JSON (a .md goes beside it)")
    args = parser.parse_args()
    at_once = [int(n) for n in args.at_once.split(",")]
    results: dict[str, list[dict[str, Any]]] = {}
    print(f"direct {args.endpoint}", flush=True)
    results["direct"] = measure(args.endpoint, args.key, args.secret, args.mib, at_once, args.repeats)
    if args.proxy:
        with etag_proxy(args.endpoint) as proxied:
            print(f"through the ETag proxy {proxied}", flush=True)
            results["etag-proxy"] = measure(proxied, args.key, args.secret, args.mib, at_once, args.repeats)
    if args.out:
        meta = {
            "endpoint": args.endpoint,
            "object_mib": OBJECT >> 20,
            "repeats": args.repeats,
            "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        }
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
        lines = [
            f"S3 ceiling at {args.endpoint} ({meta['date']}): {args.mib} MiB as {OBJECT >> 20} MiB objects through "
            f"s3fs's client, no hashing; medians of {args.repeats}. Client CPU is this process's user+system.",
            "",
            "| path | op | in flight | MiB/s | s | client CPU s |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for path, rows in results.items():
            lines += [
                f"| {path} | {r['op']} | {r['at_once']} | {r['mib_per_s']:.0f} | {r['seconds']:.2f} | "
                f"{r['client_cpu_s']:.2f} |"
                for r in rows
            ]
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
