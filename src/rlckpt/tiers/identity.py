"""The tiers of a run are one run: the same run record (`_run.json`, the id every COMMIT names and a
signature covers) on each, so a bundle saved on the local tier and replicated verifies on the remote tier
as the same run's, and a local tier wiped with its machine takes the run's identity back from the remote.

A tier's run is its record's; a tier without one (its record removed, or bundles from before run records)
is the run its newest committed bundle's COMMIT names, if it names one. Two tiers of different runs are
refused — before a run starts, and by `rlckpt ls/gc --replicated-to` — whatever either holds."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from rlckpt.errors import CorruptBundleError, NewerFormatError, RunIdentityError, UncommittedBundleError
from rlckpt.store import BundleStore, RunRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierRun:
    """The run a tier is, and what says so (its record, or its newest bundle's COMMIT)."""

    tier: BundleStore
    record: RunRecord | None
    run_id: str | None
    source: str

    def describe(self) -> str:
        return f"{self.tier.url} is run {self.run_id} ({self.source})"


def tier_run(tier: BundleStore) -> TierRun:
    """The run `tier` is (run_id None: nothing says).

    Raises:
        StoreUnavailableError, MalformedRecordError, UnsafeObjectError: as BundleStore.run_record.
    """
    record = tier.run_record()
    if record is not None:
        return TierRun(tier, record, record.run_id, "its _run.json")
    newest = tier.latest()
    if newest is None:
        return TierRun(tier, None, None, "no run record, no bundle")
    try:
        named = tier.records(newest).commit.run
    except (UncommittedBundleError, CorruptBundleError, NewerFormatError):
        named = None
    return TierRun(tier, None, named, f"no _run.json; the COMMIT of its step {newest} names it")


def check_one_run(tiers: Sequence[BundleStore]) -> RunRecord | None:
    """The run record the tiers share (the first one found, in the tiers' order; None: no tier has one),
    after checking that no two tiers are different runs. Writes nothing.

    Raises:
        RunIdentityError: two tiers name different runs (two runs' directories given as one run's tiers).
        StoreUnavailableError, MalformedRecordError, UnsafeObjectError: as BundleStore.run_record.
    """
    runs = [tier_run(tier) for tier in tiers]
    known = [run for run in runs if run.run_id is not None]
    for other in known[1:]:
        if other.run_id != known[0].run_id:
            raise RunIdentityError(
                f"{other.describe()} and {known[0].describe()}: the tiers of one run must be one run; "
                "give each run its own directories"
            )
    return next((run.record for run in runs if run.record is not None), None)


def one_run(tiers: Sequence[BundleStore]) -> None:
    """Give every tier without a run record the record another tier holds (check_one_run); a tier with none
    while none has one gets its record at its first save, as any run.

    Raises:
        RunIdentityError, StoreUnavailableError, MalformedRecordError, UnsafeObjectError: as check_one_run.
    """
    record = check_one_run(tiers)
    if record is None:
        return
    for tier in tiers:
        if tier.run_record() is None:
            tier.ensure_run_record(record)
            log.info("%s takes the run record of run %s", tier.url, record.run_id)
