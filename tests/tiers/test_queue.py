"""The replication queue: one replication in flight at most, a newer committed bundle supersedes a waiting
older one, a failed replication is reported in one line with the lag and leaves the next one to go ahead as
usual, and local retention's holds come from what the replication worker last found on the remote tier,
never from a call to it. Plain asyncio: a stand-in replicator holds each copy, and each read of the remote
tier, until the test lets it finish."""

from __future__ import annotations

import asyncio

from rlckpt.store import CopyReport
from rlckpt.tiers import ReplicaState, ReplicationQueue, ReplicationReport

SURVEY = -1  # the gate of a read of what the remote tier holds


class HeldReplicator:
    """Each replication waits until `finish(step)` (or `fail(step)`); a survey until `finish(SURVEY)`. A
    replication reports the remote tier holding its step as the newest replica."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self._gates: dict[int, asyncio.Future[None]] = {}

    def _gate(self, step: int) -> asyncio.Future[None]:
        return self._gates.setdefault(step, asyncio.get_running_loop().create_future())

    async def replicate(self, step: int) -> ReplicationReport:
        self.started.append(step)
        await self._gate(step)
        return ReplicationReport(step, CopyReport(step, "t", 1, 10, 1, 10, 0, 0, 0.01), state=ReplicaState(step))

    async def survey(self) -> ReplicaState:
        self.started.append(SURVEY)
        await self._gate(SURVEY)
        return ReplicaState(2)

    async def finish(self, step: int) -> None:
        self._gate(step).set_result(None)
        await settle()

    async def fail(self, step: int, exc: BaseException | None = None) -> None:
        self._gate(step).set_exception(exc or OSError("the remote went away"))
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
        assert events[-1] == {
            "event": "replication_failed",
            "step": 2,
            "error": "OSError: the remote went away",
            "lag_s": events[-1]["lag_s"],
        }
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


class RemoteTaskError(Exception):
    """As Ray raises what an actor raised: the remote traceback as its text, the exception as `cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(
            'ray::BundleReplicator.replicate() (pid=4242, ip=127.0.0.1)\n  File "replicate.py", line 9\n'
            f"\x1b[36m{type(cause).__name__}: {cause}\x1b[0m"
        )
        self.cause = cause


def test_a_failure_is_one_line_naming_its_cause_not_the_remote_traceback():
    async def body(queue, replicator, events):
        queue.submit(2)
        await settle()
        await replicator.fail(2, RemoteTaskError(ConnectionError("store s3://b/run unavailable\nsecond line")))
        assert queue.failed[2] == "ConnectionError: store s3://b/run unavailable"
        assert events[-1]["error"] == queue.failed[2]

    run(body)


def test_a_failure_message_is_capped():
    async def body(queue, replicator, events):
        queue.submit(2)
        await settle()
        await replicator.fail(2, OSError("x" * 100_000))
        assert len(queue.failed[2]) == 400 and queue.failed[2].endswith("…")

    run(body)


def test_a_failed_replication_reports_how_long_the_remote_tier_has_been_behind():
    async def body(queue, replicator, events):
        now = [100.0]
        queue.clock = lambda: now[0]
        queue.submit(2)
        await settle()
        now[0] = 110.0
        queue.submit(4)  # waits behind 2
        now[0] = 130.0
        await replicator.fail(2)
        assert events[-1]["lag_s"] == 30.0  # since 2's local commit: the remote lacks it still
        now[0] = 140.0
        await replicator.fail(4)
        assert events[-1]["lag_s"] == 40.0
        queue.submit(6)
        await settle()
        now[0] = 150.0
        await replicator.finish(6)
        assert queue.lag() == 0.0  # the remote holds the newest submitted bundle: caught up

    run(body)


def test_before_the_remote_tier_is_read_every_local_bundle_is_held():
    async def body(queue, replicator, events):
        queue.start()
        await settle()
        assert replicator.started == [SURVEY]  # the read hangs (a silent remote)...
        assert sorted(queue.holds([2, 4, 6])) == [2, 4, 6]  # ...and retention gets its answer at once
        assert queue.holds([2])[2].startswith("not known to be replicated")

    run(body)


def test_once_read_bundles_older_than_the_newest_replica_are_not_held():
    async def body(queue, replicator, events):
        queue.start()
        await settle()
        await replicator.finish(SURVEY)  # the remote holds this run's bundle of step 2
        assert sorted(queue.holds([2, 4, 6])) == [4, 6]

    run(body)


def test_each_replication_brings_what_the_remote_tier_holds_after_it():
    async def body(queue, replicator, events):
        queue.submit(4)
        await settle()
        assert sorted(queue.holds([2, 4])) == [2, 4]
        await replicator.finish(4)
        assert queue.holds([2, 4, 6]) == {
            6: "not yet replicated to s3://b/run (the newest it holds: this run's bundle of step 4)"
        }

    run(body)


def test_a_failed_read_of_the_remote_tier_keeps_the_last_answer():
    async def body(queue, replicator, events):
        queue.submit(4)
        await settle()
        await replicator.finish(4)
        queue.start()
        await settle()
        await replicator.fail(SURVEY)
        assert sorted(queue.holds([2, 4, 6])) == [6]

    run(body)


def test_drain_does_not_wait_for_a_read_of_the_remote_tier():
    async def body(queue, replicator, events):
        queue.start()
        await settle()
        assert await queue.drain(timeout=1)  # the survey still hangs: no replication is pending

    run(body)


def test_a_step_submitted_while_the_remote_tier_is_read_is_replicated_at_once():
    async def body(queue, replicator, events):
        queue.start()
        await settle()
        queue.submit(2)  # the read hangs: the replication of 2 does not wait behind it...
        await settle()
        assert replicator.started == [SURVEY, 2]
        queue.submit(4)
        await replicator.finish(2)
        await replicator.finish(4)
        assert queue.replicated == [2, 4]  # ...so no later step supersedes it

    run(body)


def test_a_read_begun_before_a_replication_ended_does_not_replace_its_newer_answer():
    async def body(queue, replicator, events):
        queue.start()
        await settle()
        queue.submit(4)
        await settle()
        await replicator.finish(4)  # the remote holds this run's step 4
        await replicator.finish(SURVEY)  # the read begun before says step 2: older news
        assert sorted(queue.holds([2, 4, 6])) == [6]

    run(body)
