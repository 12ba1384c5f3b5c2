"""S3 save against the server's ceiling: how long rlckpt.dcp takes to save a state, how long the same bytes take as
raw PUTs, and how much of the save had every upload slot busy.

One process, no process group: a state of 16 MiB float32 tensors (`--mib` in all) saved through
`BundleStorageWriter` (a committed, digest-checked bundle), then the same number of bytes sent as raw 16 MiB PUTs,
UPLOADS_IN_FLIGHT at once, through the S3 client the store builds (s3_ceiling.py's measure, one setting). While the
save runs, a thread samples how many requests are in flight (the process's upload slots) every millisecond. A save
that keeps every slot busy and takes about as long as the raw PUTs is bound by the server, not by rlckpt; the AWS
connector (s3torchconnector.dcp, extra `peers`) saves the same state beside it, when installed and when the server
takes its saves (Ceph 16's RGW needs the ETag proxy for them).

    scripts/rgw.sh start   # Ceph RGW on 127.0.0.1:7480
    PYTHONPATH=src .venv/bin/python benchmarks/s3_save_occupancy.py --endpoint http://127.0.0.1:7480 --proxy \
        --out benchmarks/results/s3_save_occupancy.json

Writes JSON and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from benchmarks.lib.etag_proxy import etag_proxy
from rlckpt.dcp import BundleStorageWriter
from rlckpt.s3local import s3_options_for
from rlckpt.store import BundleStore, open_location
from rlckpt.store.backends.s3_io import UPLOAD_SLOTS, UPLOADS_IN_FLIGHT
from support.dcp_ranks import quiet_dcp_warnings

TENSOR = 16 << 20
SAMPLE_EVERY = 0.001


def _state(mib: int) -> dict[str, torch.Tensor]:
    """`mib` MiB of float32 tensors of 16 MiB each, random (nothing compresses)."""
    count = max(1, (mib << 20) // TENSOR)
    return {f"w{i}": torch.rand(TENSOR // 4) for i in range(count)}


@contextmanager
def _slot_samples() -> Iterator[Counter[int]]:
    """Counts of how many requests were in flight, sampled every SAMPLE_EVERY s while the block runs."""
    counts: Counter[int] = Counter()
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_EVERY):
            counts[UPLOAD_SLOTS.in_flight] += 1

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield counts
    finally:
        done.set()
        sampler.join()


def _timed(run: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """Seconds `run(*args, **kwargs)` took."""
    start = time.perf_counter()
    run(*args, **kwargs)
    return time.perf_counter() - start


def _raw_puts(fs: Any, bucket: str, mib: int) -> float:
    """Seconds for `mib` MiB as 16 MiB PUTs, UPLOADS_IN_FLIGHT at once, through the store's client."""
    from concurrent.futures import ThreadPoolExecutor

    body = os.urandom(TENSOR)
    count = max(1, (mib << 20) // TENSOR)
    prefix = f"raw-{uuid.uuid4().hex[:8]}"

    def put(i: int) -> None:
        fs.call_s3("put_object", Bucket=bucket, Key=f"{prefix}/{i}", Body=body)

    with ThreadPoolExecutor(UPLOADS_IN_FLIGHT) as pool:
        seconds = _timed(lambda: list(pool.map(put, range(count))))
    fs.rm(f"{bucket}/{prefix}", recursive=True)
    return seconds


def _connector_save(endpoint: str, key: str, secret: str, url: str, state: dict[str, torch.Tensor]) -> float:
    """Seconds for s3torchconnector.dcp to save `state` at `url` (raises where it cannot)."""
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3StorageWriter
    from s3torchconnector.dcp.s3_file_system import S3FileSystem

    os.environ.setdefault("AWS_ACCESS_KEY_ID", key)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", secret)
    client = S3Client("us-east-1", endpoint=endpoint, s3client_config=S3ClientConfig(force_path_style=True))
    writer = S3StorageWriter("us-east-1", url)
    writer.fs = S3FileSystem(  # type: ignore[assignment]  # the connector's own, on our client
        "us-east-1", s3_client=client
    )
    writer.path = writer.fs.init_path(url)
    return _timed(dcp.save, state, storage_writer=writer)


def _first_line(exc: BaseException) -> str:
    """What failed, in one line: a DCP failure's first rank's own exception, not DCP's wrapper."""
    failures = getattr(exc, "failures", None)
    cause = next(iter(failures.values()))[0] if failures else exc
    return f"{type(cause).__name__}: {(str(cause).splitlines() or [''])[0][:160]}"


def measure(endpoint: str, key: str, secret: str, mib: int, repeats: int, connector: bool) -> dict[str, Any]:
    options = s3_options_for(endpoint, key, secret)
    fs = open_location("s3://occupancy", options)[0]
    bucket = f"occupancy-{uuid.uuid4().hex[:8]}"
    fs.call_s3("create_bucket", Bucket=bucket)
    state = _state(mib)
    store = BundleStore(f"s3://{bucket}/run", options)
    saves: list[float] = []
    raws: list[float] = []
    peers: list[float] = []
    busy: Counter[int] = Counter()
    peer_error: str | None = None
    try:
        for repeat in range(repeats + 1):  # the first round is a warm-up: connections, buffers, the server
            with _slot_samples() as counts:
                save = _timed(dcp.save, state, storage_writer=BundleStorageWriter(store, step=repeat))
            raw = _raw_puts(fs, bucket, mib)
            peer = None
            if connector and peer_error is None:
                try:
                    peer = _connector_save(endpoint, key, secret, f"s3://{bucket}/connector/{repeat}", state)
                except (Exception, CheckpointException) as exc:  # the peer's failure is reported, not fatal (DCP's is a
                    # BaseException)
                    peer_error = _first_line(exc)
                with contextlib.suppress(FileNotFoundError):  # nothing written, when it failed at once
                    fs.rm(f"{bucket}/connector/{repeat}", recursive=True)
            fs.rm(f"{bucket}/run/step_{repeat}", recursive=True)
            if repeat == 0:
                continue
            saves.append(save)
            raws.append(raw)
            busy.update(counts)
            if peer is not None:
                peers.append(peer)
            print(
                f"  save {save:.2f} s, raw PUTs {raw:.2f} s"
                + (f", connector {peer:.2f} s" if peer is not None else ""),
                flush=True,
            )
    finally:
        fs.rm(bucket, recursive=True)
    samples = sum(busy.values()) or 1
    return {
        "mib": mib,
        "save_s": statistics.median(saves),
        "raw_put_s": statistics.median(raws),
        "connector_save_s": statistics.median(peers) if peers else None,
        "connector_error": peer_error,
        "all_slots_busy": sum(n for k, n in busy.items() if k >= UPLOADS_IN_FLIGHT) / samples,
        "none_in_flight": busy.get(0, 0) / samples,
        "saves": saves,
        "raw_puts": raws,
        "connector_saves": peers,
    }


def _markdown(meta: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"S3 save against the server's ceiling at {meta['endpoint']} ({meta['date']}): {meta['mib']} MiB of 16 MiB "
        f"float32 tensors, one process; medians of {meta['repeats']} after a warm-up. Raw PUTs: the same bytes as "
        f"16 MiB objects, {UPLOADS_IN_FLIGHT} at once, through the store's client, no hashing. Slots: the share of the "
        "save's time with every upload slot busy, and with none.",
        "",
        "| path | rlckpt save s | raw PUTs s | save / raw | all slots busy | none in flight | connector save s | "
        "save / connector |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path, r in results.items():
        peer = r["connector_save_s"]
        lines.append(
            f"| {path} | {r['save_s']:.2f} | {r['raw_put_s']:.2f} | {r['save_s'] / r['raw_put_s']:.2f}× | "
            f"{r['all_slots_busy']:.0%} | {r['none_in_flight']:.0%} | "
            + (f"{peer:.2f} | {r['save_s'] / peer:.2f}× |" if peer else "- | - |")
        )
    for path, r in results.items():
        if r["connector_error"]:
            lines.append(f"\n{path}: the connector's save failed: {r['connector_error']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", required=True, help="S3 endpoint, e.g. http://127.0.0.1:7480")
    parser.add_argument("--key", default="testing")
    parser.add_argument("--secret", default="testing")
    parser.add_argument("--mib", type=int, default=1024, help="state size in MiB (default 1024)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--proxy", action="store_true", help="also measure through the ETag proxy (nginx)")
    parser.add_argument("--no-connector", action="store_true", help="skip s3torchconnector's save")
    parser.add_argument("--out", type=Path, help="results JSON (a .md goes beside it)")
    args = parser.parse_args()
    quiet_dcp_warnings()
    connector = not args.no_connector
    results: dict[str, dict[str, Any]] = {}
    print(f"direct {args.endpoint}", flush=True)
    results["direct"] = measure(args.endpoint, args.key, args.secret, args.mib, args.repeats, connector)
    if args.proxy:
        with etag_proxy(args.endpoint) as proxied:
            print(f"through the ETag proxy {proxied}", flush=True)
            results["etag-proxy"] = measure(proxied, args.key, args.secret, args.mib, args.repeats, connector)
    meta = {
        "endpoint": args.endpoint,
        "mib": args.mib,
        "repeats": args.repeats,
        "uploads_in_flight": UPLOADS_IN_FLIGHT,
        "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
    }
    table = _markdown(meta, results)
    print(table)
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
