"""rlckpt: transactional checkpoints for RL post-training runs with a streaming data plane.

`from rlckpt import Checkpointer` is the entry point for a trainer rlckpt does not own (docs/trainer.md), with
everything its settings and results name: CheckpointerConfig, SaveAndStop, Retention, ReplicationConfig,
SigningKey, VerifyKey, SaveResult, Restored; `export_safetensors` and `load_state` take a bundle's policy out
(docs/export.md). Each is imported on first use: `import rlckpt` stays free of
torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from rlckpt.checkpointer import Checkpointer, CheckpointerConfig, Restored, SaveAndStop, SaveResult
    from rlckpt.export import export_safetensors, load_state
    from rlckpt.store import Retention, SigningKey, VerifyKey
    from rlckpt.tiers import ReplicationConfig

# name -> the module it comes from (imported when the name is first asked for)
_LAZY = {
    "Checkpointer": "rlckpt.checkpointer",
    "CheckpointerConfig": "rlckpt.checkpointer",
    "Restored": "rlckpt.checkpointer",
    "SaveAndStop": "rlckpt.checkpointer",
    "SaveResult": "rlckpt.checkpointer",
    "Retention": "rlckpt.store",
    "SigningKey": "rlckpt.store",
    "VerifyKey": "rlckpt.store",
    "ReplicationConfig": "rlckpt.tiers",
    "export_safetensors": "rlckpt.export",
    "load_state": "rlckpt.export",
}

__all__ = [
    "Checkpointer",
    "CheckpointerConfig",
    "ReplicationConfig",
    "Restored",
    "Retention",
    "SaveAndStop",
    "SaveResult",
    "SigningKey",
    "VerifyKey",
    "__version__",
    "export_safetensors",
    "load_state",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rlckpt' has no attribute {name!r}")
