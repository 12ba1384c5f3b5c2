"""The restore phase: makes the restore order (docs/architecture.md, Restore) an assertion.

The bootstrap data-plane client must restore TransferQueue (restore step 3) before any
connect-only client or replay buffer exists (step 4); the order of statements in a setup function
is not enough to keep it. Builders of those objects call ``require_ready`` and raise
RestoreOrderError when the restore has not finished.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

from rlckpt.errors import RestoreOrderError

logger = logging.getLogger(__name__)


class Phase(enum.Enum):
    """Where the driver is in setup: ready means the data plane may now be shared."""

    NOT_STARTED = "not_started"
    RESTORING = "restoring"
    RESTORED = "restored"  # a bundle was restored into the data plane
    FRESH = "fresh"  # nothing to restore: a fresh run
    FAILED = "failed"


@dataclass
class RestorePhase:
    """A small state machine: NOT_STARTED → RESTORING → RESTORED, or NOT_STARTED → FRESH."""

    state: Phase = Phase.NOT_STARTED
    step: int | None = None
    history: list[Phase] = field(default_factory=list)

    def _move(self, allowed_from: tuple[Phase, ...], to: Phase) -> None:
        if self.state not in allowed_from:
            names = ", ".join(p.value for p in allowed_from)
            raise RestoreOrderError(
                f"restore phase cannot go from {self.state.value!r} to {to.value!r} (allowed from: {names})"
            )
        self.history.append(self.state)
        self.state = to
        logger.debug("restore phase: %s -> %s", self.history[-1].value, to.value)

    def begin_restore(self, step: int) -> None:
        """The bootstrap client is about to load the bundle of ``step`` into the data plane."""
        self._move((Phase.NOT_STARTED,), Phase.RESTORING)
        self.step = step

    def finish_restore(self) -> None:
        """The data plane now holds the bundle's rows; sharing it is safe."""
        self._move((Phase.RESTORING,), Phase.RESTORED)

    def fail(self) -> None:
        """A restore failed: nothing may connect to the half-restored data plane."""
        self.history.append(self.state)
        self.state = Phase.FAILED

    def start_fresh(self) -> None:
        """No bundle to restore: the data plane starts empty."""
        self._move((Phase.NOT_STARTED,), Phase.FRESH)

    @property
    def ready(self) -> bool:
        """True once the data plane may be shared (restored or fresh)."""
        return self.state in (Phase.RESTORED, Phase.FRESH)

    def require_ready(self, what: str) -> None:
        """Raise RestoreOrderError unless the restore step has finished (or the run is fresh)."""
        if not self.ready:
            raise RestoreOrderError(
                f"cannot build {what} while the restore phase is {self.state.value!r}: the bootstrap "
                "client must finish restoring TransferQueue first (docs/architecture.md, restore step 3 before 4)"
            )
