"""DataPlaneCheckpointBarrier: many data-plane mutations at once, or one checkpoint window alone.

Plain asyncio (no Ray, no torch). Waiters are served first-in first-out, which makes it
writer-preferring: once a checkpoint is queued, mutations that arrive later queue behind it, so
a stream of rollouts cannot starve a checkpoint. Releasing never awaits, and a waiter cancelled
at any point either leaves the queue or, if it was granted in the meantime, releases at once:
no cancellation can leave the barrier stuck.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

# Keep the newest this-many durations of each kind: bounded memory on long runs.
DEFAULT_HISTORY = 100_000


@dataclass(frozen=True)
class BarrierStats:
    """Copies of the recorded durations, in seconds (newest last)."""

    mutation_waits: list[float]
    checkpoint_waits: list[float]
    checkpoint_windows: list[float]


@dataclass
class _Waiter:
    exclusive: bool
    future: asyncio.Future[None]


class DataPlaneCheckpointBarrier:
    """Shared (``mutation()``) / exclusive (``checkpoint()``) async lock with cheap timing records.

    Use ``async with barrier.mutation():`` around every data-plane write that the replay index
    must agree with, and ``async with barrier.checkpoint():`` around capturing the index and
    snapshotting the data plane.
    """

    def __init__(self, *, history: int = DEFAULT_HISTORY) -> None:
        self._mutations = 0  # granted shared holders
        self._checkpoint_held = False
        self._queue: collections.deque[_Waiter] = collections.deque()
        self._mutation_waits: collections.deque[float] = collections.deque(maxlen=history)
        self._checkpoint_waits: collections.deque[float] = collections.deque(maxlen=history)
        self._checkpoint_windows: collections.deque[float] = collections.deque(maxlen=history)

    # --- state, for callers and tests -----------------------------------------------------------

    @property
    def mutations_in_flight(self) -> int:
        """Number of mutations currently inside ``mutation()``."""
        return self._mutations

    @property
    def checkpoint_active(self) -> bool:
        """True while a checkpoint window is held."""
        return self._checkpoint_held

    @property
    def waiting(self) -> int:
        """Number of callers queued (mutations and checkpoints)."""
        return sum(1 for w in self._queue if not w.future.done())

    def stats(self) -> BarrierStats:
        """Recorded mutation waits, checkpoint waits and checkpoint window lengths."""
        return BarrierStats(
            mutation_waits=list(self._mutation_waits),
            checkpoint_waits=list(self._checkpoint_waits),
            checkpoint_windows=list(self._checkpoint_windows),
        )

    def reset_stats(self) -> None:
        """Forget every recorded duration (e.g. after a benchmark's warm-up)."""
        self._mutation_waits.clear()
        self._checkpoint_waits.clear()
        self._checkpoint_windows.clear()

    # --- the two context managers ---------------------------------------------------------------

    @asynccontextmanager
    async def mutation(self) -> AsyncIterator[None]:
        """Shared side: runs alongside other mutations, never inside a checkpoint window."""
        started = time.perf_counter()
        await self._acquire(exclusive=False)
        self._mutation_waits.append(time.perf_counter() - started)
        try:
            yield
        finally:
            self._release_shared()

    @asynccontextmanager
    async def checkpoint(self) -> AsyncIterator[None]:
        """Exclusive side: waits for mutations in flight; later mutations wait for it."""
        started = time.perf_counter()
        await self._acquire(exclusive=True)
        granted = time.perf_counter()
        self._checkpoint_waits.append(granted - started)
        try:
            yield
        finally:
            self._checkpoint_windows.append(time.perf_counter() - granted)
            self._release_exclusive()

    # --- mechanics -------------------------------------------------------------------------------

    def _can_grant_now(self, exclusive: bool) -> bool:
        if self._queue or self._checkpoint_held:
            return False
        return not exclusive or self._mutations == 0

    async def _acquire(self, *, exclusive: bool) -> None:
        if self._can_grant_now(exclusive):
            self._grant(exclusive)
            return
        waiter = _Waiter(exclusive, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                # granted just before the cancellation landed: give it back
                self._release_exclusive() if exclusive else self._release_shared()
            else:
                self._remove(waiter)
                self._wake()  # a cancelled queued checkpoint may have been holding mutations back
            raise

    def _grant(self, exclusive: bool) -> None:
        if exclusive:
            self._checkpoint_held = True
        else:
            self._mutations += 1

    def _remove(self, waiter: _Waiter) -> None:
        try:
            self._queue.remove(waiter)
        except ValueError:
            pass

    def _wake(self) -> None:
        """Grant waiters from the head of the queue while the lock state allows it."""
        while self._queue:
            head = self._queue[0]
            if head.future.done():  # cancelled and not yet removed
                self._queue.popleft()
                continue
            if self._checkpoint_held:
                return
            if head.exclusive and self._mutations > 0:
                return
            self._queue.popleft()
            self._grant(head.exclusive)
            head.future.set_result(None)
            if head.exclusive:
                return

    def _release_shared(self) -> None:
        self._mutations -= 1
        if self._mutations == 0:
            self._wake()

    def _release_exclusive(self) -> None:
        self._checkpoint_held = False
        self._wake()
