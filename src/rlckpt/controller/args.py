"""ControllerArgs: everything the controller loop is assembled from, built before it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlckpt.checkpoint.restore import RestoredRun
from rlckpt.checkpoint.row_copy import RowCopier
from rlckpt.checkpoint.save import SaveHook
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.connect import ReplayBufferSpec
from rlckpt.controller.handles import Generator, Trainer
from rlckpt.controller.loop import GenerateHook
from rlckpt.controller.loop_state import LoopState
from rlckpt.grpo import DigitSumTask, PromptLoader
from rlckpt.tiers import Replicator


@dataclass
class RestoredIndex:
    """The saved index and what the data-plane snapshot restored with it says about it."""

    step: int
    index_digest: str
    group_count: int
    replay_state: dict[str, Any]

    @classmethod
    def from_run(cls, restored: RestoredRun) -> RestoredIndex:
        return cls(restored.step, restored.index_digest, restored.group_count, restored.replay_state)


@dataclass
class ControllerArgs:
    """Built on the driver (or by the in-process harness); holds no live connection, so it can
    travel to the controller actor. The data plane and the store are connected where the loop runs."""

    config: TrainConfig
    task: DigitSumTask
    loader: PromptLoader  # position already restored
    loop_state: LoopState
    trainer: Trainer
    generator: Generator
    replay: ReplayBufferSpec  # built only once the restore phase was ready
    restored: RestoredIndex | None = None
    before_commit: SaveHook | None = None  # must be picklable to reach the actor
    row_copier: RowCopier | None = None  # pinned saves: copies the captured rows (a Ray actor's handle)
    before_generate: GenerateHook | None = None  # must be picklable to reach the actor
    replicator: Replicator | None = None  # two tiers: copies committed bundles to the remote (a Ray actor's handle)
