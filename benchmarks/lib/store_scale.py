"""`python -m benchmarks.store_scale`: how the cost of a save grows with the number of participants (one small file
each, one commit for all) and with the number of files one writer writes, on local disk and S3.

Both must grow linearly: the time and the storage calls *per participant* and *per file* stay flat as
the counts grow. Storage calls are counted by wrapping the store's filesystem (support.faults,
the wrapper the crash tests inject faults with: every filesystem call and every call on a file it
opened); on S3 every HTTP request s3fs sends is counted too (a hook on its botocore client), since a
listing of many keys is one call but a request per 1,000 keys.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from rlckpt.bench.destinations import Destination
from rlckpt.store import BundleStore, Receipt, open_location
from support.faults import FaultPlan, FaultyFileSystem

SHARD_BYTES = 1024
FILE_BYTES = 256


@dataclass(frozen=True)
class StoreScaleConfig:
    """Participant counts and file counts to sweep; `threads` participants (or files) at a time."""

    participants: list[int]
    files: list[int]
    threads: int = 8


@dataclass(frozen=True)
class Cost:
    """Wall time, storage calls through the filesystem and (S3) HTTP requests of one phase."""

    seconds: float
    calls: int
    requests: int | None


@dataclass(frozen=True)
class ScalePoint:
    """One destination at one count: `count` participants (`kind` "participants", each joins, writes one
    file and seals) or `count` files of one writer (`kind` "files"); `work` is that phase, `commit` the
    one commit after it."""

    destination: str
    kind: str
    count: int
    work: Cost
    commit: Cost

    def per_item(self, cost: Cost) -> dict[str, float | None]:
        """Microseconds, calls and requests per participant (or per file)."""
        return {
            "us": cost.seconds / self.count * 1e6,
            "calls": cost.calls / self.count,
            "requests": None if cost.requests is None else cost.requests / self.count,
        }


class RequestCounter:
    """Counts the HTTP requests an s3fs filesystem sends (retries included), from its botocore client."""

    def __init__(self, fs: Any) -> None:
        self._lock = threading.Lock()
        self.count = 0
        fs.s3.meta.events.register("before-send.s3", self._sent)

    def _sent(self, **_kwargs: Any) -> None:
        with self._lock:
            self.count += 1  # returning None lets the request go out


class CountedStore:
    """A BundleStore on a fresh run whose filesystem counts its calls (and, on S3, its requests)."""

    def __init__(self, destination: Destination, label: str) -> None:
        url = destination.run_url(label)
        fs, _root = open_location(url, destination.storage_options)
        self.plan = FaultPlan()  # no fault: it only counts
        self.requests = RequestCounter(fs) if destination.is_s3 else None
        self.store = BundleStore(url, destination.storage_options, fs=FaultyFileSystem(fs, self.plan))

    @contextmanager
    def measured(self, into: list[Cost]) -> Iterator[None]:
        """Time the block and count its calls and requests; the Cost is appended to `into`."""
        calls, requests = self.plan.count, self.requests.count if self.requests else None
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        sent = None if self.requests is None or requests is None else self.requests.count - requests
        into.append(Cost(seconds, self.plan.count - calls, sent))


def shard(rank: int) -> bytes:
    return bytes((rank * 31 + i) % 251 for i in range(SHARD_BYTES))


def participants_point(destination: Destination, count: int, threads: int) -> ScalePoint:
    """`count` participants join one transaction, write a shard each and seal; then one commit."""
    counted = CountedStore(destination, f"participants-{count}")
    store = counted.store
    txn = store.begin(1)
    handle = txn.handle()
    names = [f"rank{i}" for i in range(count)]

    def participate(rank: int) -> Receipt:
        with store.participant(handle, names[rank]) as writer:
            writer.write_bytes(f"policy/__{rank}_0.distcp", shard(rank))
            return writer.seal()

    costs: list[Cost] = []
    with counted.measured(costs), ThreadPoolExecutor(max_workers=threads) as pool:
        receipts = list(pool.map(participate, range(count)))
    with counted.measured(costs):
        txn.commit({"participants": count}, receipts=receipts, participants=names)
    store.open(1)  # committed, and every file in place
    return ScalePoint(destination.name, "participants", count, costs[0], costs[1])


def files_point(destination: Destination, count: int, threads: int) -> ScalePoint:
    """One writer writes `count` small files (`threads` at a time); then its commit."""
    counted = CountedStore(destination, f"files-{count}")
    txn = counted.store.begin(1)
    payload = b"f" * FILE_BYTES

    def write(n: int) -> None:
        txn.write_bytes(f"data/{n // 1000:03d}/{n:06d}.bin", payload)

    costs: list[Cost] = []
    with counted.measured(costs), ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(write, range(count)))
    with counted.measured(costs):
        txn.commit()
    counted.store.open(1)
    return ScalePoint(destination.name, "files", count, costs[0], costs[1])


def run_sweep(
    config: StoreScaleConfig,
    destinations: list[Destination],
    on_point: Callable[[ScalePoint], None] | None = None,
) -> list[ScalePoint]:
    """Every destination at every participant count, then at every file count."""
    points: list[ScalePoint] = []
    for destination in destinations:
        for count in config.participants:
            points.append(participants_point(destination, count, config.threads))
            if on_point is not None:
                on_point(points[-1])
        for count in config.files:
            points.append(files_point(destination, count, config.threads))
            if on_point is not None:
                on_point(points[-1])
    return points


def result_document(points: list[ScalePoint], config: StoreScaleConfig, meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON written beside the tables."""
    return {
        "benchmark": "store_scale",
        "config": asdict(config),
        "meta": meta,
        "points": [
            {**asdict(p), "work_per_item": p.per_item(p.work), "commit_per_item": p.per_item(p.commit)} for p in points
        ],
    }


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _total(value: int | None) -> str:
    return "-" if value is None else str(value)


def scale_tables(points: list[ScalePoint], threads: int) -> str:
    """Two markdown tables, per participant and per file: flat per-item columns down a destination mean
    linear growth. A commit's calls and requests are totals (a constant plus a page per 1,000 keys)."""
    out = [
        f"Participants (each joins, writes a {SHARD_BYTES}-byte file, seals; {threads} at a time; then one commit):\n",
        "| destination | participants | commit s | commit µs per participant | commit calls | commit requests "
        "| µs per participant | calls per participant | requests per participant |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in (p for p in points if p.kind == "participants"):
        c, w = p.per_item(p.commit), p.per_item(p.work)
        out.append(
            f"| {p.destination} | {p.count} | {p.commit.seconds:.3f} | {_num(c['us'])} | {p.commit.calls} "
            f"| {_total(p.commit.requests)} | {_num(w['us'])} | {_num(w['calls'])} | {_num(w['requests'])} |"
        )
    out += [
        "",
        f"Files of one writer ({FILE_BYTES} bytes each, {threads} at a time; then its commit):\n",
        "| destination | files | µs per file | calls per file | requests per file | commit s | commit µs per file "
        "| commit calls | commit requests |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in (p for p in points if p.kind == "files"):
        c, w = p.per_item(p.commit), p.per_item(p.work)
        out.append(
            f"| {p.destination} | {p.count} | {_num(w['us'])} | {_num(w['calls'])} | {_num(w['requests'])} "
            f"| {p.commit.seconds:.3f} | {_num(c['us'])} | {p.commit.calls} | {_total(p.commit.requests)} |"
        )
    return "\n".join(out) + "\n"
