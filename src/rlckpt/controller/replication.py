"""The replication worker of a two-tier run (docs/tiers.md): a Ray actor of its own that runs
tiers.BundleReplicator, so copying a bundle to the remote tier, and reading what it holds, never runs on
the controller actor's event loop, which pumps training and rollouts. The controller's ReplicationQueue
awaits it."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from rlckpt.controller.config import TrainConfig
from rlckpt.tiers import BundleReplicator, ReplicaState, ReplicationReport

T = TypeVar("T")


class RayReplicator:
    """tiers.Replicator over a BundleReplicator Ray actor (picklable: the actor handle travels)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def replicate(self, step: int) -> ReplicationReport:
        report: ReplicationReport = await _unwrapped(self.actor.replicate.remote(step))
        return report

    async def survey(self) -> ReplicaState:
        state: ReplicaState = await _unwrapped(self.actor.survey.remote())
        return state


async def _unwrapped(call: Awaitable[T]) -> T:
    """The actor call's result; what the actor raised is raised as itself, not as Ray's RayTaskError (whose
    text is the whole remote traceback, with the terminal's colour codes)."""
    import ray.exceptions

    try:
        return await call
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise


def start_ray_replicator(config: TrainConfig) -> RayReplicator | None:
    """The run's replication actor on this node (it reads the local tier, which the driver's node sees), or
    None when the run has one tier."""
    replication = config.replication
    if replication is None:
        return None
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    actor: Any = (
        ray.remote(BundleReplicator)
        .options(num_cpus=0, max_restarts=0, scheduling_strategy=strategy)
        .remote(config.run_dir, config.storage_options, replication)
    )
    return RayReplicator(actor)
