"""ReplicationQueue: replications of committed bundles beside the run, one at a time (docs/tiers.md).

`submit(step)` after a local commit starts the copy at once when none is in flight; otherwise the step
waits, and a newer one submitted meanwhile takes its place (the newer bundle supersedes it: the remote
tier wants the newest state, not every state). A replication that fails is logged and reported as an
event; nothing is retried on its own — the next submitted step is tried as usual. The queue only awaits:
the copy runs in a `Replicator` that keeps it off the event loop (a thread, or a Ray actor of its own).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from .replicate import BundleReplicator, ReplicationReport

log = logging.getLogger(__name__)


class Replicator(Protocol):
    """Runs one replication off the caller's event loop."""

    async def replicate(self, step: int) -> ReplicationReport: ...


class ThreadReplicator:
    """A BundleReplicator in a worker thread of this process (the in-process harness, tests). The
    controller's replication actor runs the same BundleReplicator in a process of its own."""

    def __init__(self, replicator: BundleReplicator) -> None:
        self.replicator = replicator

    async def replicate(self, step: int) -> ReplicationReport:
        return await asyncio.to_thread(self.replicator.replicate, step)


class ReplicationQueue:
    """One replication in flight at most; a newer submitted step supersedes a waiting older one."""

    def __init__(
        self,
        replicator: Replicator,
        *,
        remote_url: str,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replicator = replicator
        self.remote_url = remote_url
        self.on_event = on_event or (lambda event: None)
        self.clock = clock
        self.in_flight: int | None = None
        self.queued: int | None = None
        self.replicated: list[int] = []
        self.failed: dict[int, str] = {}
        self._committed_at: dict[int, float] = {}
        self._worker: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def pending(self) -> set[int]:
        """Steps in flight or waiting: local retention keeps them."""
        return {step for step in (self.in_flight, self.queued) if step is not None}

    def submit(self, step: int) -> None:
        """Replicate committed bundle `step` (just committed locally) as soon as nothing is in flight."""
        if self.queued is not None and self.queued != step:
            log.info("replication of step %d superseded by step %d before it started", self.queued, step)
            self._committed_at.pop(self.queued, None)
        self.queued = step
        self._committed_at[step] = self.clock()
        self._idle.clear()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work(), name="replication")

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait until nothing is in flight or waiting (at most `timeout` seconds); True when it is so."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop waiting for the replication in flight (its copy, in a thread or actor of its own, is not
        stopped: whatever it does not commit stays uncommitted). A waiting step is dropped."""
        self.queued = None
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)

    async def _work(self) -> None:
        while self.queued is not None:
            step, self.queued = self.queued, None
            self.in_flight = step
            try:
                report = await self.replicator.replicate(step)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(step, exc)
            else:
                self._done(step, report)
            finally:
                self.in_flight = None
        self._idle.set()

    def _done(self, step: int, report: ReplicationReport) -> None:
        lag = self.clock() - self._committed_at.pop(step, self.clock())
        self.replicated.append(step)
        log.info("replicated %s to %s (%.2fs after its local commit)", report.copy.describe(), self.remote_url, lag)
        self.on_event(
            {
                "event": "replicated",
                "step": step,
                "lag_s": lag,
                "copy_s": report.copy.seconds,
                "bytes": report.copy.bytes,
                "copied_files": report.copy.copied_files,
                "adopted_files": report.copy.adopted_files,
                "remote_deleted": report.remote_deleted,
            }
        )

    def _failed(self, step: int, exc: Exception) -> None:
        self._committed_at.pop(step, None)
        why = f"{type(exc).__name__}: {exc}"
        self.failed[step] = why
        log.error(
            "replication of step %d to %s failed (%s); nothing of it is committed there, and the next replicated "
            "save will be tried as usual",
            step,
            self.remote_url,
            why,
        )
        self.on_event({"event": "replication_failed", "step": step, "error": why})
