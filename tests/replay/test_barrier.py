"""DataPlaneCheckpointBarrier: shared mutations, exclusive checkpoints, no starvation, cancel-safe."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from rlckpt.replay import DataPlaneCheckpointBarrier
from rlckpt.replay import barrier as barrier_module


def run(coro):
    return asyncio.run(coro)


async def settle() -> None:
    """Let every ready task run until nothing changes (a few loop turns)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_mutations_run_concurrently():
    async def main():
        barrier = DataPlaneCheckpointBarrier()
        async with barrier.mutation(), barrier.mutation():
            assert barrier.mutations_in_flight == 2

    run(main())


def test_checkpoint_waits_for_mutations_in_flight():
    async def main():
        barrier = DataPlaneCheckpointBarrier()
        entered = asyncio.Event()

        async def checkpoint():
            async with barrier.checkpoint():
                entered.set()

        async with barrier.mutation():
            task = asyncio.create_task(checkpoint())
            await settle()
            assert not entered.is_set()
        await task
        assert entered.is_set()

    run(main())


def test_mutations_arriving_after_a_waiting_checkpoint_queue_behind_it():
    async def main():
        barrier = DataPlaneCheckpointBarrier()
        order: list[str] = []

        async def checkpoint():
            async with barrier.checkpoint():
                order.append("checkpoint")

        async def late_mutation():
            async with barrier.mutation():
                order.append("late mutation")

        async with barrier.mutation():
            cp = asyncio.create_task(checkpoint())
            await settle()
            late = asyncio.create_task(late_mutation())
            await settle()
            assert order == []
        await asyncio.gather(cp, late)
        assert order == ["checkpoint", "late mutation"]

    run(main())


def test_checkpoints_are_exclusive_with_each_other():
    async def main():
        barrier = DataPlaneCheckpointBarrier()
        inside = 0
        peak = 0

        async def checkpoint():
            nonlocal inside, peak
            async with barrier.checkpoint():
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0)
                inside -= 1

        await asyncio.gather(*(checkpoint() for _ in range(5)))
        assert peak == 1

    run(main())


def test_cancelling_a_queued_checkpoint_releases_the_mutations_behind_it():
    async def main():
        barrier = DataPlaneCheckpointBarrier()
        got_in = asyncio.Event()

        async def checkpoint():
            async with barrier.checkpoint():
                pass

        async def mutation():
            async with barrier.mutation():
                got_in.set()

        async with barrier.mutation():
            cp = asyncio.create_task(checkpoint())
            await settle()
            queued = asyncio.create_task(mutation())
            await settle()
            cp.cancel()
            await settle()
            assert got_in.is_set()  # no longer blocked by the cancelled checkpoint
        await queued
        assert barrier.waiting == 0 and barrier.mutations_in_flight == 0

    run(main())


def test_cancelling_a_waiter_right_after_it_was_granted_gives_the_grant_back():
    async def main():
        barrier = DataPlaneCheckpointBarrier()

        async def checkpoint():
            async with barrier.checkpoint():
                raise AssertionError("body must not run after cancellation")

        async with barrier.mutation():
            cp = asyncio.create_task(checkpoint())
            await settle()
        # the mutation's exit granted the checkpoint; cancel before the task resumes
        assert barrier.checkpoint_active  # granted, task not resumed yet
        cp.cancel()
        (outcome,) = await asyncio.gather(cp, return_exceptions=True)
        assert isinstance(outcome, asyncio.CancelledError)
        assert not barrier.checkpoint_active
        async with barrier.mutation():
            pass

    run(main())


def test_an_exception_inside_a_checkpoint_releases_it():
    async def main():
        barrier = DataPlaneCheckpointBarrier()
        try:
            async with barrier.checkpoint():
                raise RuntimeError("snapshot failed")
        except RuntimeError:
            pass
        async with barrier.mutation():
            assert not barrier.checkpoint_active

    run(main())


