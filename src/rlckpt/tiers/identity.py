"""The tiers of a run are one run: the same run record (`_run.json`, the id every COMMIT names and a
signature covers) on each, so a bundle saved on the local tier and replicated verifies on the remote tier
as the same run's, and a local tier wiped with its machine takes the run's identity back from the remote."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rlckpt.errors import RunIdentityError
from rlckpt.store import BundleStore

log = logging.getLogger(__name__)


def one_run(tiers: Sequence[BundleStore]) -> None:
    """Give every tier without a run record the record another tier holds (the first one found, in the
    tiers' order); a tier with none while none has one gets its record at its first save, as any run.

    Raises:
        RunIdentityError: two tiers name different runs (two runs' directories given as one run's tiers).
        StoreUnavailableError, MalformedRecordError, UnsafeObjectError: as BundleStore.run_record.
    """
    records = [(tier, tier.run_record()) for tier in tiers]
    known = [(tier, record) for tier, record in records if record is not None]
    if not known:
        return
    first, record = known[0]
    for tier, other in known[1:]:
        if other != record:
            raise RunIdentityError(
                f"{tier.url} is run {other.run_id} and {first.url} is run {record.run_id} (their _run.json): "
                "the tiers of one run must be one run; give each run its own directories"
            )
    for tier, mine in records:
        if mine is None:
            tier.ensure_run_record(record)
            log.info("%s takes the run record of %s (run %s)", tier.url, first.url, record.run_id)
