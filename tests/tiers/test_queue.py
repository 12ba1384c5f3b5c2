"""The replication queue: one replication in flight at most, a newer committed bundle supersedes a waiting
older one, and a failed replication is reported and leaves the next one to go ahead as usual. Plain asyncio:
a stand-in replicator holds each copy until the test lets it finish."""

from __future__ import annotations

import asyncio

from rlckpt.store import CopyReport
from rlckpt.tiers import ReplicationQueue, ReplicationReport


class HeldReplicator:
    """Each replication waits until `finish(step)` (or `fail(step)`)."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self._gates: dict[int, asyncio.Future[None]] = {}

    def _gate(self, step: int) -> asyncio.Future[None]:
        return self._gates.setdefault(step, asyncio.get_running_loop().create_future())

    async def replicate(self, step: int) -> ReplicationReport:
        self.started.append(step)
        await self._gate(step)
        return ReplicationReport(step, CopyReport(step, "t", 1, 10, 1, 10, 0, 0, 0.01))

    async def finish(self, step: int) -> None:
        self._gate(step).set_result(None)
        await settle()

    async def fail(self, step: int) -> None:
        self._gate(step).set_exception(OSError("the remote went away"))
        await settle()


async def settle() -> None:
    """Let every task that can run, run (the queue's worker only ever waits on the replicator)."""
    for _ in range(5):
        await asyncio.sleep(0)


def run(body):
    async def main():
        replicator = HeldReplicator()
        events: list[dict] = []
        queue = ReplicationQueue(replicator, remote_url="s3://b/run", on_event=events.append)
        try:
            await body(queue, replicator, events)
        finally:
            await queue.close()

    asyncio.run(main())


def test_one_replication_is_in_flight_at_most():
    async def body(queue, replicator, events):
        queue.submit(2)
        await settle()
        queue.submit(4)
        await settle()
        assert replicator.started == [2]
        assert (queue.in_flight, queue.queued, queue.pending()) == (2, 4, {2, 4})
        await replicator.finish(2)
        assert replicator.started == [2, 4]
        await replicator.finish(4)
        assert queue.replicated == [2, 4] and queue.pending() == set()

    run(body)


def test_a_newer_committed_bundle_supersedes_a_waiting_older_one():
    async def body(queue, replicator, events):
        queue.submit(2)
        await settle()
        queue.submit(4)
        queue.submit(6)
        await replicator.finish(2)
        await replicator.finish(6)
        assert replicator.started == [2, 6]
        assert queue.replicated == [2, 6]

    run(body)


def test_a_failed_replication_is_reported_and_the_next_one_goes_ahead():
    async def body(queue, replicator, events):
        queue.submit(2)
        await settle()
        await replicator.fail(2)
        assert queue.failed == {2: "OSError: the remote went away"}
        assert events[-1] == {"event": "replication_failed", "step": 2, "error": "OSError: the remote went away"}
        queue.submit(4)
        await settle()
        await replicator.finish(4)
        assert queue.replicated == [4]
        assert events[-1]["event"] == "replicated" and events[-1]["step"] == 4

    run(body)


def test_drain_waits_for_the_replication_in_flight_and_the_one_waiting():
    async def body(queue, replicator, events):
        queue.submit(2)
        await settle()
        queue.submit(4)
        assert not await queue.drain(timeout=0.01)
        await replicator.finish(2)
        await replicator.finish(4)
        assert await queue.drain(timeout=1)

    run(body)


def test_the_lag_is_measured_from_the_local_commit():
    async def body(queue, replicator, events):
        now = [100.0]
        queue.clock = lambda: now[0]
        queue.submit(2)
        await settle()
        now[0] = 107.5
        await replicator.finish(2)
        assert events[-1]["lag_s"] == 7.5

    run(body)
