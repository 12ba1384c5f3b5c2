"""TrainConfig: every knob of the main job, in one record the CLI fills and the driver reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlckpt.checkpoint.save import UploadTiming
from rlckpt.checkpoint.stopping import DEFAULT_GRACE_S, UNMEASURED_SAVE_S
from rlckpt.controller.ranks.capacity import check_rank_resources
from rlckpt.controller.stopping import ABORT_WAIT_S
from rlckpt.dataplane.tq_client import DEFAULT_TQ_CONFIG
from rlckpt.dcp import check_policy_compression
from rlckpt.grpo import GRPOConfig
from rlckpt.store import (
    BundleStore,
    Retention,
    SigningKeyInput,
    VerifyKeyInput,
    signing_key_of,
    verify_key_of,
)
from rlckpt.tiers import ReplicationConfig

# How rollouts feed the trainer (`rlckpt train --mode`): in_order trains step k on the groups generated
# with weights k (deterministic); async lets generation run ahead with bounded staleness.
RolloutOrder = Literal["in_order", "async"]
SaveFailure = Literal["stop", "continue"]
# What each save records in its manifest (`metrics`), for retention by metric (--keep-best K --metric NAME).
RUN_METRICS = ("reward", "loss")


@dataclass
class TrainConfig:
    """The main job: a tiny GRPO run on Ray + TransferQueue with transactional bundles."""

    run_dir: str
    steps: int = 8  # train until this many steps are done (absolute, across resumes)
    save_every: int = 2
    rollout_order: RolloutOrder = "in_order"
    max_staleness: int = 1  # async: a batch is generated with weights at most this many steps old
    fresh: bool = False
    resume_step: int | None = None  # resume exactly this bundle (default: the newest that verifies)
    storage_options: dict[str, Any] | None = None
    # Retention of the run dir (the local tier) after each commit; none of them: keep all (store/upkeep/retention.py)
    keep_last: int | None = None
    keep_every: int | None = None  # keep every bundle whose step is a multiple of this, forever
    keep_best: int | None = None  # keep the K best by `metric` (one of RUN_METRICS)
    metric: str | None = None
    lower_is_better: bool = False
    # Two tiers (docs/tiers.md): replicate every `replicate_every`-th save period's bundle (and the last) to
    # this URL in the background; the remote tier keeps what its own rules keep (same metric)
    replicate_to: str | None = None
    replicate_storage_options: dict[str, Any] | None = None
    replicate_every: int = 1
    replica_keep_last: int | None = None
    replica_keep_every: int | None = None
    replica_keep_best: int | None = None
    staging_dir: str | None = None  # local staging for snapshots (default: tmpfs when available)
    save_failure: SaveFailure = "stop"
    # pinned: the window holds only the index capture; staged/inline: TransferQueue's own snapshot in it
    upload_timing: UploadTiming = "pinned"
    # True: a save blocks the train pump only for policy staging + the window; the rest runs beside training
    async_saves: bool = True
    compress_data_plane: bool | None = None  # None: zstd on object stores, plain on local disk
    # the policy's shard files in byte planes + zstd where that pays: "off" (None), "auto" (object stores), "on"
    compress_policy: str | None = None
    # files unchanged since the previous bundle (frozen weights, rows still held) taken from it, not written again
    reuse_unchanged: bool = False
    partition_id: str = "rollouts"
    num_prompts: int = 64
    task_seed: int = 0
    trainer_ranks: int = 2  # data-parallel trainer ranks (Ray actors in one gloo group, FSDP2)
    trainer_resources: dict[str, float] | None = None  # Ray custom resources each rank asks for
    rank_timeout_s: float = 180.0  # the longest the controller waits for the ranks to answer one call
    # Stopping early (docs/architecture.md, Stopping): a deadline (unix time) by which the run has saved and
    # stopped, the grace a stop has before its final save is aborted, what a save is assumed to cost
    # until the run has measured one, and how long a stop waits for what it cancelled (a save whose storage
    # does not answer) before leaving it behind
    save_by: float | None = None
    grace_s: float = DEFAULT_GRACE_S
    unmeasured_save_s: float = UNMEASURED_SAVE_S
    stop_abort_s: float = ABORT_WAIT_S
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    tq_config: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_TQ_CONFIG))
    # Signed bundles (docs/security.md): the controller signs every COMMIT with `signing_key` (given as the key
    # or its file, loaded here: the key itself travels to the controller actor, never a path, and never to a
    # trainer rank); a resume reads
    # only bundles `verify_key` signed for this run, and so does retention. `run_id` pins "this run" (with a
    # verify key): a key shared by several runs then cannot pass one run's bundles for another's.
    signing_key: SigningKeyInput | None = None
    verify_key: VerifyKeyInput | None = None
    run_id: str | None = None

    def __post_init__(self) -> None:
        self.signing_key = signing_key_of(self.signing_key)
        self.verify_key = verify_key_of(self.verify_key)
        if self.rollout_order not in ("in_order", "async"):
            raise ValueError(f"rollout_order must be 'in_order' or 'async', got {self.rollout_order!r}")
        if self.steps < 0 or self.save_every < 1:
            raise ValueError(f"steps must be >= 0 and save_every >= 1, got {self.steps}, {self.save_every}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.resume_step is not None and (self.fresh or self.resume_step < 0):
            raise ValueError(
                f"resume_step must be >= 0 and cannot go with fresh, got {self.resume_step} (fresh={self.fresh})"
            )
        if self.trainer_ranks < 1 or self.rank_timeout_s <= 0:
            raise ValueError(
                f"trainer_ranks must be >= 1 and rank_timeout_s > 0, got {self.trainer_ranks}, {self.rank_timeout_s}"
            )
        if self.upload_timing not in ("pinned", "staged", "inline"):
            raise ValueError(f"upload_timing must be 'pinned', 'staged' or 'inline', got {self.upload_timing!r}")
        if self.grace_s < 0 or self.unmeasured_save_s < 0 or self.stop_abort_s < 0:
            raise ValueError(
                f"grace_s, unmeasured_save_s and stop_abort_s must be >= 0, got {self.grace_s}, "
                f"{self.unmeasured_save_s}, {self.stop_abort_s}"
            )
        if self.save_failure not in ("stop", "continue"):
            raise ValueError(f"save_failure must be 'stop' or 'continue', got {self.save_failure!r}")
        check_policy_compression(self.compress_policy, ValueError, "compress_policy")
        if self.trainer_resources is not None:  # what Ray would refuse only once the ranks start
            self.trainer_resources = check_rank_resources(self.trainer_resources)
        if self.metric is not None and self.metric not in RUN_METRICS:
            raise ValueError(f"metric must be one the run records ({', '.join(RUN_METRICS)}), got {self.metric!r}")
        if self.metric is not None and self.keep_best is None and self.replica_keep_best is None:
            raise ValueError(f"metric {self.metric!r} is for keep_best (or replica_keep_best), and neither is given")
        _ = self.retention, self.replication  # malformed rules are refused now, not at the first save
        if self.replication is None and (self.replica_keep_last or self.replica_keep_every or self.replica_keep_best):
            raise ValueError("retention rules of the remote tier need a remote tier (replicate_to)")

    @property
    def retention(self) -> Retention:
        """The local tier's retention rules (none given: nothing is deleted)."""
        return Retention(
            keep_last=self.keep_last,
            keep_every=self.keep_every,
            keep_best=self.keep_best,
            metric=self.metric if self.keep_best is not None else None,
            lower_is_better=self.lower_is_better,
        )

    @property
    def replication(self) -> ReplicationConfig | None:
        """The remote tier, when the run has one."""
        if self.replicate_to is None:
            return None
        rules = Retention(
            keep_last=self.replica_keep_last,
            keep_every=self.replica_keep_every,
            keep_best=self.replica_keep_best,
            metric=self.metric if self.replica_keep_best is not None else None,
            lower_is_better=self.lower_is_better,
        )
        return ReplicationConfig(
            self.replicate_to,
            self.replicate_storage_options,
            every=self.replicate_every,
            retention=rules,
            verify_key=self.verify_key,
            run_id=self.run_id,
        )

    def store(self) -> BundleStore:
        """The run's store, with the run's keys: the one way the driver and the controller open it."""
        return BundleStore(
            self.run_dir,
            self.storage_options,
            signing_key=self.signing_key,
            verify_key=self.verify_key,
            run_id=self.run_id,
        )

    @property
    def max_ahead(self) -> int:
        """How many steps the rollout pump may run ahead of the trainer (0 when in_order)."""
        return 0 if self.rollout_order == "in_order" else self.max_staleness
