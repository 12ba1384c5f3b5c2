"""SingleControllerActorArgs: everything the controller actor needs, built on the driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlckpt.controller.config import TrainConfig
from rlckpt.controller.connect import ConnectOnlyDataPlane, ReplayBufferSpec
from rlckpt.controller.handles import GeneratorHandle, TrainerHandle
from rlckpt.controller.loop import LoopState
from rlckpt.grpo import DigitSumTask, PromptLoader


@dataclass
class RestoredIndex:
    """The data-plane checkpoint metadata read back during restore, plus the saved index itself."""

    step: int
    index_digest: str
    group_count: int
    replay_state: dict[str, Any]


@dataclass
class SingleControllerActorArgs:
    """The actor's __init__ stores this and constructs nothing; run() only connects the specs
    (the data plane, and the store named by ``config.run_dir``: neither survives pickling)."""

    config: TrainConfig
    task: DigitSumTask
    loader: PromptLoader  # position already restored
    loop_state: LoopState
    trainer: TrainerHandle
    generator: GeneratorHandle
    data_plane: ConnectOnlyDataPlane
    replay: ReplayBufferSpec
    restored: RestoredIndex | None = None
