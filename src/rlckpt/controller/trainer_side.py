"""TrainerSide: what the driver owns besides the controller — the trainer worker and TransferQueue.

It starts the trainer's Ray worker and the bootstrap data-plane client, which starts TransferQueue
and owns it (closing it shuts TransferQueue down). During a restore it is the sink for the
trainer state and its bootstrap client loads the snapshot; the controller actor only ever gets a
``TrainerHandle`` and a connect-only client.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rlckpt.controller.handles import TrainerHandle
from rlckpt.controller.trainer_worker import TrainerWorker
from rlckpt.dataplane.tq_client import TransferQueueClient
from rlckpt.grpo import GRPOConfig

logger = logging.getLogger(__name__)


class TrainerSide:
    """Driver side: the trainer worker and the bootstrap client that owns TransferQueue (Ray must be up)."""

    def __init__(self, config: GRPOConfig, tq_config: dict[str, Any]) -> None:
        import ray

        self.worker: Any = ray.remote(TrainerWorker).options(num_cpus=0, name=None).remote(config)  # an ActorHandle
        self.data_plane = TransferQueueClient(tq_config, bootstrap=True)
        logger.info("trainer worker and TransferQueue (bootstrap client) started")

    def load_state_bytes(self, data: bytes) -> None:
        """Load verified weights + optimizer bytes into the worker (blocking; driver only)."""
        import ray

        ray.get(self.worker.load_state_bytes.remote(data))

    def handle(self) -> TrainerHandle:
        return TrainerHandle(self.worker)

    def shutdown(self) -> None:
        """Stop the trainer worker, then TransferQueue (closing the bootstrap client stops it)."""
        import ray

        ray.kill(self.worker, no_restart=True)
        asyncio.run(self.data_plane.close())
