"""A DataPlaneCheckpointBarrier that also records *when* things happened, for the stall benchmark.

The barrier's own ``stats()`` keeps durations only; to tell a commit that waited for a save's
window from one that did not, the benchmark needs timestamps: each mutation's request and grant
time (tagged with the caller's role) and each checkpoint window's start and end.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from rlckpt.replay import DataPlaneCheckpointBarrier

# Set by the benchmark's producer tasks ("commit") and consumer ("remove"); mutations outside
# any tagged task are recorded as "other".
ROLE: contextvars.ContextVar[str] = contextvars.ContextVar("rlckpt_bench_role", default="other")


@dataclass(frozen=True)
class MutationEvent:
    """One mutation: who asked, when it asked and when it was let in (perf_counter seconds)."""

    role: str
    requested: float
    granted: float

    @property
    def wait(self) -> float:
        return self.granted - self.requested


@dataclass(frozen=True)
class WindowEvent:
    """One checkpoint window: from grant to release (perf_counter seconds)."""

    start: float
    end: float


class TimedBarrier(DataPlaneCheckpointBarrier):
    """Same locking as the real barrier (it delegates), plus timestamped event lists."""

    def __init__(self) -> None:
        super().__init__()
        self.mutation_events: list[MutationEvent] = []
        self.window_events: list[WindowEvent] = []

    @asynccontextmanager
    async def mutation(self) -> AsyncIterator[None]:
        requested = time.perf_counter()
        async with super().mutation():
            self.mutation_events.append(MutationEvent(ROLE.get(), requested, time.perf_counter()))
            yield

    @asynccontextmanager
    async def checkpoint(self) -> AsyncIterator[None]:
        async with super().checkpoint():
            start = time.perf_counter()
            try:
                yield
            finally:
                self.window_events.append(WindowEvent(start, time.perf_counter()))

    def clear_events(self) -> None:
        """Forget recorded events and the base class's durations (between benchmark points)."""
        self.mutation_events.clear()
        self.window_events.clear()
        self.reset_stats()
