"""Garbage collection as a plan, then its application: retention of committed bundles and removal of what
dead transactions left. A dry run is the plan, not applied.

What gc never removes:
- a bundle its retention rules keep (retention.py: the K newest, every N-th step, the K best by a metric,
  the caller's holds), the newest bundle that fully verifies (retention counts only loadable bundles),
  nor any bundle that fails its checks (kept and reported as corrupt) — with a verify key, its
  signature among them: an unsigned or badly signed bundle is never counted;
- anything a live transaction owns. The run is listed first, the incomplete uploads second, and the
  intents last, so every file or upload in the plan of a transaction that was running is covered by an
  intent gc has read. Each removal is re-checked when applied, and step data is only removed while gc
  holds the step's claim itself: a writer that begins during gc is either refused the step until gc is
  done, or owns it and gc skips it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from rlckpt.errors import CorruptBundleError, UncommittedBundleError
from rlckpt.store.backends import Backend
from rlckpt.store.bundle import Bundle
from rlckpt.store.commit.claims import Claims, IntentRead
from rlckpt.store.commit.commit_check import Trust, committed_txid, load_checked_manifest
from rlckpt.store.paths.paths import TMP_DIR, TXN_DIR, parse_step_dirname, step_dirname
from rlckpt.store.records.inventory import Inventory
from rlckpt.store.records.manifest import Manifest
from rlckpt.store.upkeep.retention import Retention

log = logging.getLogger(__name__)

LEFTOVER_GRACE = 60.0  # seconds a probe key or an intent's temp file may live (each lives for a few calls)

DELETE_BUNDLE = "delete_bundle"  # retention: an older bundle that verified
DISCARD_TRANSACTION = "discard_transaction"  # a dead writer's data and intent
REMOVE_INTENT = "remove_intent"  # an intent left beside a committed step, or one for no step at all
REMOVE_ORPHAN_STEP = "remove_orphan_step"  # step data with no COMMIT and no intent
REMOVE_FOREIGN_DATA = "remove_foreign_data"  # another transaction's data beside a bundle or a live writer
REMOVE_STAGING = "remove_staging"  # a local staging dir no intent names
REMOVE_ROSTER = "remove_roster"  # the participants' roster of a transaction that is not running
REMOVE_LEFTOVER = "remove_leftover"  # an old probe key or intent temp file
ABORT_UPLOAD = "abort_upload"  # an incomplete multipart upload of no live transaction


@dataclass(frozen=True)
class GcAction:
    """One thing gc will do; `target` is the path or key it affects."""

    kind: str
    target: str
    step: int | None = None
    txid: str | None = None
    upload_id: str | None = None
    reason: str = ""


@dataclass
class GcPlan:
    """What a gc run found and intends to do."""

    stale_after: float  # the threshold the plan was made with; removals are re-checked against it
    actions: list[GcAction] = field(default_factory=list)
    kept_steps: list[int] = field(default_factory=list)
    kept_reasons: dict[int, str] = field(default_factory=dict)  # why retention keeps each (when it deletes any)
    corrupt: dict[int, str] = field(default_factory=dict)  # committed steps that fail a check, and why
    live: list[str] = field(default_factory=list)  # txids of live transactions
    quarantined: list[str] = field(default_factory=list)
    irregular: list[str] = field(default_factory=list)  # non-regular paths outside any step, left alone


@dataclass
class GcReport:
    """What gc removed (or, with dry_run, would remove), and what it left alone and why."""

    dry_run: bool
    deleted_steps: list[int] = field(default_factory=list)  # committed bundles removed by retention
    kept_steps: list[int] = field(default_factory=list)  # committed bundles that verified and were kept
    kept_reasons: dict[int, str] = field(default_factory=dict)  # which rule kept each (when retention deletes any)
    removed: list[str] = field(default_factory=list)  # debris paths: uncommitted prefixes, staging dirs, intents
    aborted_uploads: list[str] = field(default_factory=list)  # keys of incomplete multipart uploads
    live: list[str] = field(default_factory=list)  # txids of live transactions left alone
    corrupt_steps: list[int] = field(default_factory=list)  # have a COMMIT but fail a check; never touched
    corrupt_reasons: dict[int, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # planned removals dropped at apply time, and why
    quarantined: list[str] = field(default_factory=list)  # corrupt bundles moved aside earlier; left alone
    irregular: list[str] = field(default_factory=list)  # non-regular paths outside any step; left alone


class GarbageCollector:
    """Plans and applies gc over one run's backend and claims; `trust` (a store's verify key) makes
    retention count only the bundles that key signed for the run."""

    def __init__(
        self, backend: Backend, claims: Claims, url: str, max_workers: int, trust: Trust | None = None
    ) -> None:
        self.backend = backend
        self.claims = claims
        self.url = url
        self.max_workers = max_workers
        self.trust = trust

    # --- plan ---------------------------------------------------------------------------------
    def plan(self, retention: Retention, stale_after: float) -> GcPlan:
        """Everything gc would do now (reads only)."""
        inv = self.backend.scan()  # 1: data
        uploads = self.backend.incomplete_uploads()  # 2: uploads
        intents = self._read_intents(inv)  # 3: intents, listed afresh after both
        plan = GcPlan(stale_after=stale_after, quarantined=sorted(inv.quarantined))
        stale = {read.path: reason for read in intents if (reason := self._stale(read, stale_after)) is not None}
        live = [read for read in intents if read.path not in stale]
        plan.live = sorted(read.txid or read.path for read in live)
        claimed_steps = {read.step for read in intents if read.step is not None}
        live_steps = {read.step for read in live if read.step is not None}
        named_txids = {read.txid for read in intents if read.txid}

        owners, doomed = self._plan_retention(plan, inv, retention)
        owners.update({read.step: read.txid for read in live if read.step is not None and read.txid})
        for step, owner in sorted(owners.items()):
            for path in self.backend.foreign_data(inv, step, owner):
                plan.actions.append(
                    GcAction(
                        REMOVE_FOREIGN_DATA, path, step=step, txid=path.rsplit("/", 1)[-1], reason=f"not of {owner}"
                    )
                )
        for read in intents:
            if read.path in stale:
                self._plan_dead(plan, inv, read, stale[read.path])
        plan.actions.extend(doomed)  # after the intents: retention holds each step's claim while it deletes
        for step in sorted(inv.steps):
            if not inv.committed_marker(step) and step not in claimed_steps:
                plan.actions.append(
                    GcAction(
                        REMOVE_ORPHAN_STEP,
                        self.backend.path(step_dirname(step)),
                        step=step,
                        reason="no COMMIT and no intent",
                    )
                )
        for name in sorted(inv.tmp_dirs):  # those of dead transactions go with them
            if name not in named_txids:
                plan.actions.append(
                    GcAction(REMOVE_STAGING, self.backend.path(TMP_DIR, name), txid=name, reason="no intent names it")
                )
        live_txids = {read.txid for read in live if read.txid}
        for txid in sorted(inv.rosters - live_txids):  # a dead transaction's goes after its intent, re-checked
            plan.actions.append(
                GcAction(REMOVE_ROSTER, self.backend.path(TXN_DIR, txid), txid=txid, reason="no live transaction")
            )
        now = time.time()
        for path, mtime in sorted({**inv.probes, **inv.intent_temps}.items()):
            if mtime is None or now - mtime >= min(stale_after, LEFTOVER_GRACE):
                plan.actions.append(GcAction(REMOVE_LEFTOVER, path, reason="left by a crashed probe or intent write"))
        for key, upload_id in uploads:
            upload_step = parse_step_dirname(self.backend.rel(key).split("/", 1)[0])
            if upload_step is None or upload_step not in live_steps:
                plan.actions.append(
                    GcAction(ABORT_UPLOAD, key, step=upload_step, upload_id=upload_id, reason="no live transaction")
                )
        plan.irregular = sorted(p for p in inv.irregular if parse_step_dirname(p.split("/", 1)[0]) is None)
        return plan

    def _read_intents(self, inv: Inventory) -> list[IntentRead]:
        """Every intent, from a listing of `_txn/` taken now (not the earlier run listing)."""
        txn_dir = self.backend.path(TXN_DIR)
        reads = []
        for rel in sorted(self.backend.list_files(txn_dir).sizes):
            if "/" in rel or rel.startswith("."):
                continue  # temp files of atomic intent writes: leftovers, planned separately
            path = f"{txn_dir}/{rel}"
            read = self.claims.read_at(path, inv.intents.get(path))
            if read is not None:
                reads.append(read)
        return reads

    def _stale(self, read: IntentRead, stale_after: float) -> str | None:
        return self.claims.stale_reason(read, stale_after)

    def _plan_retention(
        self, plan: GcPlan, inv: Inventory, retention: Retention
    ) -> tuple[dict[int, str], list[GcAction]]:
        """Every bundle that passes the commit check is kept if a rule of `retention` keeps it, or it is the
        newest that fully verifies; the rest are deleted. A bundle that fails a check is corrupt: kept,
        reported, never counted. Returns the txid of every kept bundle by step (their steps' other data is
        debris) and the deletions, oldest first."""
        manifests: dict[int, Manifest] = {}
        for step in sorted(inv.steps, reverse=True):
            if not inv.committed_marker(step):
                continue
            try:
                manifests[step] = load_checked_manifest(self.backend, self.url, step, trust=self.trust)
            except (CorruptBundleError, UncommittedBundleError) as exc:
                plan.corrupt[step] = str(exc)
        for step, what in inv.irregular_steps().items():
            plan.corrupt.setdefault(step, f"step {step} at {self.url}: {what}")
        keep = self._kept(plan, manifests, retention) if retention.deletes else dict.fromkeys(manifests, "")
        owners: dict[int, str] = {}
        doomed: list[GcAction] = []
        for step, manifest in manifests.items():
            if step in plan.corrupt:
                continue  # found corrupt while retention read it in full: kept, never counted
            if step in keep:
                plan.kept_steps.append(step)
                owners[step] = manifest.txid
                if keep[step]:
                    plan.kept_reasons[step] = keep[step]
                continue
            where = self.backend.path(step_dirname(step))
            doomed.append(GcAction(DELETE_BUNDLE, where, step=step, txid=manifest.txid, reason=retention.describe()))
        plan.kept_steps.sort()
        return owners, doomed[::-1]

    def _kept(self, plan: GcPlan, manifests: dict[int, Manifest], retention: Retention) -> dict[int, str]:
        """Step -> why it is kept, for every bundle some rule keeps. Bundles are read in full only where a rule
        counts them (the newest, the best), newest or best first, and only as many as it counts; one that
        fails is recorded in `plan.corrupt`."""
        newest = retention.keep_last or 1  # the newest good bundle is kept whatever the rules
        why_newest = f"one of the {newest} newest good bundles" if retention.keep_last else "the newest good bundle"
        if len(manifests) <= newest:
            return dict.fromkeys(manifests, why_newest)  # nothing can be deleted: nothing needs reading
        verified: dict[int, bool] = {}

        def verifies(step: int) -> bool:
            if step not in verified:
                try:
                    Bundle(self.backend, self.url, manifests[step], self.max_workers).verify()
                    verified[step] = True
                except CorruptBundleError as exc:
                    plan.corrupt[step] = str(exc)
                    verified[step] = False
            return verified[step]

        keep = dict.fromkeys(_first(sorted(manifests, reverse=True), newest, verifies), why_newest)
        if retention.keep_every is not None:
            for step in manifests:
                if step % retention.keep_every == 0:
                    keep.setdefault(step, f"its step is a multiple of {retention.keep_every}")
        if retention.keep_best is not None:
            values = {step: v for step, m in manifests.items() if (v := retention.metric_value(m.metadata)) is not None}
            sign = 1.0 if retention.lower_is_better else -1.0
            ranked = sorted(values, key=lambda step: (sign * values[step], -step))  # best first; newer on a tie
            for step in _first(ranked, retention.keep_best, verifies):
                keep.setdefault(step, f"one of the {retention.keep_best} best by {retention.metric} ({values[step]:g})")
        for step, reason in retention.holds.items():
            if step in manifests:
                keep.setdefault(step, reason)
        return keep

    def _plan_dead(self, plan: GcPlan, inv: Inventory, read: IntentRead, reason: str) -> None:
        if read.step is None or inv.committed_marker(read.step):
            why = "its step is committed" if read.step is not None else "it names no step"
            plan.actions.append(GcAction(REMOVE_INTENT, read.path, step=read.step, txid=read.txid, reason=why))
            return
        plan.actions.append(GcAction(DISCARD_TRANSACTION, read.path, step=read.step, txid=read.txid, reason=reason))

    # --- apply --------------------------------------------------------------------------------
    def report(self, plan: GcPlan, dry_run: bool) -> GcReport:
        """The report of a plan, before anything is applied."""
        report = GcReport(
            dry_run=dry_run,
            kept_steps=list(plan.kept_steps),
            kept_reasons=dict(sorted(plan.kept_reasons.items())),
            live=list(plan.live),
            corrupt_steps=sorted(plan.corrupt),
            corrupt_reasons=dict(sorted(plan.corrupt.items())),
            quarantined=list(plan.quarantined),
            irregular=list(plan.irregular),
        )
        if dry_run:
            for action in plan.actions:
                self._record(report, action, self._targets(action))
        return report

    def apply(self, plan: GcPlan) -> GcReport:
        """Carry out the plan, re-checking each removal at the moment it is made."""
        report = self.report(plan, dry_run=False)
        for action in plan.actions:
            try:
                removed = getattr(self, f"_apply_{action.kind}")(action, plan)
            except Exception as exc:
                log.warning("gc: %s %s failed: %s", action.kind, action.target, exc, exc_info=True)
                report.skipped.append(f"{action.target}: failed ({type(exc).__name__}: {exc})")
                continue
            if isinstance(removed, str):
                report.skipped.append(f"{action.target}: {removed}")
            else:
                self._record(report, action, removed)
        log.info(
            "gc of %s: deleted steps %s, removed %d paths, aborted %d uploads, skipped %d",
            self.url,
            report.deleted_steps,
            len(report.removed),
            len(report.aborted_uploads),
            len(report.skipped),
        )
        return report

    def _targets(self, action: GcAction) -> list[str]:
        """The paths a dry run reports for an action: a dead transaction's data, then its intent."""
        if action.kind != DISCARD_TRANSACTION:
            return [action.target]
        data = self._data_of(action)
        return [data, action.target] if data else [action.target]

    @staticmethod
    def _record(report: GcReport, action: GcAction, removed: list[str]) -> None:
        if action.kind == DELETE_BUNDLE:
            report.deleted_steps.append(action.step)  # type: ignore[arg-type]
        elif action.kind == ABORT_UPLOAD:
            report.aborted_uploads.append(action.target)
        else:
            report.removed.extend(removed)

    # Each _apply_* returns the paths it removed, or a string saying why it was skipped.
    def _apply_delete_bundle(self, action: GcAction, plan: GcPlan) -> list[str] | str:
        """Delete the bundle the plan decided on, holding the step's claim while it goes: on an object store
        the deletion is several requests (COMMIT, then the rest), and a writer that committed the step
        again in between would lose its new bundle to the second one. Skipped if the step is held, or its
        COMMIT no longer names the transaction planned for deletion."""
        step: int = action.step  # type: ignore[assignment]
        held = self._hold(step)
        if held is None:
            return "a writer holds the step"
        try:
            current = committed_txid(self.backend, step)
            if current != action.txid:
                return "its COMMIT is gone" if current is None else "the step was committed again since the plan"
            self.backend.delete_bundle(step_dirname(step))
        finally:
            self.claims.release(step, held)
        return [action.target]

    def _apply_remove_intent(self, action: GcAction, plan: GcPlan) -> list[str] | str:
        read = self.claims.read_at(action.target)
        if read is None or read.txid != action.txid:
            return "the intent changed since it was planned"
        self.backend.remove_file(action.target)
        return [action.target]

    def _apply_discard_transaction(self, action: GcAction, plan: GcPlan) -> list[str] | str:
        """Take the dead writer's claim over (only if it is still the same dead intent), hold the step while
        its data is removed, then let the step go."""
        current = self.claims.read_at(action.target)
        if current is None or current.txid != action.txid:
            return "the intent changed since it was planned"
        if self.claims.stale_reason(current, plan.stale_after) is None:
            return "its writer is alive after all"
        if not self.claims.remove_if_unchanged(current):
            return "the intent changed hands meanwhile"
        step_dir = step_dirname(action.step)  # type: ignore[arg-type]
        data = self._data_of(action)
        held = self._hold(action.step)  # type: ignore[arg-type]
        if held is None:
            return "a new writer claimed the step; its begin() removes what the dead one left"
        try:
            self.backend.discard(step_dir, action.txid)
        finally:
            self.claims.release(action.step, held)  # type: ignore[arg-type]
        return [data, action.target] if data else [action.target]

    def _data_of(self, action: GcAction) -> str | None:
        """Where a dead transaction's data is, if there is any (an unreadable intent names no staging dir)."""
        data = self.backend.transaction_data(step_dirname(action.step), action.txid)  # type: ignore[arg-type]
        return data if data is not None and self.backend.exists(data) else None

    def _apply_remove_orphan_step(self, action: GcAction, plan: GcPlan) -> list[str] | str:
        held = self._hold(action.step)  # type: ignore[arg-type]
        if held is None:
            return "a writer claimed the step meanwhile"
        try:
            if self.claims.committed(action.step):  # type: ignore[arg-type]
                return "the step was committed meanwhile"
            self.backend.remove_tree(action.target)
        finally:
            self.claims.release(action.step, held)  # type: ignore[arg-type]
        return [action.target]

    def _apply_remove_foreign_data(self, action: GcAction, plan: GcPlan) -> list[str] | str:
        current = self.claims.read(action.step)  # type: ignore[arg-type]
        if current is not None and current.txid == action.txid:
            return "its transaction holds the step now"
        self.backend.remove_tree(action.target)
        return [action.target]

    def _apply_remove_staging(self, action: GcAction, plan: GcPlan) -> list[str] | str:
        named = {read.txid for read in self._read_intents(Inventory())}
        if action.txid in named:
            return "an intent names it now"
        self.backend.remove_tree(action.target)
        return [action.target]

    def _apply_remove_roster(self, action: GcAction, plan: GcPlan) -> list[str] | str:
        named = {read.txid for read in self._read_intents(Inventory())}
        if action.txid in named:
            return "an intent names it now"
        self.backend.remove_tree(action.target)
        return [action.target]

    def _apply_remove_leftover(self, action: GcAction, plan: GcPlan) -> list[str]:
        try:
            self.backend.remove_file(action.target)
        except FileNotFoundError:
            pass
        return [action.target]

    def _apply_abort_upload(self, action: GcAction, plan: GcPlan) -> list[str]:
        self.backend.abort_upload(action.target, action.upload_id or "")
        return [action.target]

    def _hold(self, step: int) -> str | None:
        """Claim `step` for gc without taking anything over; the txid held, or None if someone holds it."""
        txid = f"gc-{uuid.uuid4().hex}"
        return txid if self.claims.try_claim(step, txid) else None


def _first(steps: list[int], count: int, verifies: Callable[[int], bool]) -> list[int]:
    """The first `count` of `steps`, in order, that verify (each read in full only until that many did)."""
    found: list[int] = []
    for step in steps:
        if len(found) >= count:
            break
        if verifies(step):
            found.append(step)
    return found
