"""The objects that share the data plane, buildable only once the restore phase is ready.

A TransferQueue client holds process-local sockets, so what crosses from the driver to the
controller actor is a *spec* that connects where it lands. Building the spec is the moment the
order is asserted: ``connect_only_data_plane`` and ``replay_buffer_spec`` raise RestoreOrderError
while the bootstrap client has not finished restoring TransferQueue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.dataplane.base import DataPlaneClient
from rlckpt.dataplane.tq_client import TransferQueueClient
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer


class DataPlaneSpec(Protocol):
    """What crosses to the process that uses the data plane: it connects there."""

    def connect(self) -> DataPlaneClient: ...


@dataclass(frozen=True)
class ConnectOnlyDataPlane:
    """A connect-only TransferQueue client, to be connected in the process that uses it."""

    tq_config: dict[str, Any] = field(default_factory=dict)

    def connect(self) -> DataPlaneClient:
        """Connect to the running TransferQueue; never owns or shuts it down."""
        return TransferQueueClient(self.tq_config, bootstrap=False)


@dataclass(frozen=True)
class ReplayBufferSpec:
    """How to build the controller's replay buffer over a connected data plane."""

    partition_id: str
    group_size: int

    def build(self, data_plane: DataPlaneClient) -> ReplayBuffer:
        return ReplayBuffer(
            data_plane, DataPlaneCheckpointBarrier(), partition_id=self.partition_id, group_size=self.group_size
        )


def connect_only_data_plane(phase: RestorePhase, tq_config: dict[str, Any]) -> ConnectOnlyDataPlane:
    """The connect-only client; raises RestoreOrderError before the restore step has finished."""
    phase.require_ready("the connect-only data-plane client")
    return ConnectOnlyDataPlane(dict(tq_config))


def replay_buffer_spec(phase: RestorePhase, *, partition_id: str, group_size: int) -> ReplayBufferSpec:
    """The replay buffer; raises RestoreOrderError before the restore step has finished."""
    phase.require_ready("the replay buffer")
    return ReplayBufferSpec(partition_id, group_size)
