"""BundleTransaction: the coordinator of one save. It holds the step's claim, writes files of its own,
hands a handle to participants (participant.py) and commits once for all, or aborts everything."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from rlckpt.errors import (
    CorruptBundleError,
    LostWriteError,
    ParticipantError,
    ReplicaError,
    TransactionStateError,
    UnreadableBundleError,
)
from rlckpt.formats import quoted
from rlckpt.store.backends import Backend
from rlckpt.store.commit.claims import Claims
from rlckpt.store.commit.commit_check import CommitRecords, Trust, check_records, listing_problem
from rlckpt.store.commit.participant import Receipt, TransactionHandle, checked_receipt
from rlckpt.store.io.digest import Digest
from rlckpt.store.io.files import FileWriter
from rlckpt.store.io.readback import stored_digest
from rlckpt.store.io.reuse import ReuseBase
from rlckpt.store.io.storage_errors import unavailable_as_store_error
from rlckpt.store.paths.path_set import PathSet
from rlckpt.store.paths.paths import validate_relpath
from rlckpt.store.records.manifest import (
    CommitMarker,
    CommitSignature,
    FileEntry,
    Manifest,
    canonical_json,
    check_metadata,
)
from rlckpt.store.records.roster import Roster, RosterState
from rlckpt.store.signing import SigningKey, bundle_message

log = logging.getLogger(__name__)


class BundleTransaction(FileWriter):
    """One save of one step, holding the step's claim. Leaving the `with` block without commit() (or with
    an exception) aborts. Its COMMIT names `run_id` and, given a `signing_key`, is signed with it: only
    the coordinator holds the key, never a participant (the handle does not carry it)."""

    def __init__(
        self,
        backend: Backend,
        claims: Claims,
        url: str,
        step: int,
        txid: str,
        max_workers: int,
        storage_options: dict[str, Any] | None = None,
        *,
        run_id: str,
        signing_key: SigningKey | None = None,
        base: ReuseBase | None = None,
    ) -> None:
        super().__init__(backend, url, step, txid, max_workers, who="transaction", base=base)
        self.claims = claims
        self.roster = Roster(backend, url, step, txid)
        self.storage_options = dict(storage_options or {})
        self.run_id = run_id
        self._signing_key = signing_key

    def __enter__(self) -> BundleTransaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._state != "open":
            return
        try:
            self.abort()
        except Exception:
            if exc_type is None:
                raise
            log.exception("abort of step %s (txid %s) failed after an error; gc will clean up", self.step, self.txid)

    def handle(self) -> TransactionHandle:
        """What a participant process needs to join this transaction (`BundleStore.join`): plain data."""
        self._check_open()
        base = self.base
        return TransactionHandle(
            url=self.url,
            storage_options=dict(self.storage_options),
            step=self.step,
            txid=self.txid,
            base_step=None if base is None else base.step,
            base_txid=None if base is None else base.txid,
        )

    # --- ending -------------------------------------------------------------------------------
    def commit(
        self,
        metadata: dict[str, Any] | None = None,
        *,
        receipts: Iterable[Receipt] = (),
        participants: Collection[str] | None = None,
    ) -> Manifest:
        """Publish the bundle: the coordinator's files and every participant's, as one manifest and COMMIT.

        Everything a reader will check is checked first, on what is about to be published: every receipt
        entry, path clashes, the manifest's and COMMIT's caps and form, then (roster closed, every joined
        participant sealed, claim re-checked) the listing: every file in place with its size, nothing
        else. Only then do manifest.json and COMMIT go out (atomically visible). Any refusal aborts the
        whole transaction: nothing is published. File contents are not read again: a receipt's digests
        are its participant's word, checked by every read and by `Bundle.verify`.

        Args:
            metadata: JSON-able user metadata for the manifest.
            receipts: what each participant sealed.
            participants: the participants expected, each exactly once (None: whoever sent a receipt).
        Returns:
            The committed manifest.
        Raises:
            TransactionStateError: files are still open, or the transaction already ended.
            ParticipantError: a participant missing, duplicated, unexpected or not sealed (one that joined
                may still write), a receipt of another transaction or malformed, a path written twice or a
                file where another path needs a directory.
            UnreadableBundleError: readers would refuse the manifest (over its cap: too many files or
                too much metadata; metadata nested too deeply).
            TypeError, ValueError: the metadata is not JSON (or holds NaN or an infinity).
            BundleExistsError: the claim was lost, or another writer committed the step.
            LostWriteError: a written file is missing, resized, or joined by a stranger.
        """
        own = self._close_writes("committing")  # no write of the coordinator's can begin from here on
        return self._end(lambda: self._publish(own, metadata, list(receipts), participants))

    def commit_replica(self, records: CommitRecords) -> Manifest:
        """Publish a replica: another store's committed bundle, whose COMMIT and manifest.json bytes are
        published verbatim (digests, and signatures where COMMIT has one, carried, never recomputed) over
        the files copied here. The checks of every commit run on them, the same code path as `commit`:
        the readers' check of both records and their caps, the claim, the roster, the listing equal to the
        manifest. And the files written (or adopted) here must be the manifest's: the same paths, each of
        its stored size and, where hashed under the manifest's algorithm, of its digest.

        Args:
            records: the source's records (`CommitRecords`); their step and txid must be this transaction's.
        Returns:
            The committed manifest (the source's).
        Raises:
            ReplicaError: the records are not of this step and txid or do not pass the readers' check, or
                the files here are not the manifest's. Nothing is published (the transaction is aborted).
            and what `commit` raises (BundleExistsError, LostWriteError, TransactionStateError).
        """
        own = self._close_writes("committing")
        return self._end(lambda: self._publish_replica(own, records))

    def _end(self, publish: Callable[[], tuple[Manifest, RosterState]]) -> Manifest:
        """Run `publish`; on success release the claim and the roster, on any failure abort everything."""
        try:
            manifest, roster = publish()
        except BaseException:
            try:
                self.abort()
            except Exception:
                log.warning("abort after a refused commit of step %s failed", self.step, exc_info=True)
            raise
        self._stop("committed")
        self.claims.release(self.step, self.txid, committed=True)
        self.roster.remove(roster)
        log.info("committed step %s (%d files, txid %s) at %s", self.step, len(manifest.files), self.txid, self.url)
        if self.base is not None:
            reused = self.reused
            log.info(
                "step %s: the coordinator took %d unchanged files (%d bytes) from %s",
                self.step,
                len(reused),
                sum(e.size for e in reused.values()),
                self.base.describe(),
            )
        return manifest

    def _publish(
        self,
        own: dict[str, FileEntry],
        metadata: dict[str, Any] | None,
        receipts: list[Receipt],
        participants: Collection[str] | None,
    ) -> tuple[Manifest, RosterState]:
        where = f"step {self.step} (txid {self.txid}) at {self.url}"
        self._wait_durable()  # nothing is published before every file of the coordinator's is durable
        receipts = [checked_receipt(r, where) for r in receipts]
        files = self._merge(own, receipts, participants, where)
        meta = dict(metadata or {})
        try:
            check_metadata(meta)  # TypeError/ValueError: non-JSON metadata, before anything is published
        except UnreadableBundleError as exc:
            raise UnreadableBundleError(f"{where}: {exc}; nothing committed") from None
        manifest = Manifest(
            step=self.step,
            txid=self.txid,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            files=files,
            metadata=meta,
            format=Manifest.format_for(files),
        )
        manifest_bytes = manifest.to_bytes()
        marker = self._marker(Digest.of(manifest_bytes))
        # what every reader decides, on these bytes (and a reader with the signing key's public half)
        trust = None if self._signing_key is None else Trust(self._signing_key.public, self.run_id)
        try:
            check_records(self.step, marker, manifest_bytes, where, trust)
        except CorruptBundleError as exc:
            raise UnreadableBundleError(
                f"{exc}: readers would refuse this bundle ({len(files)} files, "
                f"{len(canonical_json(meta))} bytes of metadata); nothing committed"
            ) from exc
        return manifest, self._make_visible(files, receipts, manifest_bytes, marker, where)

    def _publish_replica(self, own: dict[str, FileEntry], records: CommitRecords) -> tuple[Manifest, RosterState]:
        where = f"replica of step {self.step} (txid {self.txid}) at {self.url}"
        self._wait_durable()  # as a commit: every file in place and durable (uploads finish in the background)
        try:
            checked = check_records(self.step, records.marker, records.manifest_bytes, where)
        except CorruptBundleError as exc:
            raise ReplicaError(f"{exc}: readers would refuse these records; nothing committed") from exc
        manifest = checked.manifest
        if checked.marker.run is not None and checked.marker.run != self.run_id:
            raise ReplicaError(
                f"{where}: the records are of run {checked.marker.run}, this store is run {self.run_id} (its "
                "_run.json): a reader with the verify key would refuse the copy; nothing committed"
            )
        if manifest.txid != self.txid:
            raise ReplicaError(
                f"{where}: the records are of transaction {manifest.txid}; a replica runs under the txid its "
                "manifest names; nothing committed"
            )
        problem = _copy_problem(own, manifest.files)
        if problem is not None:
            raise ReplicaError(f"{where}: {problem}; nothing committed")
        return manifest, self._make_visible(manifest.files, [], records.manifest_bytes, records.marker, where)

    def _make_visible(
        self, files: dict[str, FileEntry], receipts: list[Receipt], manifest_bytes: bytes, marker: bytes, where: str
    ) -> RosterState:
        """The storage part of every commit: close the roster (every joined participant sealed), re-check
        the claim, list the bundle as readers will (exactly `files`), then manifest and COMMIT."""
        with self._storage("committing"):
            roster = self.roster.close()
            self._check_roster(roster, receipts, where)
            self.claims.assert_owner(self.step, self.txid)
            problem = listing_problem(files, self.backend.written_view(self._step_dir, self.txid))
            if problem is not None:
                raise LostWriteError(
                    f"{where}: {problem}: the transaction's files changed behind its back (removed, replaced "
                    "or added by gc or another writer?); nothing committed"
                )
            self.backend.make_visible(self._step_dir, self.txid, manifest_bytes, marker)
        return roster

    def _marker(self, manifest: Digest) -> bytes:
        """COMMIT's bytes: this run's id, the manifest's digest and, with a signing key, the signature of
        the three (signing.bundle_message)."""
        signature = None
        if self._signing_key is not None:
            value = self._signing_key.sign(bundle_message(self.run_id, self.step, manifest))
            signature = CommitSignature(key_id=self._signing_key.key_id, value=value)
        return CommitMarker(
            step=self.step, txid=self.txid, manifest=manifest, run=self.run_id, signature=signature
        ).to_bytes()

    @staticmethod
    def _check_roster(roster: RosterState, receipts: list[Receipt], where: str) -> None:
        """Every participant that joined has sealed (none can write into the bundle once it is
        committed), and sent its receipt here; every receipt comes from a participant that sealed."""
        if roster.unsealed:
            raise ParticipantError(
                f"{where}: participant(s) {roster.unsealed[:10]} joined and have not sealed (still writing, or "
                "failed without aborting); nothing committed"
            )
        sent = {r.participant for r in receipts}
        unsent, unsealed = sorted(roster.sealed - sent), sorted(sent - roster.sealed)
        if unsent:
            raise ParticipantError(
                f"{where}: participant(s) {unsent[:10]} sealed but their receipts are not among those committed; "
                "nothing committed"
            )
        if unsealed:
            raise ParticipantError(
                f"{where}: receipt(s) of participant(s) {unsealed[:10]}, which never sealed in this transaction; "
                "nothing committed"
            )

    def _merge(
        self,
        own: dict[str, FileEntry],
        receipts: list[Receipt],
        participants: Collection[str] | None,
        where: str,
    ) -> dict[str, FileEntry]:
        """The coordinator's files and the receipts' as one file set; ParticipantError on any disagreement.
        Linear in the number of receipts and files."""
        counts = Counter(r.participant for r in receipts)
        duplicated = sorted(n for n, c in counts.items() if c > 1)
        if duplicated:
            raise ParticipantError(
                f"{where}: participant {duplicated[0]} sent more than one receipt; nothing committed"
            )
        if participants is not None:
            expected = set(participants)
            missing, unexpected = sorted(expected - counts.keys()), sorted(counts.keys() - expected)
            if missing:
                raise ParticipantError(f"{where}: no receipt from participant(s) {missing}; nothing committed")
            if unexpected:
                raise ParticipantError(
                    f"{where}: receipt(s) from unexpected participant(s) {unexpected}; nothing committed"
                )
        paths = PathSet()
        for rel in own:
            paths.add(rel, "the coordinator")
        merged = dict(own)
        for receipt in receipts:
            if receipt.txid != self.txid:
                raise ParticipantError(
                    f"{where}: participant {receipt.participant} sent a receipt of transaction {receipt.txid}; "
                    "nothing committed"
                )
            writer = f"participant {receipt.participant}"
            for rel, entry in receipt.files.items():
                clash = paths.add(rel, writer)
                if clash is not None and clash.duplicate:
                    raise ParticipantError(
                        f"{where}: {rel} was written by {clash.other_owner} and by {writer}; nothing committed"
                    )
                if clash is not None:
                    raise ParticipantError(
                        f"{where}: {clash.describe()} ({quoted(rel)} written by {writer}, {quoted(clash.other)} by "
                        f"{clash.other_owner}); nothing committed"
                    )
                merged[rel] = entry
        return merged

    # --- resuming a replica (replica.py) -----------------------------------------------------------
    def files_in_place(self) -> dict[str, int]:
        """Files already in this transaction's data root, relpath -> stored size: what a dead earlier
        transaction of the same txid wrote, which `BundleStore.begin` leaves for a replica to resume. A
        transaction of a fresh txid has none."""
        with self._storage("listing what is already written"):
            return dict(self.backend.list_files(self._data_root).sizes)

    def adopt(self, relpath: str, entry: FileEntry) -> bool:
        """Count a file already in the data root (`files_in_place`) as written with `entry`, once it has been
        read back and its stored size and digest (under the entry's algorithm) are the entry's; it is then
        made as durable as a file written here. Returns whether it was adopted: one that was not stays where
        it is, to be written over."""
        validate_relpath(relpath)
        path = f"{self._data_root}/{relpath}"
        with self._storage(f"reading back {relpath}"):
            digest, size = stored_digest(self.backend, path, entry.digest.algorithm, entry.size)
            if size != entry.size or digest != entry.digest:
                return False
            self.backend.make_durable(path)
        with self._lock:
            self._check_open()
            self._reserve(relpath)
            self._files[relpath] = entry
        return True

    def abort(self) -> None:
        """Remove everything this transaction and its participants wrote, and its intent. Idempotent;
        refused after commit."""
        with self._lock:
            if self._state == "committed":
                raise TransactionStateError(f"step {self.step} (txid {self.txid}) is committed; cannot abort")
            if self._state == "aborted":
                return
        self._discard_open(self._stop("aborted"))
        with unavailable_as_store_error(self.url, f"aborting step {self.step}"):
            self.backend.discard(self._step_dir, self.txid)
        self.claims.release(self.step, self.txid)
        self.roster.remove()
        log.info("aborted step %s (txid %s) at %s", self.step, self.txid, self.url)


def _copy_problem(written: Mapping[str, FileEntry], files: Mapping[str, FileEntry]) -> str | None:
    """How the files a replica wrote differ from its manifest's, or None. A digest is compared where it was
    taken under the manifest's algorithm (a file written here is hashed with the one new bundles use; the
    bytes of a sha256 bundle were checked against its manifest as they were read)."""
    missing = sorted(files.keys() - written.keys())
    if missing:
        return f"{missing[0]} is in the manifest but was not copied (missing: {missing[:10]})"
    extra = sorted(written.keys() - files.keys())
    if extra:
        return f"{extra[0]} was written but is not in the manifest (extra: {extra[:10]})"
    for rel, entry in sorted(written.items()):
        want = files[rel]
        if entry.size != want.size:
            return f"{rel} was copied as {entry.size} bytes, the manifest says {want.size}"
        if entry.digest.algorithm == want.digest.algorithm and entry.digest != want.digest:
            return f"{rel} was copied with {entry.digest}, the manifest says {want.digest}"
    return None
