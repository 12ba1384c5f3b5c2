"""assemble_controller: the one place the controller loop is put together.

The controller actor (production) and the in-process harness (tests) both call it, so the
restored index is checked the same way in both: it is loaded without writing to the data plane,
then its digest, partition, group size and group count must match the snapshot the data plane
was restored from, and its sample ids the rows the data plane holds. Only then may the pumps
start (docs/architecture.md, restore step 5).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from rlckpt.controller.args import ControllerArgs, RestoredIndex
from rlckpt.controller.loop import ControllerLoop
from rlckpt.dataplane.base import DataPlaneClient
from rlckpt.errors import ReplayStateError
from rlckpt.replay import ReplayBuffer
from rlckpt.store import BundleStore

logger = logging.getLogger(__name__)


async def assemble_controller(
    args: ControllerArgs,
    *,
    store: BundleStore,
    data_plane: DataPlaneClient,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    clock: Callable[[], float] = time.time,
) -> ControllerLoop:
    """Build the replay buffer over ``data_plane``, load and check the restored index, return the loop
    (``clock``: the wall clock its deadline is planned on).

    Raises:
        ReplayStateError: the index's digest, partition, group size or group count disagrees
            with the restored snapshot.
        InventoryMismatchError: the data plane does not hold exactly the rows the index names.
    """
    replay = args.replay.build(data_plane)
    if args.restored is not None:
        await load_restored_index(replay, args.restored)
    return ControllerLoop(
        args.config,
        task=args.task,
        loader=args.loader,
        trainer=args.trainer,
        generator=args.generator,
        replay=replay,
        store=store,
        state=args.loop_state,
        resumed_from=args.restored.step if args.restored else None,
        on_event=on_event,
        before_commit=args.before_commit,
        row_copier=args.row_copier,
        before_generate=args.before_generate,
        clock=clock,
        replicator=args.replicator,
    )


async def load_restored_index(replay: ReplayBuffer, restored: RestoredIndex) -> None:
    """Load the saved index into the empty ``replay`` and check it against the restored snapshot."""
    replay.load_state_dict(restored.replay_state, expected_digest=restored.index_digest)
    if len(replay) != restored.group_count:
        raise ReplayStateError(
            f"step {restored.step}: index holds {len(replay)} groups, the data-plane snapshot says "
            f"{restored.group_count}"
        )
    stored = await replay.data_plane.list_sample_ids(replay.partition_id)
    replay.validate_inventory(stored)
    logger.info("index of step %d loaded: %d groups match the data plane", restored.step, len(replay))
