"""Participants: many writers, one commit. The coordinator hands a TransactionHandle (plain data) to each
participant; a participant joins (BundleStore.join), writes its files straight into the transaction's
data root — never through the coordinator — and seals them into a Receipt (plain data), which the
coordinator passes to commit(). See docs/store-protocol.md, "Participants"."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from rlckpt.errors import BundleExistsError, InvalidPathError, TransactionStateError

from .backends import Backend
from .claims import Claims
from .files import FileWriter
from .manifest import FileEntry, parse_file_entry
from .paths import is_txid, validate_relpath, validate_step
from .storage_errors import unavailable_as_store_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TransactionHandle:
    """Where and which transaction to join: the run URL, its storage options, the step and the txid."""

    url: str
    storage_options: dict[str, Any]
    step: int
    txid: str

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": dict(self.storage_options), "step": self.step, "txid": self.txid}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TransactionHandle:
        if (
            not is_txid(obj.get("txid"))
            or not isinstance(obj.get("url"), str)
            or not isinstance(obj.get("storage_options"), dict)
        ):
            raise ValueError(f"not a transaction handle: {obj!r}")
        return cls(obj["url"], dict(obj["storage_options"]), validate_step(obj.get("step")), obj["txid"])


@dataclass(frozen=True)
class Receipt:
    """What one participant wrote into one transaction: relpath -> entry (stored size, sha256, ...)."""

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
        if (
            not is_txid(obj.get("txid"))
            or not is_txid(obj.get("participant"))
            or not isinstance(obj.get("files"), dict)
        ):
            raise ValueError(f"not a receipt: {obj!r}")
        files = {validate_relpath(rel): parse_file_entry(rel, raw) for rel, raw in obj["files"].items()}
        return cls(obj["txid"], obj["participant"], files)


class ParticipantWriter(FileWriter):
    """One participant's writer in a transaction it does not coordinate. Its files are part of the bundle
    only if its receipt reaches the coordinator's commit."""

    def __init__(
        self, backend: Backend, claims: Claims, url: str, handle: TransactionHandle, participant: str, max_workers: int
    ) -> None:
        super().__init__(backend, url, handle.step, handle.txid, max_workers, who=f"participant {participant}")
        self.claims = claims
        self.participant = participant

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
        files = self._finished_files()
        try:
            with unavailable_as_store_error(self.url, f"sealing {self.who} of step {self.step}"):
                self.claims.assert_owner(self.step, self.txid)
        except BundleExistsError as exc:
            self.abort()
            raise TransactionStateError(
                f"{self.who}: transaction {self.txid} of step {self.step} is not running any more ({exc})"
            ) from exc
        self._stop("sealed")
        log.info("%s sealed %d files of step %s (txid %s)", self.who, len(files), self.step, self.txid)
        return Receipt(self.txid, self.participant, files)

    def abort(self) -> None:
        """Remove what this participant wrote (best effort; gc removes what is left with the transaction)."""
        with self._lock:
            if self._state != "open":
                return
        self._discard_open(self._stop("aborted"))
        for rel in sorted(self._files):
            try:
                self.backend.remove_tree(f"{self._data_root}/{rel}")
            except Exception:
                log.warning("%s: removing %s failed", self.who, rel, exc_info=True)


def validate_participant(name: object) -> str:
    """A participant name is a plain name ([A-Za-z0-9_-]{1,64}): it appears in errors and receipts."""
    if not is_txid(name):
        raise InvalidPathError(f"participant name must be 1-64 of [A-Za-z0-9_-], got {name!r}")
    return name  # type: ignore[return-value]
