"""Both tiers of a run side by side (`rlckpt ls --replicated-to`): each step's state on the local and the
remote tier, whether the remote one holds that very bundle of the run, and how far it lags — in steps, and
in seconds from local COMMIT to remote COMMIT. A step counts as replicated by the same rule local retention
uses (holds.py): the same run and manifest digest in both COMMITs."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rlckpt.store import BundleStore, StoreEntry


@dataclass(frozen=True)
class TierRow:
    """One step: its entry on each tier (None: absent there), whether the remote one is a replica of the
    local one (committed on both, the same run and manifest digest) and then the seconds from its local
    COMMIT to its remote COMMIT. A local committed step not replicated while a newer one was names that
    one in `skipped_for`: replication is of at most every N-th save, and a step still waiting when a newer
    one is submitted is skipped for it (or was never due)."""

    step: int
    local: StoreEntry | None
    remote: StoreEntry | None
    lag_s: float | None = None
    replicated: bool = False
    skipped_for: int | None = None


@dataclass(frozen=True)
class TierLag:
    """How far the remote tier is behind: the newest committed step of each, the newest local step it holds
    as the same bundle (`replicated_newest`), and the local committed steps newer than that one (not
    replicated yet)."""

    local_newest: int | None
    remote_newest: int | None
    not_replicated: list[int]
    replicated_newest: int | None = None


def side_by_side(local: BundleStore, remote: BundleStore) -> tuple[list[TierRow], TierLag]:
    """Every step-like entry of either tier, ascending, and the remote tier's lag."""
    mine = {e.step: e for e in local.entries()}
    theirs = {e.step: e for e in remote.entries()}
    rows = []
    for step in sorted(set(mine) | set(theirs)):
        here, there = mine.get(step), theirs.get(step)
        lag = None
        replicated = _replica(here, there)
        if replicated:
            at_local, at_remote = local.committed_at(step), remote.committed_at(step)
            lag = None if at_local is None or at_remote is None else at_remote - at_local
        rows.append(TierRow(step, here, there, lag, replicated))
    rows = _skipped(rows)
    committed_here = [s for s, e in mine.items() if _committed(e)]
    committed_there = [s for s, e in theirs.items() if _committed(e)]
    anchor = max((row.step for row in rows if row.replicated), default=None)
    behind = sorted(s for s in committed_here if anchor is None or s > anchor)
    return rows, TierLag(max(committed_here, default=None), max(committed_there, default=None), behind, anchor)


def _skipped(rows: list[TierRow]) -> list[TierRow]:
    """Each local committed step left out of replication while a newer one was replicated, with that step."""
    newer: int | None = None
    marked = []
    for row in reversed(rows):
        if row.replicated:
            newer = row.step
        elif newer is not None and _committed(row.local):
            row = replace(row, skipped_for=newer)
        marked.append(row)
    return marked[::-1]


def _replica(here: StoreEntry | None, there: StoreEntry | None) -> bool:
    """Both committed, and the same bundle of the same run (holds.same_bundle, on the entries' records)."""
    return (
        here is not None
        and there is not None
        and _committed(here)
        and _committed(there)
        and here.manifest_digest is not None
        and (here.run, here.manifest_digest) == (there.run, there.manifest_digest)
    )


def _committed(entry: StoreEntry | None) -> bool:
    return entry is not None and entry.state == "committed"
