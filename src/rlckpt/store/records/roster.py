"""The roster of a transaction: which participants joined and which of them sealed, as empty-ish marker
objects under `_txn/<txid>/`, so that a commit can refuse while any participant may still write.

A participant that has not sealed could otherwise write into the bundle after its COMMIT (on an object
store its txid prefix *is* the bundle's root; on local disk an open file follows the staging dir's
rename), and its abort would remove committed files. So:

- join:   create `joined/<name>` (create-exclusive: one process per name), then look for `closed`;
- seal:   create `sealed/<name>` (after which the participant writes nothing more);
- commit: create `closed`, then list the roster: every joined participant must have sealed.

Join writes its marker before it looks, the commit closes before it lists: whichever comes second
sees the other (listings are strongly consistent), so a participant joining during a commit is either
in the listing (and, unsealed, stops the commit) or sees `closed` and does not join.

Markers coordinate live processes only: they are not fsynced, and what a crash leaves is debris that gc
removes once no intent names the transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rlckpt.errors import ParticipantError, TransactionStateError
from rlckpt.store.backends import Backend
from rlckpt.store.paths.paths import TXN_DIR

log = logging.getLogger(__name__)

JOINED = "joined"
SEALED = "sealed"
CLOSED = "closed"


@dataclass(frozen=True)
class RosterState:
    """What a closed roster held: the names that joined, those that sealed, and every marker listed
    (relative to the roster), so that it can be removed without listing it again."""

    joined: frozenset[str]
    sealed: frozenset[str]
    markers: tuple[str, ...] = ()

    @property
    def unsealed(self) -> list[str]:
        return sorted(self.joined - self.sealed)


class Roster:
    """The roster of transaction `txid` of `step`."""

    def __init__(self, backend: Backend, url: str, step: int, txid: str) -> None:
        self.backend = backend
        self.where = f"transaction {txid} of step {step} at {url}"
        self.root = backend.path(TXN_DIR, txid)

    def _marker(self, kind: str, name: str = "") -> str:
        return f"{self.root}/{kind}/{name}" if name else f"{self.root}/{kind}"

    def join(self, participant: str) -> None:
        """Enter `participant`; TransactionStateError if the transaction is committing or ended with its
        roster closed, ParticipantError if a participant of that name already joined."""
        try:
            self.backend.create_marker(self._marker(JOINED, participant), participant.encode())
        except FileExistsError:
            raise ParticipantError(
                f"participant {participant} already joined {self.where} (two processes with one name?)"
            ) from None
        if self.backend.read_or_none(self._marker(CLOSED), 64, "roster marker") is not None:
            self.leave(participant)
            raise TransactionStateError(
                f"participant {participant} cannot join {self.where}: it is committing or has ended"
            )

    def seal(self, participant: str) -> None:
        """Record that `participant` sealed: it writes nothing more into this transaction."""
        self.backend.create_marker(self._marker(SEALED, participant), participant.encode())

    def leave(self, participant: str) -> None:
        """Take `participant` off the roster (it aborted and removed its files; it is no part of the commit)."""
        for kind in (SEALED, JOINED):
            try:
                self.backend.remove_file(self._marker(kind, participant))
            except FileNotFoundError:
                pass

    def close(self) -> RosterState:
        """Close the roster to new participants, then read who joined and who sealed."""
        try:
            self.backend.create_marker(self._marker(CLOSED), CLOSED.encode())
        except FileExistsError:
            pass  # closed by an earlier attempt of this commit
        listed = self.backend.list_files(self.root).sizes
        names: dict[str, set[str]] = {JOINED: set(), SEALED: set()}
        for rel in listed:
            kind, _, name = rel.partition("/")
            if kind in names and name and "/" not in name:
                names[kind].add(name)
        return RosterState(frozenset(names[JOINED]), frozenset(names[SEALED]), tuple(sorted({*listed, CLOSED})))

    def remove(self, closed: RosterState | None = None) -> None:
        """Remove the roster once the transaction has ended (best effort: gc removes what is left). After
        a commit the listing `closed` took is all there is (nobody joins a closed roster and stays), so
        object stores delete exactly those markers instead of listing the roster again."""
        try:
            if closed is None:
                self.backend.remove_tree(self.root)
            else:
                self.backend.remove_listed(self.root, closed.markers)
        except Exception:
            log.warning("could not remove the roster of %s", self.where, exc_info=True)
