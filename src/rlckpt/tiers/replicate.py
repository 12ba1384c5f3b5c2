"""BundleReplicator: one replication — a committed bundle of the local tier copied into the remote tier as
the same bundle (store.copy_bundle), then the remote tier's retention, then what the remote tier now holds
of the local tier's bundles (holds.ReplicaState: what local retention may delete). Synchronous and
self-contained (it opens its own stores from URLs), so it runs wherever it is put: a thread
(ThreadReplicator, queue.py) or the controller's replication actor, never on the event loop that pumps
training and rollouts — every call to the remote tier is made here."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from rlckpt.store import BundleStore, CopyReport, copy_bundle

from .config import ReplicationConfig
from .holds import ReplicaState, replica_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicationReport:
    """What one replication did: the copy, the bundles the remote tier's retention deleted after it, and what
    the remote tier holds after both (None: it could not be read)."""

    step: int
    copy: CopyReport
    remote_deleted: list[int] = field(default_factory=list)
    state: ReplicaState | None = None


class BundleReplicator:
    """Replicates committed bundles of the run at `local_url` into the remote tier `config`."""

    def __init__(self, local_url: str, local_options: dict[str, Any] | None, config: ReplicationConfig) -> None:
        self.local_url = local_url
        self.local_options = local_options
        self.config = config
        self._local: BundleStore | None = None
        self._remote: BundleStore | None = None
        self._opening = threading.Lock()  # a read of the remote tier may run beside a copy, in another thread

    def stores(self) -> tuple[BundleStore, BundleStore]:
        """(local, remote), opened on first use in the process that replicates (a store holds locks and
        connections, which do not travel)."""
        with self._opening:
            if self._local is None or self._remote is None:
                self._local = BundleStore(
                    self.local_url, self.local_options, verify_key=self.config.verify_key, run_id=self.config.run_id
                )
                self._remote = self.config.remote_store()
            return self._local, self._remote

    def replicate(self, step: int) -> ReplicationReport:
        """Copy committed bundle `step` into the remote tier; then the remote tier's retention, whose failure
        is logged (the replica is committed). Raises what `copy_bundle` raises: nothing is committed then."""
        local, remote = self.stores()
        # unchanged files are taken from the remote's previous bundle there, not sent again (copy_bundle's `reuse`)
        report = copy_bundle(local, step, remote, max_workers=self.config.workers, reuse=True)
        deleted: list[int] = []
        if self.config.retention.deletes:
            try:
                deleted = remote.gc(retention=self.config.retention, max_workers=self.config.workers).deleted_steps
            except Exception:
                log.warning(
                    "retention of the remote tier %s failed; step %d is replicated", remote.url, step, exc_info=True
                )
        try:
            state = self.survey()
        except Exception:
            log.warning("what %s holds could not be read; step %d is replicated", remote.url, step, exc_info=True)
            state = None
        return ReplicationReport(step, report, deleted, state)

    def survey(self) -> ReplicaState:
        """What the remote tier holds of the local tier's bundles, read from both (holds.replica_state; the
        copies under way are this process's own, which its queue knows).

        Raises:
            StoreUnavailableError: either tier cannot be reached.
        """
        local, remote = self.stores()
        return replica_state(local, remote, copies=False)
