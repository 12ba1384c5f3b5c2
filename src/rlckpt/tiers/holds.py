"""What the local tier's retention must keep while replication is on (docs/tiers.md, Retention).

A local bundle counts as replicated only when the remote tier holds *that bundle of this run*: a committed
bundle of the same step whose COMMIT names the same run and the same manifest digest. Another run's bundle,
or another bundle of the step, proves nothing. Retention keeps every local bundle newer than the newest one
replicated so (the remote tier does not hold the run's newest state yet), and whatever is being copied
there; an older local bundle was superseded by that replicated newer state of the run, and the retention
rules decide on it as on any bundle.

What the remote tier holds is read from the stores themselves, never from a note of the run's own, which a
crash, a second run or a failed replication would make lie. In a run the read is the replication worker's
(`ReplicaState`, kept by the ReplicationQueue): a save's retention uses the last answer and never waits on
the remote tier; before any answer it keeps everything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rlckpt.errors import CorruptBundleError, NewerFormatError, UncommittedBundleError
from rlckpt.store import BundleStore, CommitRecords


@dataclass(frozen=True)
class ReplicaState:
    """What the remote tier was found to hold of the local tier's bundles: the newest local step it holds as
    the same bundle of this run (None: none), and the local steps being copied there now (a live remote
    transaction under their txid)."""

    newest: int | None
    copying: frozenset[int] = field(default_factory=frozenset)


def same_bundle(mine: CommitRecords, theirs: CommitRecords) -> bool:
    """Whether two committed bundles are one: their COMMITs name the same run and the same manifest digest
    (which covers every file's digest and the txid). A replica carries its source's COMMIT verbatim."""
    return mine.commit.run == theirs.commit.run and mine.commit.manifest == theirs.commit.manifest


def newest_replica(local: BundleStore, remote: BundleStore) -> int | None:
    """The newest committed local step the remote tier holds as the same bundle of this run, or None: the
    local steps from the newest down, each looked up on the remote tier until one is the same bundle.

    Raises:
        StoreUnavailableError: either tier cannot be reached.
    """
    for step in sorted(local.steps(), reverse=True):
        try:
            theirs = remote.records(step)
            mine = local.records(step)
        except (UncommittedBundleError, CorruptBundleError, NewerFormatError):
            continue  # not a bundle there (or no longer here): not this one
        if same_bundle(mine, theirs):
            return step
    return None


def being_copied(local: BundleStore, remote: BundleStore) -> frozenset[int]:
    """Local steps a live remote transaction is copying now (under the local bundle's txid); a copy whose
    process is gone is no longer under way (the remote tier's gc removes it)."""
    copying = set()
    for step, intent in remote.intents().items():
        if intent.txid is None or remote.claims.stale_reason(intent) is not None:
            continue
        try:
            mine = local.records(step).manifest.txid
        except (UncommittedBundleError, CorruptBundleError, NewerFormatError):  # no bundle of ours to copy
            continue
        if intent.txid == mine:
            copying.add(step)
    return frozenset(copying)


def replica_state(local: BundleStore, remote: BundleStore, *, copies: bool = True) -> ReplicaState:
    """Read what the remote tier holds of the local tier's bundles (and, with `copies`, what is being copied
    there: a listing of its intents more).

    Raises:
        StoreUnavailableError: either tier cannot be reached (then nothing can be known to be replicated).
    """
    return ReplicaState(newest_replica(local, remote), being_copied(local, remote) if copies else frozenset())


def holds_for(
    local_steps: Iterable[int], state: ReplicaState | None, remote_url: str, pending: Iterable[int] = ()
) -> dict[int, str]:
    """Local step -> why retention keeps it: newer than the newest bundle of this run the remote tier holds
    (not yet replicated), being copied there now, or `pending` (in flight or queued in this process). With
    `state` None (not read yet, or the remote tier could not be read) every local step is kept."""
    holds = {step: f"queued for replication to {remote_url}" for step in pending}
    for step in local_steps:
        if state is None:
            holds.setdefault(step, f"not known to be replicated to {remote_url} (it has not been read yet)")
        elif state.newest is None or step > state.newest:
            held = "no bundle of this run" if state.newest is None else f"this run's bundle of step {state.newest}"
            holds.setdefault(step, f"not yet replicated to {remote_url} (the newest it holds: {held})")
        elif step in state.copying:
            holds.setdefault(step, f"being replicated to {remote_url}")
    return holds


def replication_holds(local: BundleStore, remote: BundleStore, pending: Iterable[int] = ()) -> dict[int, str]:
    """What local retention keeps (holds_for), read from both tiers now (`rlckpt gc --replicated-to`).

    Raises:
        StoreUnavailableError: either tier cannot be reached (then nothing can be known to be replicated).
    """
    return holds_for(local.steps(), replica_state(local, remote), remote.url, pending)
