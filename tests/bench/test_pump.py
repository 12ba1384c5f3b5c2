"""The benchmarks' rollout pump keeps the data plane at its target size, also across a stop."""

from __future__ import annotations

import asyncio

from rlckpt.bench.pump import RolloutPump
from rlckpt.bench.rows import RowShape
from rlckpt.dataplane import InMemoryDataPlane
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer

SHAPE = RowShape(prompt_len=4, completion_len=4, group_size=2, vocab=16)


def test_commits_landing_while_the_last_trim_runs_are_trimmed_before_the_pump_returns():
    async def scenario() -> int:
        replay = ReplayBuffer(InMemoryDataPlane(), DataPlaneCheckpointBarrier(), partition_id="p", group_size=2)
        pump = RolloutPump(replay, SHAPE, rate=1000.0, keep_groups=2)
        await pump.fill(2)
        held, release = asyncio.Event(), asyncio.Event()
        remove = replay.remove_group

        async def held_remove(group_id: int) -> None:  # the consumer's first removal waits for the test
            if not held.is_set():
                held.set()
                await release.wait()
            await remove(group_id)

        replay.remove_group = held_remove  # type: ignore[method-assign]
        stop = asyncio.Event()
        run = asyncio.create_task(pump.run(stop))
        await held.wait()
        landed = pump.committed
        while pump.committed < landed + 3:  # commits land while the consumer is inside its trim
            await asyncio.sleep(0)
        stop.set()
        release.set()
        await run
        return sum(1 for g in replay.groups() if g.committed)

    assert asyncio.run(scenario()) == 2
