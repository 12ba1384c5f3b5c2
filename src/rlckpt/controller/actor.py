"""SingleControllerActor: one Ray actor, one asyncio loop running the rollout and train pumps.

``run()`` connects the data plane where it runs and hands it to ``assemble_controller``, which
loads and checks the restored index before the pumps start. ``request_stop`` (the driver's first
SIGTERM) asks the run to save and stop; ``stop`` (Ctrl-C, a second SIGTERM) cancels it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Any

from rlckpt.controller.args import ControllerArgs
from rlckpt.controller.assemble import assemble_controller
from rlckpt.controller.connect import DataPlaneSpec
from rlckpt.controller.loop import ControllerLoop
from rlckpt.controller.stopping import StopRequest


class SingleControllerActor:
    """Wrapped with ``ray.remote`` by controller.setup; async methods make it an async actor.

    ``__init__`` stores its arguments and constructs nothing: the data plane (process-local
    sockets) and the store (locks) are connected in ``run()``, in the actor's own process.
    """

    def __init__(self, args: ControllerArgs, data_plane: DataPlaneSpec) -> None:
        self.args = args
        self.data_plane = data_plane
        self._events: list[dict[str, Any]] = []
        self._running: asyncio.Task[Any] | None = None
        self._loop: ControllerLoop | None = None
        self._stop: tuple[StopRequest, float] | None = None  # a request that came before the loop existed

    async def run(self) -> dict[str, Any]:
        """Run the job to ``config.steps`` and return the RunSummary as a dict."""
        config = self.args.config
        data_plane = self.data_plane.connect()
        try:
            loop = await assemble_controller(
                self.args,
                store=config.store(),
                data_plane=data_plane,
                on_event=self._events.append,
            )
            self._running = asyncio.current_task()
            self._loop = loop
            if self._stop is not None:
                request, received = self._stop
                loop.request_stop(request.later(time.monotonic() - received))
            summary = await loop.run()
        finally:
            await data_plane.close()  # connect-only: drops the client, never stops TransferQueue
        return asdict(summary)

    async def request_stop(self, request: StopRequest) -> None:
        """Save and stop at the next safe point (the driver's first SIGTERM); the grace starts now,
        even when the loop is still being assembled."""
        if self._loop is not None:
            self._loop.request_stop(request)
        elif self._stop is None:
            self._stop = (request, time.monotonic())

    async def stop(self) -> dict[str, int | None]:
        """Cancel the run (the driver's second SIGTERM, Ctrl-C): a save in flight is aborted, nothing of it
        committed (the run's end waits ``stop_abort_s`` at most for it). Returns what the run leaves, as
        ``StopOutcome``'s fields: the step reached and the newest committed step."""
        task, self._running = self._running, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        loop = self._loop
        if loop is None:  # stopped before the loop ran: at the step it started from (restored, or 0)
            start = self.args.loop_state.step
            return {"step": start, "last_committed_step": start if start > 0 else None}
        return {"step": loop.state.step, "last_committed_step": loop.committed_step}

    def drain_events(self) -> list[dict[str, Any]]:
        """Progress events since the last call (the driver polls this)."""
        events = list(self._events)
        self._events.clear()  # the loop holds a bound append of this very list
        return events
