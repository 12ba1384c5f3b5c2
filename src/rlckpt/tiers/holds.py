"""What the local tier's retention must keep while replication is on (docs/tiers.md, Retention): every bundle
the remote tier does not hold yet, read from the remote store itself — a listing — never from a note of
the run's own, which a crash, a second run or a failed replication would make lie."""

from __future__ import annotations

from collections.abc import Iterable

from rlckpt.errors import CorruptBundleError, NewerFormatError, UncommittedBundleError
from rlckpt.store import BundleStore


def replication_holds(local: BundleStore, remote: BundleStore, pending: Iterable[int] = ()) -> dict[int, str]:
    """Local step -> why retention keeps it: newer than the newest bundle the remote tier holds (not yet
    replicated: a bundle older than that one was superseded by it), being copied there now (a live remote
    transaction under its txid; a dead one's is not), or `pending` (what this process is replicating or has queued).

    Raises:
        StoreUnavailableError: either tier cannot be reached (then nothing can be known to be replicated).
    """
    newest = remote.latest()
    holds = {step: f"queued for replication to {remote.url}" for step in pending}
    for step in local.steps():
        if newest is None or step > newest:
            held = "none" if newest is None else f"up to step {newest}"
            holds.setdefault(step, f"not yet replicated to {remote.url} (it holds {held})")
    for step, intent in remote.intents().items():
        if step in holds or intent.txid is None or remote.claims.stale_reason(intent) is not None:
            continue  # a copy whose process is gone is no longer under way (the remote tier's gc removes it)
        try:
            mine = local.records(step).manifest.txid
        except (UncommittedBundleError, CorruptBundleError, NewerFormatError):  # no bundle of ours to copy
            continue
        if intent.txid == mine:
            holds[step] = f"being replicated to {remote.url}"
    return holds
