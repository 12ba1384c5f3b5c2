"""Participants: many writers, one commit. The coordinator hands a TransactionHandle (plain data) to each
participant; a participant joins (BundleStore.join), writes its files straight into the transaction's
data root — never through the coordinator — and seals them into a Receipt (plain data), which the
coordinator passes to commit(). See docs/store-protocol.md, "Participants"."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from rlckpt.errors import BundleExistsError, InvalidPathError, ParticipantError, TransactionStateError
from rlckpt.formats import MapKey, Refusal, quoted
from rlckpt.store.backends import Backend
from rlckpt.store.commit.claims import Claims
from rlckpt.store.io.files import FileWriter
from rlckpt.store.io.reuse import ReuseBase
from rlckpt.store.io.storage_errors import unavailable_as_store_error
from rlckpt.store.paths.paths import is_txid, validate_relpath, validate_step
from rlckpt.store.records.manifest import FileEntry, read_file_entry
from rlckpt.store.records.roster import Roster

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TransactionHandle:
    """Where and which transaction to join: the run URL, its storage options, the step and the txid, and the
    bundle (step and txid) unchanged files may be taken from when the save reuses them (reuse.py)."""

    url: str
    storage_options: dict[str, Any]
    step: int
    txid: str
    base_step: int | None = None
    base_txid: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "storage_options": dict(self.storage_options),
            "step": self.step,
            "txid": self.txid,
            "base_step": self.base_step,
            "base_txid": self.base_txid,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TransactionHandle:
        if (
            not is_txid(obj.get("txid"))
            or not isinstance(obj.get("url"), str)
            or not isinstance(obj.get("storage_options"), dict)
        ):
            raise ValueError(f"not a transaction handle: {obj!r}")
        base_step, base_txid = obj.get("base_step"), obj.get("base_txid")
        if (base_step is None) != (base_txid is None) or (base_txid is not None and not is_txid(base_txid)):
            raise ValueError(f"not a transaction handle (its base): {obj!r}")
        return cls(
            obj["url"],
            dict(obj["storage_options"]),
            validate_step(obj.get("step")),
            obj["txid"],
            None if base_step is None else validate_step(base_step),
            base_txid,
        )


@dataclass(frozen=True)
class Receipt:
    """What one participant wrote into one transaction: relpath -> entry (stored size, digest, ...)."""

    txid: str
    participant: str
    files: dict[str, FileEntry] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "txid": self.txid,
            "participant": self.participant,
            "files": {p: e.to_json() for p, e in sorted(self.files.items())},
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Receipt:
        """Parse a receipt, each entry exactly as the manifest reader parses it (ValueError naming what is wrong)."""
        if not isinstance(obj, dict):
            raise ValueError(f"a receipt is a JSON object, got {type(obj).__name__}")
        for key in ("txid", "participant"):
            if not is_txid(obj.get(key)):
                raise ValueError(f"receipt has a bad {key}: {quoted(obj.get(key))}")
        if not isinstance(obj.get("files"), dict):
            raise ValueError(f"receipt 'files' is not an object: {type(obj.get('files')).__name__}")
        files: dict[str, FileEntry] = {}
        for rel, raw in obj["files"].items():
            try:
                files[validate_relpath(rel)] = read_file_entry(raw)
            except Refusal as refusal:
                refusal.steps[:0] = ["files", MapKey(rel)]
                raise ValueError(f"receipt: {refusal}") from None
        return cls(obj["txid"], obj["participant"], files)


def checked_receipt(receipt: object, where: str) -> Receipt:
    """`receipt` as a reader of the manifest will see its entries, or ParticipantError. Receipts reach
    the coordinator as objects (over Ray, unpickled), so commit parses each one through its JSON form:
    the very check `Receipt.from_json` and the manifest reader make, not a copy of it."""
    if not isinstance(receipt, Receipt):
        raise ParticipantError(f"{where}: {type(receipt).__name__} is not a Receipt; nothing committed")
    try:
        return Receipt.from_json(receipt.to_json())
    except (AttributeError, TypeError, ValueError) as exc:  # InvalidPathError is a ValueError
        raise ParticipantError(
            f"{where}: the receipt of participant {quoted(receipt.participant)} is malformed: {exc}; nothing committed"
        ) from exc


class ParticipantWriter(FileWriter):
    """One participant's writer in a transaction it does not coordinate. Its files are part of the bundle
    only if its receipt reaches the coordinator's commit; until it seals (or aborts) the commit waits for
    nothing but refuses (roster.py)."""

    def __init__(
        self,
        backend: Backend,
        claims: Claims,
        url: str,
        handle: TransactionHandle,
        participant: str,
        max_workers: int,
        roster: Roster,
        base: ReuseBase | None = None,
    ) -> None:
        super().__init__(
            backend, url, handle.step, handle.txid, max_workers, who=f"participant {participant}", base=base
        )
        self.claims = claims
        self.participant = participant
        self.roster = roster

    def __enter__(self) -> ParticipantWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._state == "open":
            self.abort()

    def seal(self) -> Receipt:
        """Close the participant's part: no more writes; the receipt for the coordinator's commit.

        Raises:
            TransactionStateError: files are still open, or the transaction no longer holds its step (it
                was aborted or taken over): the files are discarded and no receipt is given.
        """
        files = self._close_writes("sealing")
        try:
            self._wait_durable()  # a receipt lists only files on disk for good
            with unavailable_as_store_error(self.url, f"sealing {self.who} of step {self.step}"):
                self.claims.assert_owner(self.step, self.txid)
                self.roster.seal(self.participant)
        except BundleExistsError as exc:
            self.abort()
            raise TransactionStateError(
                f"{self.who}: transaction {self.txid} of step {self.step} is not running any more ({exc})"
            ) from exc
        except BaseException:
            self.abort()
            raise
        self._stop("sealed")
        log.info("%s sealed %d files of step %s (txid %s)", self.who, len(files), self.step, self.txid)
        return Receipt(self.txid, self.participant, files)

    def abort(self) -> None:
        """Remove what this participant wrote, then leave the roster (best effort; gc removes what is left
        with the transaction). A sealed participant's files belong to the commit: nothing is removed."""
        with self._lock:
            if self._state not in ("open", "sealing"):
                return
        self._discard_open(self._stop("aborted"))
        for rel in sorted(self._files):
            try:
                self.backend.remove_file(f"{self._data_root}/{rel}")  # only the file: a path under it is not ours
            except FileNotFoundError:
                pass
            except Exception:
                log.warning("%s: removing %s failed", self.who, rel, exc_info=True)
        try:
            self.roster.leave(self.participant)
        except Exception:
            log.warning("%s: leaving the roster of step %s failed", self.who, self.step, exc_info=True)


def validate_participant(name: object) -> str:
    """A participant name is a plain name ([A-Za-z0-9_-]{1,64}): it appears in errors and receipts."""
    if not is_txid(name):
        raise InvalidPathError(f"participant name must be 1-64 of [A-Za-z0-9_-], got {quoted(name)}")
    return name  # type: ignore[return-value]
