"""gather_ranks: the controller's wait for one call on every trainer rank."""

from __future__ import annotations

import asyncio

import pytest

from rlckpt.controller.ranks.trainer_group import gather_ranks
from rlckpt.errors import TrainerGroupError


def test_a_cancelled_wait_ends_only_after_every_rank_finished_its_call():
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        calls = [loop.create_future(), loop.create_future()]
        seen: list[str] = []
        waiting = asyncio.ensure_future(gather_ranks("writing the policy of step 4", calls, timeout_s=60))
        await asyncio.sleep(0)  # the wait has started
        waiting.cancel()
        for _ in range(5):  # the loop turns; the cancelled wait holds on while a rank still writes
            await asyncio.sleep(0)
        seen.append("done" if waiting.done() else "waiting")
        calls[0].set_result("rank0")
        calls[1].set_result("rank1")
        with pytest.raises(asyncio.CancelledError):
            await waiting
        seen.append("cancelled")
        return seen

    assert asyncio.run(scenario()) == ["waiting", "cancelled"]


def test_a_rank_that_fails_is_named_with_its_cause():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        calls = [loop.create_future(), loop.create_future()]
        calls[0].set_result("rank0")
        calls[1].set_exception(OSError("disk full"))
        await gather_ranks("writing the policy of step 4", calls, timeout_s=60)

    with pytest.raises(TrainerGroupError, match=r"failed on 1 of 2 trainer ranks: rank 1: OSError: disk full"):
        asyncio.run(scenario())
