"""Replay layer: the group index over the data plane and the checkpoint barrier (no tensors here)."""

from rlckpt.replay.barrier import BarrierStats, DataPlaneCheckpointBarrier
from rlckpt.replay.buffer import ReplayBuffer, group_id_for
from rlckpt.replay.records import (
    REPLAY_INDEX_FORMAT,
    GroupRecord,
    IndexCapture,
    groups_digest,
    sample_id,
)

__all__ = [
    "REPLAY_INDEX_FORMAT",
    "BarrierStats",
    "DataPlaneCheckpointBarrier",
    "GroupRecord",
    "IndexCapture",
    "ReplayBuffer",
    "group_id_for",
    "groups_digest",
    "sample_id",
]
