"""TrainerSide: what the driver owns besides the controller — the trainer group and TransferQueue.

It starts the trainer ranks (``TrainerGroup``: N Ray actors in one gloo group) and the bootstrap
data-plane client, which starts TransferQueue and owns it (closing it shuts TransferQueue down).
During a restore the ranks load the policy themselves and the bootstrap client loads the snapshot;
the controller actor only ever gets a ``TrainerGroupHandle`` and a connect-only client.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rlckpt.checkpoint.restore import PolicyLocation
from rlckpt.controller.ranks.trainer_group import TrainerGroup, TrainerGroupHandle
from rlckpt.controller.ranks.trainer_rank import SavePlannerFactory
from rlckpt.dataplane.tq_client import TransferQueueClient
from rlckpt.grpo import GRPOConfig

logger = logging.getLogger(__name__)


class TrainerSide:
    """Driver side: the trainer ranks and the bootstrap client that owns TransferQueue (Ray must be up)."""

    def __init__(
        self,
        config: GRPOConfig,
        tq_config: dict[str, Any],
        *,
        ranks: int,
        resources: dict[str, float] | None = None,
        timeout_s: float,
        save_planner: SavePlannerFactory | None = None,
        compression: str | None = None,
        reuse: bool = False,
    ) -> None:
        self.group = TrainerGroup(
            config,
            ranks=ranks,
            resources=resources,
            timeout_s=timeout_s,
            save_planner=save_planner,
            form=False,
            compression=compression,
            reuse=reuse,
        )
        try:  # TransferQueue starts while the rank processes boot (importing torch); then the group forms
            self.data_plane = TransferQueueClient(tq_config, bootstrap=True)
        except BaseException:
            self.group.shutdown()
            raise
        try:
            self.group.form()
        except BaseException:
            asyncio.run(self.data_plane.close())
            raise
        logger.info("%d trainer ranks and TransferQueue (bootstrap client) started", ranks)

    async def load_policy(self, location: PolicyLocation) -> None:
        """Restore step 3: every trainer rank loads its shards of the verified bundle."""
        await self.group.load_policy(location)

    def handle(self) -> TrainerGroupHandle:
        return self.group.handle

    def shutdown(self) -> None:
        """Stop the trainer ranks, then TransferQueue (closing the bootstrap client stops it)."""
        self.group.shutdown()
        asyncio.run(self.data_plane.close())
