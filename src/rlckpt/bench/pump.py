"""A rollout pump for the benchmarks: commits groups through the replay buffer at a fixed rate and
trims the oldest groups so the data plane stays at its target size (like the train pump removing
trained groups).

Commits are started on a fixed schedule whether or not earlier ones finished (finished rollouts do
not wait for each other), so a held checkpoint window shows up as the wait of every commit that
arrives while it is held.
"""

from __future__ import annotations

import asyncio
import logging
import time

import torch

from rlckpt.bench.rows import RowShape, make_group
from rlckpt.bench.timed_barrier import ROLE
from rlckpt.replay import ReplayBuffer

logger = logging.getLogger(__name__)


class RolloutPump:
    """Open-loop producer (``rate`` groups/s) plus a consumer that keeps ``keep_groups`` committed."""

    def __init__(self, replay: ReplayBuffer, shape: RowShape, *, rate: float, keep_groups: int, seed: int = 0) -> None:
        if rate <= 0:
            raise ValueError(f"RolloutPump: rate must be > 0 groups/s, got {rate}")
        self.replay = replay
        self.shape = shape
        self.rate = rate
        self.keep_groups = keep_groups
        self._generator = torch.Generator().manual_seed(seed)
        self._seq = 0
        self._inflight: set[asyncio.Task[None]] = set()
        self._trim_wanted = asyncio.Event()
        self.committed = 0
        self.failures: list[BaseException] = []
        # (start, seconds) of every timed commit: the whole commit, put included, not only its barrier wait
        self.latencies: list[tuple[float, float]] = []

    async def fill(self, groups: int, concurrency: int = 4) -> None:
        """Commit ``groups`` groups as fast as the data plane takes them (no timing; setup only)."""
        ROLE.set("fill")
        semaphore = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with semaphore:
                await self._commit_one()

        await asyncio.gather(*(one() for _ in range(groups)))

    async def _commit_one(self) -> None:
        rows = make_group(self.shape, self._seq, weight_version=0, generator=self._generator)
        gid = self.replay.reserve(weight_version=0)
        self._seq += 1
        await self.replay.commit(gid, rows, start_weight=0, end_weight=0)
        self.committed += 1

    async def _produce_one(self) -> None:
        ROLE.set("commit")
        start = time.perf_counter()
        try:
            await self._commit_one()
            self.latencies.append((start, time.perf_counter() - start))
        except BaseException as exc:  # kept and re-raised by run(): a failing pump invalidates the point
            self.failures.append(exc)
            raise
        self._trim_wanted.set()

    async def _consume(self, stop: asyncio.Event) -> None:
        """Remove the oldest committed groups beyond ``keep_groups`` whenever a commit lands."""
        ROLE.set("remove")
        while not stop.is_set():
            await self._trim_wanted.wait()
            self._trim_wanted.clear()
            await self._trim()

    async def _trim(self) -> None:
        committed = [g for g in self.replay.groups() if g.committed]
        for record in committed[: max(0, len(committed) - self.keep_groups)]:
            await self.replay.remove_group(record.group_id)

    async def run(self, stop: asyncio.Event) -> None:
        """Start a commit every ``1/rate`` seconds until ``stop`` is set; then wait for the rest."""
        consumer = asyncio.create_task(self._consume(stop), name="bench-consumer")
        period = 1.0 / self.rate
        next_at = time.perf_counter()
        try:
            while not stop.is_set():
                task = asyncio.create_task(self._produce_one())
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
                next_at += period
                delay = next_at - time.perf_counter()
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=delay)
                    except TimeoutError:
                        pass
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
        finally:
            # never cancel the consumer mid-removal (the index and the data plane would disagree):
            # wake it so it sees ``stop`` and returns after its current trim
            stop.set()
            self._trim_wanted.set()
            await asyncio.gather(consumer, return_exceptions=True)
        if self.failures:
            raise self.failures[0]
        # commits that landed while the consumer finished its last trim were never trimmed: the data
        # plane ends at its target size however many commits the stop caught in flight
        await self._trim()
