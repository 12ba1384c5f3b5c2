"""SingleControllerActor: one Ray actor, one asyncio loop running the rollout and train pumps.

``run()`` connects the data plane, loads the restored index (no writes to TransferQueue), checks
``list_sample_ids()`` against it, and only then starts the pumps (ControllerLoop).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from rlckpt.controller.args import SingleControllerActorArgs
from rlckpt.controller.loop import ControllerLoop
from rlckpt.errors import ReplayStateError
from rlckpt.replay import ReplayBuffer
from rlckpt.store import BundleStore

logger = logging.getLogger(__name__)


class SingleControllerActor:
    """Wrapped with ``ray.remote`` by controller.setup; async methods make it an async actor."""

    def __init__(self, args: SingleControllerActorArgs) -> None:
        self.args = args
        self._events: list[dict[str, Any]] = []

    async def run(self) -> dict[str, Any]:
        """Run the job to ``config.steps`` and return the RunSummary as a dict."""
        args = self.args
        data_plane = args.data_plane.connect()
        try:
            replay = args.replay.build(data_plane)
            if args.restored is not None:
                await self._load_index(replay)
            loop = ControllerLoop(
                args.config,
                task=args.task,
                loader=args.loader,
                trainer=args.trainer,
                generator=args.generator,
                replay=replay,
                store=BundleStore(args.config.run_dir, args.config.storage_options),
                state=args.loop_state,
                resumed_from=args.restored.step if args.restored else None,
                on_event=self._events.append,
            )
            summary = await loop.run()
        finally:
            await data_plane.close()  # connect-only: drops the client, never stops TransferQueue
        return asdict(summary)

    async def _load_index(self, replay: ReplayBuffer) -> None:
        restored = self.args.restored
        assert restored is not None
        replay.load_state_dict(restored.replay_state, expected_digest=restored.index_digest)
        if len(replay) != restored.group_count:
            raise ReplayStateError(
                f"step {restored.step}: index holds {len(replay)} groups, the data-plane snapshot says "
                f"{restored.group_count}"
            )
        stored = await replay.data_plane.list_sample_ids(replay.partition_id)
        replay.validate_inventory(stored)
        logger.info("index of step %d loaded: %d groups match the data plane", restored.step, len(replay))

    def drain_events(self) -> list[dict[str, Any]]:
        """Progress events since the last call (the driver polls this)."""
        events = list(self._events)
        self._events.clear()  # the loop holds a bound append of this very list
        return events
