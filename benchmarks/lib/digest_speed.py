"""How fast this machine hashes: sha256 against BLAKE3 on one thread and on its threads, through the store's own
hashers (store/io/digest.py), over a buffer already in memory. `python -m benchmarks.policy` reports it beside the
save and load times it explains."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from rlckpt.bench.rows import MiB
from rlckpt.store.io.digest import BLAKE3, SHA256, new_hasher

DEFAULT_MIB = 256


@dataclass(frozen=True)
class DigestSpeed:
    """One algorithm and thread setting: median and best MiB/s over `repeats` passes of `mib` MiB."""

    name: str
    algorithm: str
    threads: int
    mib: int
    repeats: int
    median_mib_s: float
    best_mib_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measure_digests(mib: int = DEFAULT_MIB, repeats: int = 5) -> list[DigestSpeed]:
    """sha256, BLAKE3 on 1 thread and BLAKE3 on its threads (one per core), each hashing the same random
    buffer whole, in one update per 4 MiB as the store's readers do."""
    data = memoryview(os.urandom(mib * MiB))
    cores = os.cpu_count() or 1
    settings = [("sha256", SHA256, 1), ("blake3, 1 thread", BLAKE3, 1), (f"blake3, {cores} threads", BLAKE3, cores)]
    out = []
    for name, algorithm, threads in settings:
        times = [_one_pass(data, algorithm, threads > 1) for _ in range(repeats)]
        out.append(
            DigestSpeed(name, algorithm, threads, mib, repeats, mib / statistics.median(times), mib / min(times))
        )
    return out


def _one_pass(data: memoryview, algorithm: str, threaded: bool) -> float:
    piece = 4 * MiB
    start = time.perf_counter()
    hasher = new_hasher(algorithm, len(data), threaded=threaded)
    for at in range(0, len(data), piece):
        hasher.update(data[at : at + piece])
    hasher.hexdigest()
    return time.perf_counter() - start


def digest_table(speeds: list[DigestSpeed]) -> str:
    """Markdown: one row per setting."""
    lines = ["| digest | MiB/s (median) | MiB/s (best) |", "|---|---:|---:|"]
    lines += [f"| {s.name} | {s.median_mib_s:,.0f} | {s.best_mib_s:,.0f} |" for s in speeds]
    return "\n".join(lines) + "\n"
