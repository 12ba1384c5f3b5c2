"""ReplicationQueue: replications of committed bundles beside the run, one at a time (docs/tiers.md).

`submit(step)` after a local commit starts the copy at once when none is in flight; otherwise the step
waits, and a newer one submitted meanwhile takes its place (the newer bundle supersedes it: the remote
tier wants the newest state, not every state). A replication that fails is logged and reported as an
event in one line, with how long the remote tier has been behind; nothing is retried on its own — the next
submitted step is tried as usual. The queue only awaits: the copy runs in a `Replicator` that keeps it off
the event loop (a thread, or a Ray actor of its own).

The queue also keeps what the remote tier was last found to hold of the local tier's bundles
(`ReplicaState`: read by the replicator at `start()`, beside the replications, and after each replication),
so that local retention decides without a call to the remote tier (`holds`): a remote that is down or
silent delays that answer and grows the lag, never a save.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .holds import ReplicaState, holds_for
from .replicate import BundleReplicator, ReplicationReport

log = logging.getLogger(__name__)

FAILURE_MAX_CHARS = 400  # of a failure's message in an event, the log and the run's summary


class Replicator(Protocol):
    """Runs one replication, or one read of what the remote tier holds, off the caller's event loop."""

    async def replicate(self, step: int) -> ReplicationReport: ...

    async def survey(self) -> ReplicaState: ...


def describe_failure(exc: BaseException) -> str:
    """What failed, as every rlckpt error is shown: `Class: message` on one line, at most FAILURE_MAX_CHARS. A
    failure that crossed a Ray task boundary is named by its cause (`.cause`: Ray wraps it in a RayTaskError
    whose text is the remote traceback)."""
    cause = getattr(exc, "cause", None)
    exc = cause if isinstance(cause, BaseException) else exc
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= FAILURE_MAX_CHARS else text[: FAILURE_MAX_CHARS - 1] + "…"


class ThreadReplicator:
    """A BundleReplicator in a worker thread of this process (the in-process harness, tests). The
    controller's replication actor runs the same BundleReplicator in a process of its own."""

    def __init__(self, replicator: BundleReplicator) -> None:
        self.replicator = replicator

    async def replicate(self, step: int) -> ReplicationReport:
        return await asyncio.to_thread(self.replicator.replicate, step)

    async def survey(self) -> ReplicaState:
        return await asyncio.to_thread(self.replicator.survey)


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
        self.state: ReplicaState | None = None  # what the remote tier was last found to hold (None: unknown)
        self._committed_at: dict[int, float] = {}
        self._behind_since: float | None = None  # local commit of the oldest submitted step not replicated
        self._answers = 0  # replications that brought a ReplicaState: a read begun before one is older
        self._survey: asyncio.Task[None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def pending(self) -> set[int]:
        """Steps in flight or waiting: local retention keeps them."""
        return {step for step in (self.in_flight, self.queued) if step is not None}

    def holds(self, local_steps: Iterable[int]) -> dict[int, str]:
        """What local retention keeps of `local_steps` (holds.holds_for) by the last known ReplicaState and the
        steps pending here: no call to the remote tier, so any thread may ask while a replication hangs."""
        return holds_for(local_steps, self.state, self.remote_url, self.pending())

    def start(self) -> None:
        """Read what the remote tier holds, in the background, beside the replications (never ahead of one: a
        step submitted meanwhile is not kept waiting, so none is superseded for it)."""
        if self._survey is None:
            self._survey = asyncio.create_task(self._read_remote(), name="replication-survey")

    def submit(self, step: int) -> None:
        """Replicate committed bundle `step` (just committed locally) as soon as nothing is in flight."""
        if self.queued is not None and self.queued != step:
            log.info("replication of step %d superseded by step %d before it started", self.queued, step)
            self._committed_at.pop(self.queued, None)
        self.queued = step
        now = self.clock()
        self._committed_at[step] = now
        self._behind_since = now if self._behind_since is None else self._behind_since
        self._idle.clear()
        self._ensure_worker()

    def lag(self) -> float:
        """Seconds since the local commit of the oldest submitted bundle the remote tier has not received (0:
        it holds every one)."""
        return 0.0 if self._behind_since is None else self.clock() - self._behind_since

    def _ensure_worker(self) -> None:
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
        stopped: whatever it does not commit stays uncommitted), and for a read of the remote tier. A
        waiting step is dropped."""
        self.queued = None
        for task in (self._worker, self._survey):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _work(self) -> None:
        while self.queued is not None:
            step = self.in_flight = self.queued  # pending() holds it all along (retention asks from its thread)
            self.queued = None
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
                if self.queued is None:
                    self._idle.set()  # drain() waits for replications, not for a read of the remote tier

    async def _read_remote(self) -> None:
        answers = self._answers
        try:
            state = await self.replicator.survey()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the last answer stands (none: every local bundle is kept)
            log.warning("what %s holds could not be read (%s)", self.remote_url, describe_failure(exc))
            return
        if self._answers == answers:  # else a replication ended meanwhile with a newer answer
            self.state = state

    def _done(self, step: int, report: ReplicationReport) -> None:
        lag = self.clock() - self._committed_at.pop(step, self.clock())
        if report.state is not None:
            self.state = report.state
            self._answers += 1
        self._behind_since = None if self.queued is None else self._committed_at.get(self.queued)
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
        why = describe_failure(exc)
        self.failed[step] = why
        lag = self.lag()
        log.error(
            "replication of step %d to %s failed (%s); nothing of it is committed there, the remote tier is "
            "%.1fs behind, and the next replicated save will be tried as usual",
            step,
            self.remote_url,
            why,
            lag,
        )
        self.on_event({"event": "replication_failed", "step": step, "error": why, "lag_s": lag})
