"""rlckpt for trainers it does not own: a Checkpointer per rank (torchrun, Ray actors) with the run-level
guarantees of `rlckpt train` — one transaction per save across every rank, async saves, extra pieces without
pickle, two tiers, signing, retention, restore of the newest bundle that verifies at any world size — and
SaveAndStop, the SIGTERM / deadline helper a training loop polls. See docs/trainer.md. What the Checkpointer's
settings name (Retention, ReplicationConfig, SigningKey, VerifyKey) is importable from here too.

Sits between rlckpt.checkpoint (the procedures and the restore choice) and the trainers; imports torch.
"""

from rlckpt.checkpoint.retention import retain_after_commit
from rlckpt.store import Retention, SigningKey, VerifyKey
from rlckpt.tiers import ReplicationConfig

from .checkpointer import Checkpointer
from .config import CheckpointerConfig
from .pieces import decode_piece, encode_piece
from .record import CHECKPOINTER_BUNDLE_FORMAT
from .results import Restored, SaveResult
from .stop import SaveAndStop
from .tiers import BackgroundReplication

__all__ = [
    "CHECKPOINTER_BUNDLE_FORMAT",
    "BackgroundReplication",
    "Checkpointer",
    "CheckpointerConfig",
    "ReplicationConfig",
    "Restored",
    "Retention",
    "SaveAndStop",
    "SaveResult",
    "SigningKey",
    "VerifyKey",
    "decode_piece",
    "encode_piece",
    "retain_after_commit",
]
