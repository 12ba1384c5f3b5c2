"""Retention after a commit, for every writer of a run: `rlckpt train`'s save (checkpoint/save.py) and the
Checkpointer's (rlckpt.checkpointer), one function with one set of holds.

The rules (store.Retention) decide which committed bundles go; the holds say which must stay whatever the rules
say — a two-tier run's bundles the remote tier does not hold yet, as the replication queue last read it
(``tiers.ReplicationQueue.holds``: never a call to the remote tier, so no retention waits on it). Retention
never un-commits the save it follows: a failure is logged, not raised.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

from rlckpt.store import BundleStore, Retention

logger = logging.getLogger(__name__)

# Threads that verify and delete bundles in a save's retention. They share the writer's GIL and cores with
# the training (and in `rlckpt train` the rollout) path: with the store's 8, a commit's p99 during pinned saves
# was 226 ms (64 MiB, local); with 1, 31 ms, as without retention (47 ms in a run beside it: noise).
RETENTION_WORKERS = 1

# The steps retention must keep besides its rules, and why: asked at each retention, in its thread.
Holds = Callable[[], Mapping[int, str]]


def retain_after_commit(
    store: BundleStore, retention: Retention, holds: Holds | None = None, *, max_workers: int = RETENTION_WORKERS
) -> list[int] | None:
    """Retention after a successful commit: `retention`'s rules plus the steps `holds()` says must stay. It
    reads the bundles its rules count (only bundles that verify count). When `holds` cannot say what must be
    kept, nothing is deleted this time; when they hold every bundle there is (the remote tier holds nothing
    of the run, or is silent), gc does not run at all: it could delete nothing, and reading every bundle's
    manifest at each save would only slow the training beside it. Blocking: run it off an event loop.

    Args:
        store: the tier the save committed to.
        retention: its rules (none: nothing is deleted).
        holds: the steps to keep whatever the rules say (a two-tier run's), asked once.
        max_workers: threads that read and delete bundles.
    Returns:
        The steps deleted, or None when retention has no rule or failed (logged: the save stays committed).
    """
    if not retention.deletes:
        return None
    try:
        held = dict(holds()) if holds is not None else {}
        if held and set(store.marked_steps()) <= held.keys():
            logger.info("retention: every bundle of %s is held (%d); nothing to delete", store.url, len(held))
            return []
        rules = dataclasses.replace(retention, holds={**retention.holds, **held})
        report = store.gc(retention=rules, max_workers=max_workers)
    except Exception:
        logger.warning("retention (%s) of %s failed; the new bundle is committed", retention, store.url, exc_info=True)
        return None
    if report.deleted_steps:
        logger.info("retention deleted step(s) %s at %s", report.deleted_steps, store.url)
    return list(report.deleted_steps)