class StepClock:
    """A perf_counter that moves only when the test says so: recorded durations become exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def test_records_one_wait_per_mutation_and_one_window_per_checkpoint(monkeypatch):
    clock = StepClock()
    monkeypatch.setattr(barrier_module, "time", clock)

    async def main():
        barrier = DataPlaneCheckpointBarrier()
        for _ in range(3):
            async with barrier.mutation():
                pass
        async with barrier.checkpoint():
            clock.now += 4.0
        stats = barrier.stats()
        assert len(stats.mutation_waits) == 3
        assert len(stats.checkpoint_windows) == 1 and len(stats.checkpoint_waits) == 1
        assert stats.mutation_waits == [0.0, 0.0, 0.0]  # nothing held: no wait
        assert stats.checkpoint_windows == [4.0]  # grant to release, as the clock moved inside
        barrier.reset_stats()
        assert barrier.stats().mutation_waits == []

    run(main())


def test_a_mutation_queued_behind_a_window_records_its_wait_until_the_release(monkeypatch):
    clock = StepClock()
    monkeypatch.setattr(barrier_module, "time", clock)

    async def main():
        barrier = DataPlaneCheckpointBarrier()
        entered = asyncio.Event()

        async def mutation():
            async with barrier.mutation():
                entered.set()

        async with barrier.checkpoint():  # window opens at t=100
            clock.now = 103.0
            task = asyncio.create_task(mutation())  # asks at t=103
            await settle()
            assert not entered.is_set()
            clock.now = 110.0  # the window is released at t=110
        await task
        stats = barrier.stats()
        assert stats.mutation_waits == [7.0]  # from its request at 103 to the release at 110
        assert stats.checkpoint_windows == [10.0]
        assert stats.checkpoint_waits == [0.0]

    run(main())


# --- randomized interleavings -----------------------------------------------------------------

ACTOR = st.tuples(
    st.sampled_from(["mutation", "checkpoint"]),
    st.integers(min_value=0, max_value=3),  # loop turns before entering
    st.integers(min_value=0, max_value=3),  # loop turns inside
    st.sampled_from([None, "before", "inside"]),  # where it gets cancelled, if at all
)


@settings(max_examples=200, deadline=None)
@given(st.lists(ACTOR, min_size=1, max_size=12))
def test_random_interleavings_keep_exclusion_and_always_drain(actors):
    async def main():
        barrier = DataPlaneCheckpointBarrier()
        state = {"mutations": 0, "checkpoints": 0}
        violations: list[str] = []

        async def actor(kind, delay, hold):
            for _ in range(delay):
                await asyncio.sleep(0)
            cm = barrier.mutation() if kind == "mutation" else barrier.checkpoint()
            async with cm:
                key = "mutations" if kind == "mutation" else "checkpoints"
                state[key] += 1
                if state["checkpoints"] > 1 or (state["checkpoints"] and state["mutations"]):
                    violations.append(str(state))
                try:
                    for _ in range(hold):
                        await asyncio.sleep(0)
                finally:
                    state[key] -= 1

        tasks = [asyncio.create_task(actor(kind, delay, hold)) for kind, delay, hold, _ in actors]
        for (_, delay, _hold, cancel), task in zip(actors, tasks, strict=True):
            if cancel == "before":
                task.cancel()
            elif cancel == "inside":
                for _ in range(delay + 1):
                    await asyncio.sleep(0)
                task.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
        assert violations == []
        assert barrier.mutations_in_flight == 0
        assert not barrier.checkpoint_active
        assert barrier.waiting == 0
        async with barrier.checkpoint():  # still usable
            pass

    run(main())


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=5))
def test_a_waiting_checkpoint_is_never_starved_by_a_stream_of_mutations(holders, stream_delay):
    async def main():
        barrier = DataPlaneCheckpointBarrier()
        done = asyncio.Event()
        granted_after: list[int] = []
        started_mutations = 0

        async def holder():
            async with barrier.mutation():
                await asyncio.sleep(0)

        async def stream():
            nonlocal started_mutations
            while not done.is_set():
                async with barrier.mutation():
                    started_mutations += 1
                    await asyncio.sleep(0)

        async def checkpoint():
            for _ in range(stream_delay):
                await asyncio.sleep(0)
            async with barrier.checkpoint():
                granted_after.append(started_mutations)
            done.set()

        streams = [asyncio.create_task(stream()) for _ in range(3)]
        await asyncio.wait_for(asyncio.gather(*(holder() for _ in range(holders)), checkpoint()), timeout=5)
        await asyncio.wait_for(asyncio.gather(*streams), timeout=5)
        assert len(granted_after) == 1

    run(main())
