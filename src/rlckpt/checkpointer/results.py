"""What a Checkpointer's save and restore hand back: plain records, the same on every rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlckpt.checkpoint.choice import SkippedBundle


@dataclass(frozen=True)
class SaveResult:
    """A committed save, the same on every rank: its step and where, what COMMIT names, its size, and how long
    the caller was blocked (staging) and the whole save took (begin to COMMIT), in seconds."""

    step: int
    url: str
    manifest_digest: str
    bytes_written: int
    files: int
    world_size: int
    foreground_s: float
    total_s: float


@dataclass(frozen=True)
class Restored:
    """What a restore loaded (the state dict passed in holds the tensors): the step, from which tier and why
    that one, the newer bundles skipped (they did not verify), the pieces and what the save recorded.

    rank_extra: this rank's own pieces when the bundle was saved at this world size ({} when it saved none),
        else None: a rank of another world size has no pieces of its own there (`saved_world_size` says how
        many ranks saved it).
    """

    step: int
    url: str
    why: str
    skipped: list[SkippedBundle]
    extra: dict[str, Any]
    rank_extra: dict[str, Any] | None
    metrics: dict[str, float]
    metadata: Any
    saved_world_size: int
    seconds: float
