"""rlckpt: transactional checkpoints for RL post-training runs with a streaming data plane.

`from rlckpt import Checkpointer` (and CheckpointerConfig, SaveAndStop) is the entry point for a trainer
rlckpt does not own (docs/trainer.md). It is imported on first use: `import rlckpt` stays free of torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from rlckpt.checkpointer import Checkpointer, CheckpointerConfig, SaveAndStop

__all__ = ["Checkpointer", "CheckpointerConfig", "SaveAndStop", "__version__"]

_LAZY = ("Checkpointer", "CheckpointerConfig", "SaveAndStop")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from rlckpt import checkpointer

        return getattr(checkpointer, name)
    raise AttributeError(f"module 'rlckpt' has no attribute {name!r}")
