"""The claim of a step: one create-exclusive intent object `_txn/step_<N>.json` per step.

Whoever creates it holds the step: a writer for the length of its transaction, gc while it removes a
dead writer's data. A second claimant is refused unless the holder is presumed dead (intent.py),
in which case it takes the claim over. Every intent in the store is read by `read_at`, the one parser.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass

from rlckpt.errors import BundleExistsError, UnsafeObjectError
from rlckpt.store.backends import Backend
from rlckpt.store.paths.paths import COMMIT_NAME, TXN_DIR, intent_name, parse_intent_name, step_dirname
from rlckpt.store.records.intent import INTENT_MAX_BYTES, Intent, age_reason

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IntentRead:
    """What one intent object holds: the intent, or why it cannot be read (then `intent` is None)."""

    path: str
    step: int | None  # from the object's name
    intent: Intent | None
    problem: str | None
    mtime: float | None

    @property
    def txid(self) -> str | None:
        return self.intent.txid if self.intent else None

    def stale_reason(self, stale_after: float, now: float | None = None) -> str | None:
        """Why its writer is presumed dead, or None. An unreadable intent ages by its modification time
        (it may be a claimant's, written a moment ago); one without a time cannot prove it is alive."""
        if self.intent is not None:
            return self.intent.stale_reason(stale_after, self.mtime, now)
        if self.mtime is None:
            return f"unreadable ({self.problem}) and of unknown age"
        reason = age_reason((time.time() if now is None else now) - self.mtime, stale_after)
        return None if reason is None else f"unreadable ({self.problem}) and {reason}"

    def describe(self) -> str:
        if self.intent is not None:
            return self.intent.describe()
        return f"an unreadable intent at {self.path} ({self.problem})"


class Claims:
    """Claim, check and release steps of one run."""

    def __init__(self, backend: Backend, url: str, stale_after: float) -> None:
        self.backend = backend
        self.url = url
        self.stale_after = stale_after

    def path(self, step: int) -> str:
        return self.backend.path(TXN_DIR, intent_name(step))

    def read_at(self, path: str, mtime: float | None = None) -> IntentRead | None:
        """Parse the intent stored at `path`; None when it does not exist."""
        step = parse_intent_name(path.rsplit("/", 1)[-1])
        try:
            data = self.backend.read_object(path, INTENT_MAX_BYTES, "intent")
        except FileNotFoundError:
            return None
        except UnsafeObjectError as exc:
            return IntentRead(path, step, None, str(exc), mtime)
        try:
            intent = Intent.from_bytes(data)
        except ValueError as exc:
            return IntentRead(path, step, None, str(exc), mtime)
        if intent.step != step:
            return IntentRead(path, step, None, f"names step {intent.step} but is stored as {path}", mtime)
        return IntentRead(path, step, intent, None, mtime)

    def read(self, step: int) -> IntentRead | None:
        """The intent holding `step`, or None."""
        return self.read_at(self.path(step))

    def stale_reason(self, holder: IntentRead, stale_after: float | None = None) -> str | None:
        """`holder.stale_reason` (by this store's `stale_after` unless given), fetching the intent's
        modification time first when age is what decides."""
        if holder.mtime is None and (holder.intent is None or holder.intent.host != socket.gethostname()):
            try:
                holder = IntentRead(
                    holder.path, holder.step, holder.intent, holder.problem, self.backend.mtime(holder.path)
                )
            except FileNotFoundError:
                return "released meanwhile"
        return holder.stale_reason(self.stale_after if stale_after is None else stale_after)

    def committed(self, step: int) -> bool:
        return self.backend.exists(self.backend.path(step_dirname(step), COMMIT_NAME))

    def claim(self, step: int, txid: str) -> IntentRead | None:
        """Record our intent create-exclusively. A holder presumed dead is taken over once, and returned so
        that the caller, now holding the claim, removes what it left. BundleExistsError otherwise."""
        intent = Intent.new(step, txid)
        taken: IntentRead | None = None
        for _attempt in range(3):
            try:
                self.backend.create_exclusive(self.path(step), intent.to_bytes())
                return taken
            except FileExistsError:
                holder = self.read(step)
            if holder is None:
                continue  # released between our write and our read: try again
            if self.committed(step):
                raise BundleExistsError(f"step {step} at {self.url} is already committed")
            reason = self.stale_reason(holder)
            if reason is None or taken is not None:
                raise BundleExistsError(f"step {step} at {self.url} is being written by {holder.describe()}")
            log.warning("taking over step %s at %s from %s: %s", step, self.url, holder.describe(), reason)
            self.remove_if_unchanged(holder)
            taken = holder
        raise BundleExistsError(f"step {step} at {self.url}: could not claim it (claims keep changing hands)")

    def try_claim(self, step: int, txid: str) -> bool:
        """Claim `step` if nobody holds it (no takeover): gc holds a step this way while it removes data."""
        try:
            self.backend.create_exclusive(self.path(step), Intent.new(step, txid).to_bytes())
        except FileExistsError:
            return False
        return True

    def remove_if_unchanged(self, holder: IntentRead) -> bool:
        """Remove a stale intent after reading it once more: only if it still names the same transaction
        (another claimant may have taken it over meanwhile). Returns whether it was removed."""
        current = self.read_at(holder.path)
        if current is None:
            return False
        if current.txid != holder.txid or (current.intent is None) != (holder.intent is None):
            return False
        try:
            self.backend.remove_file(holder.path)
        except FileNotFoundError:
            return False
        return True

    def assert_owner(self, step: int, txid: str) -> None:
        """Raise BundleExistsError unless our intent still holds the step (not taken over by gc or a writer)."""
        current = self.read(step)
        if current is None or current.txid != txid:
            who = current.describe() if current else "nobody (intent removed, e.g. by gc)"
            raise BundleExistsError(f"step {step} at {self.url}: txid {txid} lost its claim; now held by {who}")

    def release(self, step: int, txid: str, committed: bool = False) -> None:
        """Remove our own intent (best effort: gc removes what is left).

        `committed`: the step has a COMMIT, so the intent is deleted without reading it first. Any other
        transaction's intent there (one that took ours over as stale) belongs to a writer that cannot
        commit any more (create-exclusive manifest/COMMIT; its claim re-check fails), so deleting it
        unseen is harmless. Without a COMMIT the intent is read first: it may hold a live writer's claim."""
        try:
            if committed:
                self.backend.remove_file(self.path(step))
                return
            current = self.read(step)
            if current is not None and current.txid == txid:
                self.backend.remove_file(self.path(step))
        except FileNotFoundError:
            pass
        except Exception:
            log.warning("could not remove intent of step %s (txid %s)", step, txid, exc_info=True)
