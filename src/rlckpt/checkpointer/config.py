"""CheckpointerConfig: the run-level settings of a Checkpointer — the ones `rlckpt train` takes: the run URL
and its storage options, retention, a remote tier, signing and verify keys — and how saves are made."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rlckpt.checkpoint.stopping import UNMEASURED_SAVE_S
from rlckpt.dcp import check_policy_compression
from rlckpt.store import (
    BundleStore,
    Retention,
    SigningKeyInput,
    VerifyKeyInput,
    signing_key_of,
    verify_key_of,
)
from rlckpt.tiers import ReplicationConfig

from .ranks import DEFAULT_GROUP_TIMEOUT_S

if TYPE_CHECKING:
    from torch.distributed.checkpoint.planner import LoadPlanner, SavePlanner

# What a save that fails in the background does at the next save (or wait): raise its error there (the
# default, as `rlckpt train --save-failure stop`), or log it and go on.
SaveFailure = Literal["raise", "log"]


@dataclass(frozen=True)
class CheckpointerConfig:
    """Where and how a Checkpointer saves.

    url: the run: a local path (NVMe) or an fsspec URL (s3://bucket/prefix); `storage_options` its fsspec
        options.
    retention: what the run's tier keeps after each commit (none given: everything). With a remote tier it
        never deletes a bundle newer than the newest one the remote tier holds as that bundle of this run.
    replication: a remote tier (docs/tiers.md): committed bundles are copied there in the background, every
        `replication.every`-th committed save and each one saved with `last=True`; the remote tier keeps what
        `replication.retention` keeps. A restore takes the newest bundle that verifies on either tier.
    signing_key: every COMMIT is signed (only rank 0 uses it). verify_key: only bundles that key signed for
        this run are read and kept; by default the signing key's public half. Each is the key or the path of
        its PEM file (`rlckpt keygen` writes both), loaded here: KeyFileError for a file that cannot be used.
    run_id: with a verify key, the run "this run" is, whatever its `_run.json` says (a key shared by several
        runs: docs/security.md).
    async_save: `save()` returns once the state is staged in host memory (True) or once it is committed.
    save_failure: a save that failed in the background raises at the next `save()`/`wait()` ("raise") or
        is only logged ("log").
    group_timeout_s: how long a collective of the Checkpointer's groups waits for a peer.
    dcp_thread_count: shard files each rank writes at once (BundleStorageWriter's `thread_count`).
    compression: the state's shard files in byte planes + zstd where that pays (lossless; BundleStorageWriter's
        `compression`): "off" (None, the default), "auto" (on object stores only) or "on".
    reuse: a file of a save whose bytes are those of the same file of the run's previous bundle is taken from it
        (a hard link on local disk, a copy inside the server on S3) rather than written again: frozen weights,
        a reference model (docs/store-protocol.md#reuse-of-unchanged-files). Each tensor chunk of 1 MiB or more is
        then a file of its own. The first save of a run writes everything.
    save_planner, load_planner: make DCP's planner of each save / restore (default: DCP's own).
    unmeasured_save_s: what a deadline (SaveAndStop) assumes a save takes until one was measured.
    """

    url: str
    storage_options: dict[str, Any] | None = None
    retention: Retention = field(default_factory=Retention)
    replication: ReplicationConfig | None = None
    signing_key: SigningKeyInput | None = None
    verify_key: VerifyKeyInput | None = None
    run_id: str | None = None
    async_save: bool = True
    save_failure: SaveFailure = "raise"
    group_timeout_s: float = DEFAULT_GROUP_TIMEOUT_S
    dcp_thread_count: int = 1
    compression: str | None = None
    reuse: bool = False
    save_planner: Callable[[], SavePlanner] | None = None
    load_planner: Callable[[], LoadPlanner] | None = None
    unmeasured_save_s: float = UNMEASURED_SAVE_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", os.fspath(self.url))
        if not self.url:
            raise ValueError("a Checkpointer needs the run's URL (a local path or s3://bucket/prefix)")
        signing_key, verify_key = signing_key_of(self.signing_key), verify_key_of(self.verify_key)
        if verify_key is None and signing_key is not None:
            verify_key = signing_key.public
        object.__setattr__(self, "signing_key", signing_key)
        object.__setattr__(self, "verify_key", verify_key)
        if self.replication is not None and self.replication.verify_key is None and self.verify_key is not None:
            object.__setattr__(self, "replication", dataclasses.replace(self.replication, verify_key=self.verify_key))
        if self.replication is not None and self.replication.verify_key != self.verify_key:
            raise ValueError("the remote tier reads with the run's verify key: give ReplicationConfig it, or none")
        if self.replication is not None and self.replication.run_id is None and self.run_id is not None:
            object.__setattr__(self, "replication", dataclasses.replace(self.replication, run_id=self.run_id))
        if self.replication is not None and self.replication.run_id != self.run_id:
            raise ValueError("the remote tier is read for the run's pinned run id: give ReplicationConfig it, or none")
        if self.save_failure not in ("raise", "log"):
            raise ValueError(f"save_failure must be 'raise' or 'log', got {self.save_failure!r}")
        if not (math.isfinite(self.group_timeout_s) and self.group_timeout_s > 0):
            raise ValueError(f"group_timeout_s must be a number of seconds > 0, got {self.group_timeout_s!r}")
        if self.dcp_thread_count < 1:
            raise ValueError(f"dcp_thread_count must be >= 1, got {self.dcp_thread_count}")
        check_policy_compression(self.compression, ValueError)
        if self.retention.holds:
            raise ValueError("retention holds are the Checkpointer's own (a remote tier's); give rules only")

    def store(self) -> BundleStore:
        """The run's store (the local tier with a remote one), with the run's keys."""
        return BundleStore(
            self.url,
            self.storage_options,
            signing_key=self.signing_key,
            verify_key=self.verify_key,
            run_id=self.run_id,
        )

    def tiers(self) -> list[BundleStore]:
        """The stores a restore looks at, in order of preference: the run's, then the remote tier's."""
        local = self.store()
        return [local] if self.replication is None else [local, self.replication.remote_store()]
