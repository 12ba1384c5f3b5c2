"""BundleStore: the entry point. Writers `begin(step)`; readers `steps()`, `latest()`, `open(step)`; tools
`entries()` and `gc()`. A thin facade over the backend (storage primitives), the claims (who holds
which step), the commit check and the garbage collector. See docs/store-protocol.md; signed bundles and
the run record: docs/security.md."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
import warnings
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from rlckpt.errors import (
    BadSignatureError,
    BundleExistsError,
    CorruptBundleError,
    NewerFormatError,
    RunIdentityError,
    StoreConfigError,
    TransactionStateError,
    UncommittedBundleError,
    UnsafeObjectError,
    UnsafeStoreError,
    UnsignedBundleError,
)
from rlckpt.formats import quoted
from rlckpt.store.backends import Backend, make_backend
from rlckpt.store.bundle import Bundle
from rlckpt.store.commit.claims import Claims, IntentRead
from rlckpt.store.commit.commit_check import CommitRecords, Trust, load_checked, load_checked_records
from rlckpt.store.commit.participant import ParticipantWriter, TransactionHandle, validate_participant
from rlckpt.store.commit.transaction import BundleTransaction
from rlckpt.store.io.reuse import ReuseBase
from rlckpt.store.io.storage_errors import unavailable_as_store_error
from rlckpt.store.paths.location import given_filesystem_root, open_location
from rlckpt.store.paths.paths import COMMIT_NAME, MANIFEST_NAME, is_txid, step_dirname, validate_step
from rlckpt.store.records.intent import DEFAULT_STALE_AFTER
from rlckpt.store.records.inventory import Inventory
from rlckpt.store.records.manifest import FileEntry
from rlckpt.store.records.roster import Roster
from rlckpt.store.records.run_record import (
    RUN_RECORD_NAME,
    RunRecord,
    checked_run_id,
    create_run_record,
    read_run_record,
)
from rlckpt.store.signing import SigningKeyInput, VerifyKeyInput, signing_key_of, verify_key_of
from rlckpt.store.upkeep.gc import GarbageCollector, GcReport
from rlckpt.store.upkeep.retention import Retention

log = logging.getLogger(__name__)

DEFAULT_MAX_WORKERS = 8


@dataclass(frozen=True)
class StoreEntry:
    """One step-like thing found in the store, for `rlckpt ls`.

    state: "committed" (COMMIT names the manifest and the listing matches it), "corrupt" (COMMIT
    present but a check failed, or a non-regular file in the step; `detail` says which), "newer" (COMMIT
    or manifest of a format this rlckpt does not read: written by a newer one; `detail` names it),
    "uncommitted" (data without COMMIT and no transaction: debris for gc), "writing" (a live
    transaction), "stale" (a transaction presumed dead).

    `unchanged`: of a committed bundle's `size`, the bytes in files whose entries are those of the committed bundle
    before it (same path, size and digest): with reuse on, what the save took from that bundle instead of
    writing (stored once on local disk, copied inside the server on S3); None for the first or another state.

    A committed entry also says what wrote it: the manifest's format, its files' digest algorithm(s)
    ("+"-joined), the writing rlckpt's version (None before manifest format 2), and the values of the
    manifest metadata keys `entries()` was asked for.

    signature: "signed" (COMMIT carries a signature: checked by a store with a verify key, only present
    without one), "unsigned", "bad" (a store with a verify key refused it; the entry is then "corrupt",
    `detail` says why), or None (no COMMIT that reads). `signed_by` is the signing key's id, `run` the
    run id COMMIT names (None before COMMIT format 3), `manifest_digest` the manifest digest it names
    (`algorithm:hex`): with `run`, what tells a replica of this very bundle from another bundle of the step.
    """

    step: int
    state: str
    size: int
    files: int
    created: str | None
    txid: str | None
    detail: str
    path: str
    manifest_format: int | None = None
    digest: str | None = None
    writer_version: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    signature: str | None = None
    signed_by: str | None = None
    run: str | None = None
    manifest_digest: str | None = None
    unchanged: int | None = None


class BundleStore:
    """Transactional bundles `step_<N>/` under one run URL (local path or any fsspec URL)."""

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        fs: Any = None,
        allow_unsafe: bool = False,
        stale_after: float = DEFAULT_STALE_AFTER,
        max_workers: int = DEFAULT_MAX_WORKERS,
        signing_key: SigningKeyInput | None = None,
        verify_key: VerifyKeyInput | None = None,
        run_id: str | None = None,
    ) -> None:
        """`fs` overrides the filesystem built from url+storage_options (tests wrap it to inject faults).
        `allow_unsafe` lets writes proceed (with a loud warning) on a server that ignores create-exclusive.
        `signing_key` (a SigningKey or its file): every commit signs its COMMIT. `verify_key` (a VerifyKey
        or its file): only bundles that key signed for this run are read, listed as committed or kept by
        retention; without one, signatures are not checked. The two are independent: a writer that must
        refuse bundles it did not sign passes its key's public half (`signing_key.public`) as well.
        `run_id` pins the run (with `verify_key` only): "this run" is then that id, whatever `_run.json`
        says, so a key shared by several runs cannot pass one run's bundles for another's; a run record
        naming another run is refused (RunIdentityError) and a new run's record takes this id
        (docs/security.md).

        Raises:
            KeyFileError: a key file that cannot be used (missing, open to others, not an Ed25519 key).
            StoreConfigError: `run_id` is not a run id, or is given without a verify key.
        """
        self.signing_key = signing_key_of(signing_key)
        self.verify_key = verify_key_of(verify_key)
        self.run_id = None if run_id is None else checked_run_id(run_id, f"store {url}: the pinned run")
        if self.run_id is not None and self.verify_key is None:
            raise StoreConfigError(
                f"store {url}: a pinned run ({self.run_id}) goes with a verify key: without one no signature is "
                "checked, and the run a COMMIT names proves nothing"
            )
        self._run: RunRecord | None = None  # the run's record, once read or made (it is never rewritten)
        self._warned_record = False  # a run record that disagrees with the pin is logged once per store
        self.url = os.fspath(url)
        self.storage_options = dict(storage_options or {})
        self.allow_unsafe = allow_unsafe
        self.stale_after = stale_after
        self.max_workers = max_workers
        if fs is None:
            fs, root = open_location(self.url, self.storage_options)  # StoreConfigError on any bad input
        else:
            root = given_filesystem_root(self.url, fs)
        self.backend: Backend = make_backend(fs, root)
        self.claims = Claims(self.backend, self.url, stale_after)
        self._checked = False
        self._probed = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"BundleStore({self.url!r})"

    # --- the run's identity -------------------------------------------------------------------
    def run_record(self) -> RunRecord | None:
        """The run's record (its id), or None when no bundle was begun in it since run records exist.

        Raises:
            RunIdentityError: the store pins a run (`run_id`) and the record names another.
            MalformedRecordError: `_run.json` does not read; UnsafeObjectError: it is not a regular file
                or over its cap; StoreUnavailableError.
        """
        if self._run is None:
            self._check_reachable()
            with unavailable_as_store_error(self.url, "reading the run record"):
                self._run = read_run_record(self.backend)
        if self._run is not None:
            self._check_pin(self._run)
        return self._run

    def _check_pin(self, record: RunRecord, whose: str = f"its {RUN_RECORD_NAME}") -> None:
        """RunIdentityError unless `record` is of the pinned run (no pin: any record is)."""
        if self.run_id is not None and record.run_id != self.run_id:
            raise RunIdentityError(
                f"{self.url}: {whose} names run {record.run_id}, not the pinned run {self.run_id}: the record was "
                "rewritten or copied from another run, or the pin is wrong (check the storage, then put back "
                f"the record of run {self.run_id})"
            )

    def ensure_run_record(self, record: RunRecord | None = None) -> RunRecord:
        """The run's record, made now (create-exclusive) if the run has none: `record` — a replica of
        another run takes its source's, so the source's signed bundles verify here too — or a new id.

        Raises:
            RunIdentityError: the run already has a record naming another run than `record`.
            MalformedRecordError, UnsafeObjectError, StoreUnavailableError: as run_record.
        """
        self._check_reachable()
        with unavailable_as_store_error(self.url, "writing the run record"):
            return self._ensure_run(record)

    def _ensure_run(self, record: RunRecord | None) -> RunRecord:
        """ensure_run_record's storage calls, inside the caller's unavailable_as_store_error. A pinned store
        makes a new run's record with the pinned id, and refuses a record of another run."""
        if record is not None:
            self._check_pin(record, "the record given")
        if self._run is None:
            made = record or RunRecord.new(self.run_id)
            self._run = read_run_record(self.backend) or create_run_record(self.backend, made)
        self._check_pin(self._run)
        if record is not None and self._run.run_id != record.run_id:
            raise RunIdentityError(
                f"{self.url} is run {self._run.run_id} (its _run.json), not run {record.run_id}: its bundles "
                "would not verify as the other run's"
            )
        return self._run

    def _trust(self) -> Trust | None:
        """What this store accepts with its verify key (None: no key, signatures not checked); the run's
        record is read once and then kept, so a record rewritten behind a reader's back changes nothing.
        A pinned run is "this run" whatever the record says: one that names another run is logged, loudly,
        and a missing or unreadable one does not matter."""
        if self.verify_key is None:
            return None
        if self.run_id is not None:
            self._warn_if_the_record_disagrees()
            return Trust(self.verify_key, self.run_id, pinned=True)
        try:
            record = self.run_record()
        except (ValueError, UnsafeObjectError) as exc:  # MalformedRecordError is a ValueError
            return Trust(self.verify_key, None, str(exc))
        if record is None:
            return Trust(self.verify_key, None, "the run has no run record, _run.json")
        return Trust(self.verify_key, record.run_id)

    def _warn_if_the_record_disagrees(self) -> None:
        """Log (once per store) a run record naming another run than the pin: reads go by the pin, writes
        are refused (begin raises RunIdentityError), and the user should know why."""
        try:
            self.run_record()
        except RunIdentityError as exc:
            if not self._warned_record:
                self._warned_record = True
                log.warning("%s; reading by the pin: only bundles signed for run %s verify", exc, self.run_id)
        except (ValueError, UnsafeObjectError):  # no record needed: the pin names the run
            pass

    @property
    def fs(self) -> Any:
        return self.backend.fs

    @property
    def root(self) -> str:
        return self.backend.root

    @property
    def is_local(self) -> bool:
        """True for a local-disk store (atomic rename commit), False for object stores (marker last)."""
        return self.backend.local

    # --- reachability / probe -----------------------------------------------------------------
    def _check_reachable(self) -> None:
        """Once per store: the location can hold a run (bucket exists; no file where the root should be)."""
        if self._checked:
            return
        with unavailable_as_store_error(self.url, "checking the store"):
            self.backend.check_reachable(self.url)
        self._checked = True

    def _ensure_writable(self) -> None:
        """Probe create-exclusive once; refuse (or warn loudly if allow_unsafe) when it is not enforced."""
        self._check_reachable()
        with self._lock:
            if self._probed:
                return
            with unavailable_as_store_error(self.url, "probing create-exclusive writes"):
                enforced = self.backend.create_exclusive_enforced()
            if not enforced:
                msg = (
                    f"store {self.url} does not enforce create-exclusive writes (If-None-Match: *): "
                    "two writers of one step could both commit"
                )
                if not self.allow_unsafe:
                    raise UnsafeStoreError(msg + "; pass allow_unsafe=True to write anyway")
                log.warning("UNSAFE: %s (allow_unsafe=True)", msg)
                warnings.warn(f"UNSAFE: {msg}", RuntimeWarning, stacklevel=3)
            self._probed = True

    # --- writing ------------------------------------------------------------------------------
    def begin(
        self, step: int, *, replace_corrupt: bool = False, txid: str | None = None, reuse: bool = False
    ) -> BundleTransaction:
        """Start the save of `step`: the intent is recorded (claiming the step) before any data byte.

        COMMIT is checked once, after the claim (a writer may commit until we hold it). With
        `replace_corrupt`, a committed bundle of this step that fails verification (with a verify key:
        also one it did not sign for the run) is moved to `_quarantine/` (kept for inspection) and the
        step is written anew; a valid one still refuses. The run's first begin makes its run record,
        whose id the COMMIT names (and, with a signing key, signs).

        `txid` runs the transaction under a given id instead of a fresh one: a replica (replica.py) is the
        same bundle as its source, whose manifest names its txid (and on an object store its files live
        under `step_<N>/<txid>/`). A dead earlier transaction of that same txid is the same copy,
        interrupted: what it wrote is left in place (`BundleTransaction.adopt` checks each file before
        counting it), not removed with the rest of a dead writer's data.

        With `reuse`, a file of this save whose bytes are those of the same file of the newest committed bundle
        below `step` (its base) is taken from it rather than written again, by the coordinator and by every
        participant (io/reuse.py, docs/store-protocol.md#reuse-of-unchanged-files); the first save has no base.

        Returns:
            The open transaction; use it as a context manager.
        Raises:
            BundleExistsError: the step is committed, or another live writer holds it.
            StoreUnavailableError: the store cannot be reached or written.
            UnsafeStoreError: the server ignores create-exclusive writes (see `allow_unsafe`).
            TransactionStateError: `txid` is not a transaction id.
        """
        validate_step(step)
        if txid is not None and not is_txid(txid):
            raise TransactionStateError(f"not a transaction id: {quoted(txid)}")
        self._ensure_writable()
        txid = txid or uuid.uuid4().hex
        step_dir = step_dirname(step)
        with unavailable_as_store_error(self.url, f"beginning step {step}"):
            taken = self.claims.claim(step, txid)
            committed = False
            try:
                run = self._ensure_run(None)  # the id every COMMIT of the run names (made by its first begin)
                if taken is not None and taken.txid and taken.txid != txid:
                    self.backend.discard(step_dir, taken.txid)  # the dead writer's data; the claim is ours
                committed = self.backend.prepare_step(step_dir, txid)
                if committed and replace_corrupt and self._quarantine_if_corrupt(step, txid):
                    committed = self.backend.prepare_step(step_dir, txid)
                if committed:
                    raise BundleExistsError(f"step {step} at {self.url} is already committed")
                base = self._newest_below(step) if reuse else None
            except BaseException:
                self.claims.release(step, txid, committed=committed)
                raise
        reusing = "" if base is None else f", reusing unchanged files of {base.describe()}"
        log.info("began step %s (txid %s) at %s%s", step, txid, self.url, reusing)
        return BundleTransaction(
            self.backend,
            self.claims,
            self.url,
            step,
            txid,
            self.max_workers,
            self.storage_options,
            run_id=run.run_id,
            signing_key=self.signing_key,
            base=base,
        )

    def _newest_below(self, step: int) -> ReuseBase | None:
        """The newest committed bundle below `step` that passes the readers' checks, as a reuse base."""
        inv = self.backend.scan()
        trust = self._trust()
        for below in sorted((s for s in inv.steps if s < step and inv.committed_marker(s)), reverse=True):
            base = self._reuse_base(below, None, trust)
            if base is not None:
                return base
        return None

    def _reuse_base(self, step: int, txid: str | None, trust: Trust | None) -> ReuseBase | None:
        """Bundle `step` as a reuse base (only if its txid is `txid`, when given), or None when it is not
        committed, not that bundle, or does not pass the readers' checks: then nothing is reused."""
        try:
            manifest = load_checked(self.backend, self.url, step, with_listing=False, trust=trust).manifest
        except (CorruptBundleError, UncommittedBundleError, NewerFormatError) as exc:
            log.info("step %s at %s is no reuse base: %s", step, self.url, exc)
            return None
        if txid is not None and manifest.txid != txid:
            log.info("step %s at %s is no longer transaction %s: nothing is reused from it", step, self.url, txid)
            return None
        return ReuseBase(step, manifest.txid, manifest.files)

    @classmethod
    def join(cls, handle: TransactionHandle, participant: str, **store_kwargs: Any) -> ParticipantWriter:
        """Join a running transaction as `participant`, from any process on any node that can reach the
        store: a new BundleStore for `handle.url` (see `participant` to reuse one).

        Raises:
            TransactionStateError: the transaction is not running (ended, or its step taken over).
            SharedStorageError: local disk, and this node cannot see the transaction's staging dir.
        """
        return cls(handle.url, handle.storage_options, **store_kwargs).participant(handle, participant)

    def participant(self, handle: TransactionHandle, participant: str) -> ParticipantWriter:
        """Join a running transaction of this store as `participant` (see `join`).

        The participant enters the transaction's roster before it checks that the transaction runs, so a
        commit under way either sees it (and refuses until it seals) or it sees the commit and does not
        join (roster.py)."""
        validate_participant(participant)
        validate_step(handle.step)
        if not is_txid(handle.txid):
            raise TransactionStateError(f"not a transaction id: {quoted(handle.txid)}")
        who = f"participant {participant}"
        roster = Roster(self.backend, self.url, handle.step, handle.txid)
        with unavailable_as_store_error(self.url, f"joining step {handle.step} as {who}"):
            roster.join(participant)
            try:
                holder = self.claims.read(handle.step)
                if holder is None or holder.txid != handle.txid:
                    held = holder.describe() if holder else "nobody: it ended"
                    raise TransactionStateError(
                        f"{who} cannot join transaction {handle.txid} of step {handle.step} at {self.url}: "
                        f"it is not running (step held by {held})"
                    )
                self.backend.check_joinable(step_dirname(handle.step), handle.txid, who)
                base = None
                if handle.base_step is not None:
                    base = self._reuse_base(handle.base_step, handle.base_txid, self._trust())
            except BaseException:
                roster.leave(participant)
                raise
        return ParticipantWriter(
            self.backend, self.claims, self.url, handle, participant, self.max_workers, roster, base=base
        )

    def _quarantine_if_corrupt(self, step: int, txid: str) -> bool:
        """With the step claimed: verify its bundle fully; if it fails, move it aside. True if moved."""
        try:
            self.open(step).verify()
            return False
        except UncommittedBundleError:
            return True  # its COMMIT went meanwhile: look again
        except CorruptBundleError as exc:
            where = self.backend.quarantine(step_dirname(step), f"{step_dirname(step)}-{txid}")
            log.warning(
                "step %s at %s is corrupt (%s); moved it to %s and writing the step anew", step, self.url, exc, where
            )
            return True

    # --- reading ------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Committed steps, ascending (COMMIT present and naming the manifest's digest; file contents are
        checked when read, and fully by `Bundle.verify`). A step written by a newer rlckpt (a COMMIT or
        manifest format this one does not read) counts, and `open` refuses it: nothing older is ever
        taken for the newest."""
        self._check_reachable()
        with unavailable_as_store_error(self.url, "listing steps"):
            inv = self.backend.scan()
            trust = self._trust()
            return [s for s in sorted(inv.steps) if inv.committed_marker(s) and self._passes(s, trust)]

    def marked_steps(self) -> list[int]:
        """Steps that hold a COMMIT object, ascending, from one listing and unchecked: every committed step
        is among them (`steps()` checks each one's COMMIT and manifest). For a caller that only needs to
        name every step that may be committed (a two-tier run's retention holds) without reading them."""
        self._check_reachable()
        with unavailable_as_store_error(self.url, "listing steps"):
            inv = self.backend.scan()
            return [s for s in sorted(inv.steps) if inv.committed_marker(s)]

    def _passes(self, step: int, trust: Trust | None) -> bool:
        try:
            load_checked(self.backend, self.url, step, with_listing=False, trust=trust)
        except NewerFormatError:
            return True  # a newer rlckpt's bundle: counted, and open() refuses it in one line
        except (CorruptBundleError, UncommittedBundleError):
            return False
        return True

    def latest(self) -> int | None:
        """The newest committed step (as `steps()` counts them), or None when there is none: one listing, then
        COMMIT and manifest of each step from the newest down, only until one passes."""
        self._check_reachable()
        with unavailable_as_store_error(self.url, "finding the newest step"):
            inv = self.backend.scan()
            trust = self._trust()
            return next(
                (s for s in sorted(inv.steps, reverse=True) if inv.committed_marker(s) and self._passes(s, trust)),
                None,
            )

    def open(self, step: int) -> Bundle:
        """A checked Bundle (marker -> manifest digest -> signature, with a verify key -> listing).

        Raises:
            UncommittedBundleError: the step has no COMMIT (or does not exist).
            CorruptBundleError: a check failed; the message names the file and what differs.
            UnsignedBundleError, BadSignatureError: with a verify key, the bundle is not one it signed for
                this run (both are CorruptBundleErrors).
            NewerFormatError: COMMIT or manifest is of a format this rlckpt does not read (one line).
        """
        validate_step(step)
        self._check_reachable()
        with unavailable_as_store_error(self.url, f"opening step {step}"):
            checked = load_checked(self.backend, self.url, step, trust=self._trust())
            return Bundle(self.backend, self.url, checked.manifest, self.max_workers, commit=checked.marker)

    def records(self, step: int) -> CommitRecords:
        """COMMIT and manifest.json of a committed step exactly as stored, checked as `open` checks them: what
        a replica of the bundle publishes verbatim (replica.py), and what tells two copies of a step apart.

        Raises:
            UncommittedBundleError, CorruptBundleError, NewerFormatError: as `open`.
        """
        validate_step(step)
        self._check_reachable()
        with unavailable_as_store_error(self.url, f"reading the records of step {step}"):
            return load_checked_records(self.backend, self.url, step, trust=self._trust())

    def committed_at(self, step: int) -> float | None:
        """When `step`'s COMMIT was published here (unix seconds, the storage's clock), or None when it has
        none. A replica carries its source's COMMIT bytes, not its time: the two times give the lag between
        tiers (docs/tiers.md)."""
        self._check_reachable()
        with unavailable_as_store_error(self.url, f"reading the COMMIT time of step {step}"):
            try:
                return self.backend.mtime(self.backend.path(step_dirname(step), COMMIT_NAME))
            except FileNotFoundError:
                return None

    def intents(self) -> dict[int, IntentRead]:
        """Every step being written, or left by a writer that died, with its intent (who holds it, since
        when): one listing of the run, then each intent read."""
        self._check_reachable()
        with unavailable_as_store_error(self.url, "listing intents"):
            inv = self.backend.scan()
            reads = (self.claims.read_at(path, mtime) for path, mtime in inv.intents.items())
            return {read.step: read for read in reads if read is not None and read.step is not None}

    def read_intent(self, step: int) -> IntentRead | None:
        """The intent holding `step` (possibly unreadable), or None."""
        with unavailable_as_store_error(self.url, f"reading the intent of step {step}"):
            return self.claims.read(step)

    def entries(self, metadata_keys: Collection[str] = ()) -> list[StoreEntry]:
        """Every step-like thing in the store with its state, ascending by step; a committed one with the
        values its manifest metadata holds under `metadata_keys`."""
        self._check_reachable()
        with unavailable_as_store_error(self.url, "listing entries"):
            inv = self.backend.scan()
            intents: dict[int, IntentRead] = {}
            for path, mtime in inv.intents.items():
                read = self.claims.read_at(path, mtime)
                if read is not None and read.step is not None:
                    intents[read.step] = read
            irregular = inv.irregular_steps()
            steps = set(inv.steps) | set(intents) | set(irregular)
            trust = self._trust()
            found = [
                self._entry(step, inv, intents.get(step), irregular.get(step), metadata_keys, trust)
                for step in sorted(steps)
            ]
        entries, before = [], None
        for entry, files in found:
            if files is not None and before is not None:
                same = sum(e.size for rel, e in files.items() if before.get(rel) == e)
                entry = dataclasses.replace(entry, unchanged=same)
            entries.append(entry)
            before = files if files is not None else before
        return entries

    def _entry(
        self,
        step: int,
        inv: Inventory,
        intent: IntentRead | None,
        irregular: str | None,
        metadata_keys: Collection[str],
        trust: Trust | None,
    ) -> tuple[StoreEntry, dict[str, FileEntry] | None]:
        """The entry of `step`, and the files of its manifest when it is committed."""
        path = self.backend.path(step_dirname(step))
        files = inv.steps.get(step, {})
        data_files = {k: v for k, v in files.items() if k not in (COMMIT_NAME, MANIFEST_NAME)}
        if intent is not None and COMMIT_NAME not in files:
            staged = self.backend.staged_sizes(inv, step, intent.txid or "")
            reason = self.claims.stale_reason(intent)
            started = intent.intent.started if intent.intent else intent.mtime
            created = None if started is None else _iso(started)
            detail = intent.describe() + (f": {reason}" if reason else "")
            state = "stale" if reason else "writing"
            return StoreEntry(step, state, sum(staged.values()), len(staged), created, intent.txid, detail, path), None

        def unread(
            state: str, detail: str, signature: str | None = None
        ) -> tuple[StoreEntry, dict[str, FileEntry] | None]:
            """An entry whose records were not read (or did not read): what the listing says of it."""
            return StoreEntry(
                step, state, sum(files.values()), len(data_files), None, None, detail, path, signature=signature
            ), None

        if irregular is not None:
            return unread("corrupt", f"step {step} at {self.url}: {irregular}")
        if COMMIT_NAME not in files:
            return unread("uncommitted", "no COMMIT")
        try:
            checked = load_checked(self.backend, self.url, step, trust=trust)
        except (CorruptBundleError, UncommittedBundleError) as exc:
            bad = "bad" if isinstance(exc, BadSignatureError) else None
            return unread("corrupt", str(exc), "unsigned" if isinstance(exc, UnsignedBundleError) else bad)
        except NewerFormatError as exc:
            return unread("newer", str(exc))
        manifest, marker = checked.manifest, checked.marker
        committed = StoreEntry(
            step,
            "committed",
            manifest.total_size,
            len(manifest.files),
            manifest.created,
            manifest.txid,
            "",
            path,
            manifest_format=manifest.format,
            digest="+".join(manifest.digest_algorithms) or None,
            writer_version=manifest.writer_version,
            metadata={key: manifest.metadata[key] for key in metadata_keys if key in manifest.metadata},
            signature="unsigned" if marker.signature is None else "signed",
            signed_by=None if marker.signature is None else marker.signature.key_id,
            run=marker.run,
            manifest_digest=str(marker.manifest),
        )
        return committed, manifest.files

    # --- maintenance --------------------------------------------------------------------------
    def gc(
        self,
        keep_last: int | None = None,
        dry_run: bool = False,
        stale_after: float | None = None,
        max_workers: int | None = None,
        retention: Retention | None = None,
    ) -> GcReport:
        """Remove debris of dead transactions and committed bundles no retention rule keeps: with `keep_last`
        (or `retention`, retention.py: the K newest, every N-th step, the K best by a metric, the caller's
        holds). The newest bundle that fully verifies is always kept. A dry run is the same plan, not
        applied. `max_workers` caps the threads that read and remove files (default: the store's).

        Raises:
            ValueError: `keep_last` is not an int >= 1, a rule of `retention` is malformed, or both are given.
            StoreUnavailableError: the store cannot be reached.
        """
        if retention is not None and keep_last is not None:
            raise ValueError("gc takes keep_last or a retention, not both")
        rules = retention if retention is not None else Retention(keep_last=keep_last)
        self._check_reachable()
        with unavailable_as_store_error(self.url, "collecting garbage"):
            collector = GarbageCollector(
                self.backend, self.claims, self.url, max_workers or self.max_workers, trust=self._trust()
            )
            plan = collector.plan(rules, self.stale_after if stale_after is None else stale_after)
            return collector.report(plan, dry_run=True) if dry_run else collector.apply(plan)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
