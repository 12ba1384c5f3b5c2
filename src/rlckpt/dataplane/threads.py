"""Run a blocking call off the event loop without letting it outlive its awaiting caller."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def run_blocking(fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
    """Await ``fn(*args, **kwargs)`` in a worker thread.

    A thread cannot be stopped, so if the caller is cancelled this still waits for the call to
    finish before re-raising CancelledError. That keeps "the caller returned" meaning "the
    backend call is over", which the checkpoint barrier relies on (a cancelled put must not
    land in the middle of a snapshot).
    """
    task = asyncio.ensure_future(asyncio.to_thread(functools.partial(fn, *args, **kwargs)))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                continue
            except BaseException:  # the call's own outcome no longer matters: we were cancelled
                break
        if not task.cancelled():
            task.exception()  # mark retrieved so asyncio does not log it
        raise
