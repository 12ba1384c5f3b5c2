"""Data plane: where rollout rows live (TransferQueue, or an in-memory stand-in for unit tests).

``ray_cluster`` is imported first so Ray/TQ environment defaults are set before ray is imported.
``TransferQueueClient`` is imported lazily: importing this package does not import ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlckpt.dataplane import ray_cluster
from rlckpt.dataplane.base import DataPlaneClient
from rlckpt.dataplane.memory import InMemoryDataPlane, InMemoryStore
from rlckpt.dataplane.ray_cluster import LocalRayCluster, start_local_ray, stop_local_ray

if TYPE_CHECKING:
    from rlckpt.dataplane.tq_client import TransferQueueClient

__all__ = [
    "DataPlaneClient",
    "InMemoryDataPlane",
    "InMemoryStore",
    "LocalRayCluster",
    "TransferQueueClient",
    "ray_cluster",
    "start_local_ray",
    "stop_local_ray",
]


def __getattr__(name: str) -> Any:
    if name == "TransferQueueClient":
        from rlckpt.dataplane.tq_client import TransferQueueClient

        return TransferQueueClient
    raise AttributeError(f"module 'rlckpt.dataplane' has no attribute {name!r}")
