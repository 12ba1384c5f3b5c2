"""BundleTransaction: the coordinator of one save. It holds the step's claim, writes files of its own,
hands a handle to participants (participant.py) and commits once for all, or aborts everything."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from typing import Any

from rlckpt.errors import ParticipantError, TransactionStateError

from .backends import Backend
from .claims import Claims
from .files import FileWriter
from .manifest import CommitMarker, FileEntry, Manifest, canonical_json, sha256_hex
from .participant import Receipt, TransactionHandle
from .storage_errors import unavailable_as_store_error

log = logging.getLogger(__name__)


class BundleTransaction(FileWriter):
    """One save of one step, holding the step's claim. Leaving the `with` block without commit() (or with
    an exception) aborts."""

    def __init__(
        self,
        backend: Backend,
        claims: Claims,
        url: str,
        step: int,
        txid: str,
        max_workers: int,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(backend, url, step, txid, max_workers, who="transaction")
        self.claims = claims
        self.storage_options = dict(storage_options or {})

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
        return TransactionHandle(
            url=self.url, storage_options=dict(self.storage_options), step=self.step, txid=self.txid
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

        The claim is re-checked, every file is seen in place with its size, then manifest.json and COMMIT
        go out (atomically visible). Any refusal aborts the whole transaction: nothing is published.

        Args:
            metadata: JSON-able user metadata for the manifest.
            receipts: what each participant sealed.
            participants: the participants expected, each exactly once (None: whoever sent a receipt).
        Returns:
            The committed manifest.
        Raises:
            TransactionStateError: files are still open, or the transaction already ended.
            ParticipantError: a participant missing, duplicated or unexpected, a receipt of another
                transaction, or a path written twice.
            BundleExistsError: the claim was lost, or another writer committed the step.
            LostWriteError: a written file is missing, resized, or joined by a stranger.
        """
        try:
            files = self._merge(self._finished_files(), list(receipts), participants)
            meta = dict(metadata or {})
            canonical_json(meta)  # refuse non-JSON metadata before anything is published
        except (ParticipantError, TypeError, ValueError):
            self.abort()
            raise
        manifest = Manifest(
            step=self.step,
            txid=self.txid,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            files=files,
            metadata=meta,
        )
        manifest_bytes = manifest.to_bytes()
        marker = CommitMarker(step=self.step, txid=self.txid, manifest_sha256=sha256_hex(manifest_bytes))
        try:
            with self._storage("committing"):
                self.claims.assert_owner(self.step, self.txid)
                self.backend.publish(self._step_dir, self.txid, manifest_bytes, marker.to_bytes(), files)
        except BaseException:
            try:
                self.abort()
            except Exception:
                log.warning("abort after failed commit of step %s failed", self.step, exc_info=True)
            raise
        self._stop("committed")
        self.claims.release(self.step, self.txid, committed=True)
        log.info("committed step %s (%d files, txid %s) at %s", self.step, len(files), self.txid, self.url)
        return manifest

    def _merge(
        self, own: dict[str, FileEntry], receipts: list[Receipt], participants: Collection[str] | None
    ) -> dict[str, FileEntry]:
        """The coordinator's files and the receipts' as one file set; ParticipantError on any disagreement."""
        where = f"step {self.step} (txid {self.txid})"
        names = [r.participant for r in receipts]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ParticipantError(
                f"{where}: participant {duplicated[0]} sent more than one receipt; nothing committed"
            )
        if participants is not None:
            missing, unexpected = sorted(set(participants) - set(names)), sorted(set(names) - set(participants))
            if missing:
                raise ParticipantError(f"{where}: no receipt from participant(s) {missing}; nothing committed")
            if unexpected:
                raise ParticipantError(
                    f"{where}: receipt(s) from unexpected participant(s) {unexpected}; nothing committed"
                )
        owner = {rel: "the coordinator" for rel in own}
        merged = dict(own)
        for receipt in receipts:
            if receipt.txid != self.txid:
                raise ParticipantError(
                    f"{where}: participant {receipt.participant} sent a receipt of transaction {receipt.txid}; "
                    "nothing committed"
                )
            for rel, entry in receipt.files.items():
                if rel in owner:
                    raise ParticipantError(
                        f"{where}: {rel} was written by {owner[rel]} and by participant {receipt.participant}; "
                        "nothing committed"
                    )
                owner[rel] = f"participant {receipt.participant}"
                merged[rel] = entry
        return merged

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
        log.info("aborted step %s (txid %s) at %s", self.step, self.txid, self.url)
