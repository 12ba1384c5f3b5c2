"""ReplicationConfig: the remote tier of a two-tier run (docs/tiers.md) — where committed bundles are
replicated, which of them, and what the remote tier keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlckpt.store import BundleStore, Retention, VerifyKeyInput, verify_key_of

DEFAULT_COPY_WORKERS = 4  # files copied at once: a replication shares the machine with training and rollouts


@dataclass(frozen=True)
class ReplicationConfig:
    """Replicate at most every `every`-th save of the run (steps that are multiples of `every` x the save
    period, and the run's last save) from the local tier to `url`, keeping there what `retention` keeps.
    "At most": one replication runs at a time, and a due step still waiting when a newer one is due is
    skipped for the newer one (the remote tier wants the newest state); `rlckpt ls --replicated-to`
    names each step so skipped."""

    url: str
    storage_options: dict[str, Any] | None = None
    every: int = 1
    retention: Retention = field(default_factory=Retention)
    workers: int = DEFAULT_COPY_WORKERS
    verify_key: VerifyKeyInput | None = None  # the run's (or its file): both tiers read only its bundles
    run_id: str | None = None  # the run's pin, if it has one (BundleStore's `run_id`)

    def remote_store(self) -> BundleStore:
        """The remote tier's store, with the run's verify key (a replica carries its signatures, never makes
        one: the remote tier needs no signing key)."""
        return BundleStore(self.url, self.storage_options, verify_key=self.verify_key, run_id=self.run_id)

    def __post_init__(self) -> None:
        object.__setattr__(self, "verify_key", verify_key_of(self.verify_key, "ReplicationConfig's verify_key"))
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"replicate every must be an int >= 1, got {self.every!r}")
        if self.retention.holds:
            raise ValueError("the remote tier's retention takes no holds: nothing replicates from it")
        if self.workers < 1:
            raise ValueError(f"copy workers must be >= 1, got {self.workers}")

    def due(self, step: int, save_every: int, last: bool = False) -> bool:
        """Whether the committed save of `step` is replicated: every `every`-th save period, and the last."""
        return last or step % (self.every * save_every) == 0
