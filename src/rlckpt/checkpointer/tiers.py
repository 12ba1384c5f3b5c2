"""What follows a commit, for any writer of a run: the remote tier's replication and the local tier's retention.

Functions and one class that `rlckpt train`'s controller can share (docs/trainer.md lists where): the tiers
made one run before the first save (``tiers.one_run``), the replication queue (``tiers.ReplicationQueue``: one
copy in flight, a newer step supersedes a waiting one) hosted on an event loop of its own for a caller without
one, and retention after a commit with the remote tier's holds (``ReplicationQueue.holds``): never a bundle newer
than the newest one the remote tier holds as that bundle of this run. No remote call runs on the caller's
thread, nor in retention: a replication, and the read of what the remote tier holds, run in a thread of the
queue's; retention asks the queue for its last answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rlckpt.store import BundleStore, Retention
from rlckpt.tiers import BundleReplicator, ReplicationConfig, ReplicationQueue, ThreadReplicator

logger = logging.getLogger(__name__)

# Threads that verify and delete bundles in a retention after a save: it runs beside training, which keeps
# the cores (checkpoint/save.py measured the same for rlckpt train's controller).
RETENTION_WORKERS = 1


def retain_after_commit(
    store: BundleStore,
    retention: Retention,
    holds: Callable[[], Mapping[int, str]] | None = None,
    *,
    max_workers: int = RETENTION_WORKERS,
) -> list[int] | None:
    """Retention after a successful commit: `retention`'s rules plus the steps `holds()` says must stay (a
    remote tier's). It never un-commits the save, so a failure is logged, not raised; when `holds` cannot
    say what must be kept, nothing is deleted this time, and when they hold every bundle there is (the
    remote tier holds nothing of the run, or is silent), gc does not run: it could delete nothing.

    Returns:
        The steps deleted, or None when retention failed (logged) or has no rule.
    """
    if not retention.deletes:
        return None
    try:
        held = dict(holds()) if holds is not None else {}
        if held and set(store.marked_steps()) <= held.keys():
            return []
        report = store.gc(
            retention=dataclasses.replace(retention, holds={**retention.holds, **held}), max_workers=max_workers
        )
    except Exception:
        logger.warning("retention (%s) of %s failed; the new bundle is committed", retention, store.url, exc_info=True)
        return None
    if report.deleted_steps:
        logger.info("retention deleted step(s) %s at %s", report.deleted_steps, store.url)
    return list(report.deleted_steps)


class BackgroundReplication:
    """A ReplicationQueue on an event loop in a daemon thread of its own, for callers without one (a torchrun
    trainer): `submit` returns at once; the copy runs in a worker thread of that loop."""

    def __init__(self, local_url: str, local_options: dict[str, Any] | None, config: ReplicationConfig) -> None:
        self.config = config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlckpt-replication", daemon=True)
        self._thread.start()
        replicator = ThreadReplicator(BundleReplicator(local_url, local_options, config))
        self.queue: ReplicationQueue = self._call(self._make_queue, replicator)

    async def _make_queue(self, replicator: ThreadReplicator) -> ReplicationQueue:
        queue = ReplicationQueue(replicator, remote_url=self.config.url)
        queue.start()  # what the remote tier holds, read in the queue's worker thread
        return queue

    def _call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """Run coroutine function `fn(*args)` on the queue's loop; its result (TimeoutError after `timeout`)."""
        return asyncio.run_coroutine_threadsafe(fn(*args), self._loop).result(timeout)

    def submit(self, step: int) -> None:
        """Replicate committed step `step` as soon as nothing is in flight (a waiting older step is dropped)."""
        self._loop.call_soon_threadsafe(self.queue.submit, step)

    def pending(self) -> set[int]:
        """Steps in flight or waiting (read on the queue's loop: one consistent view)."""

        async def read() -> set[int]:
            return self.queue.pending()

        return set(self._call(read))

    def holds(self, local: BundleStore) -> Mapping[int, str]:
        """What local retention must keep now (ReplicationQueue.holds: by what the queue's worker last read on
        the remote tier, on the queue's loop for one consistent view; one listing of `local`, no remote call)."""
        steps = local.marked_steps()

        async def read() -> dict[int, str]:
            return self.queue.holds(steps)

        return dict(self._call(read))

    @property
    def replicated(self) -> list[int]:
        return list(self.queue.replicated)

    @property
    def failed(self) -> dict[int, str]:
        return dict(self.queue.failed)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until nothing is in flight or waiting (at most `timeout` seconds); True when it is so."""
        return bool(self._call(self.queue.drain, timeout))

    def close(self) -> None:
        """Stop waiting for the copy in flight (not committed: stays uncommitted there) and stop the loop."""
        if self._loop.is_closed():
            return
        try:
            self._call(self.queue.close, timeout=30)
        except Exception:
            logger.warning("closing the replication queue failed", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._loop.close()
