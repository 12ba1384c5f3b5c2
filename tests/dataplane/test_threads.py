"""run_blocking: a blocking call in a worker thread that never outlives its awaiting caller.

The call is held at a threading.Event, so each test decides exactly when it may finish; a
cancelled caller is checked while the call is still held (it cannot have finished yet).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Self

import pytest

from rlckpt.dataplane.threads import run_blocking


def run(coro):
    return asyncio.run(coro)


async def settle() -> None:
    """Let every ready callback run (a few loop turns): a cancellation is delivered within one."""
    for _ in range(10):
        await asyncio.sleep(0)


class HeldCall:
    """A blocking call that starts, then waits until the test releases it (at the latest when the
    ``with`` block ends, so a failing test never leaves a thread blocked)."""

    def __init__(self, outcome: BaseException | None = None) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.thread: threading.Thread | None = None
        self.outcome = outcome

    def __call__(self, value: int) -> int:
        self.thread = threading.current_thread()
        self.started.set()
        self.release.wait()
        self.finished.set()
        if self.outcome is not None:
            raise self.outcome
        return value * 2

    async def wait_started(self) -> None:
        await asyncio.to_thread(self.started.wait)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()


def test_returns_the_result_of_the_call_made_in_a_worker_thread():
    async def main():
        with HeldCall() as call:
            call.release.set()
            assert await run_blocking(call, 21) == 42
            assert call.thread is not threading.main_thread()

    run(main())


def test_a_cancelled_caller_returns_only_after_the_call_has_finished():
    async def main():
        with HeldCall() as call:
            task = asyncio.create_task(run_blocking(call, 1))
            await call.wait_started()
            task.cancel()
            await settle()
            assert not task.done()  # the call is still held, so the caller has not returned
            call.release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert call.finished.is_set()

    run(main())


def test_a_caller_cancelled_again_while_it_waits_still_waits_for_the_call():
    async def main():
        with HeldCall() as call:
            task = asyncio.create_task(run_blocking(call, 1))
            await call.wait_started()
            task.cancel()
            await settle()
            task.cancel()
            await settle()
            assert not task.done()
            call.release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert call.finished.is_set()

    run(main())


def test_a_cancelled_caller_gets_cancelled_error_even_when_the_call_then_fails():
    async def main():
        with HeldCall(outcome=OSError("backend call failed after the caller was cancelled")) as call:
            task = asyncio.create_task(run_blocking(call, 1))
            await call.wait_started()
            task.cancel()
            await settle()
            call.release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert call.finished.is_set()

    run(main())


def test_an_error_of_the_call_reaches_a_caller_that_was_not_cancelled():
    async def main():
        with HeldCall(outcome=OSError("backend down")) as call:
            call.release.set()
            with pytest.raises(OSError, match="backend down"):
                await run_blocking(call, 1)

    run(main())
