"""Both tiers of a run side by side (`rlckpt ls --replicated-to`): each step's state on the local and the
remote tier, and how far the remote one lags — in steps, and in seconds from local COMMIT to remote COMMIT."""

from __future__ import annotations

from dataclasses import dataclass

from rlckpt.store import BundleStore, StoreEntry


@dataclass(frozen=True)
class TierRow:
    """One step: its entry on each tier (None: absent there) and, when committed on both, the seconds from
    its local COMMIT to its remote COMMIT."""

    step: int
    local: StoreEntry | None
    remote: StoreEntry | None
    lag_s: float | None = None


@dataclass(frozen=True)
class TierLag:
    """How far the remote tier is behind: the newest committed step of each, and the local committed steps
    newer than the remote's newest (not replicated yet)."""

    local_newest: int | None
    remote_newest: int | None
    not_replicated: list[int]


def side_by_side(local: BundleStore, remote: BundleStore) -> tuple[list[TierRow], TierLag]:
    """Every step-like entry of either tier, ascending, and the remote tier's lag."""
    mine = {e.step: e for e in local.entries()}
    theirs = {e.step: e for e in remote.entries()}
    rows = []
    for step in sorted(set(mine) | set(theirs)):
        here, there = mine.get(step), theirs.get(step)
        lag = None
        if _committed(here) and _committed(there) and here and there and here.txid == there.txid:
            at_local, at_remote = local.committed_at(step), remote.committed_at(step)
            lag = None if at_local is None or at_remote is None else at_remote - at_local
        rows.append(TierRow(step, here, there, lag))
    committed_here = [s for s, e in mine.items() if _committed(e)]
    committed_there = [s for s, e in theirs.items() if _committed(e)]
    remote_newest = max(committed_there, default=None)
    behind = sorted(s for s in committed_here if remote_newest is None or s > remote_newest)
    return rows, TierLag(max(committed_here, default=None), remote_newest, behind)


def _committed(entry: StoreEntry | None) -> bool:
    return entry is not None and entry.state == "committed"
