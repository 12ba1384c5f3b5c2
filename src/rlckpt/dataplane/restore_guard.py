"""Per-client restore guard: the part of the restore check that one client can know by itself."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator

from rlckpt.errors import RestoreRefusedError


class _LoadState(enum.Enum):
    NONE = "none"
    LOADED = "loaded"
    FAILED = "failed"


class RestoreGuard:
    """Tracks whether this client did data operations or attempted a load.

    The second layer (the data plane already holds data) is checked by each adapter against
    its backend, because only the backend knows what other clients did.
    """

    def __init__(self) -> None:
        self.touched = False
        self._load = _LoadState.NONE

    def mark_touched(self) -> None:
        """Record a data operation (put/get/clear)."""
        self.touched = True

    def check_may_load(self, where: str) -> None:
        """Raise RestoreRefusedError unless this client may still restore a snapshot."""
        if self._load is _LoadState.FAILED:
            raise RestoreRefusedError(
                f"restore from {where} refused: an earlier load through this client failed and may "
                "have left the data plane half-restored; start a fresh data plane"
            )
        if self._load is _LoadState.LOADED:
            raise RestoreRefusedError(f"restore from {where} refused: this client already restored a snapshot")
        if self.touched:
            raise RestoreRefusedError(
                f"restore from {where} refused: this client already did data operations "
                "(restore must come before any put/get/clear)"
            )

    def mark_loaded(self) -> None:
        """Record a successful load."""
        self._load = _LoadState.LOADED

    def mark_failed(self) -> None:
        """Record a failed load: no further load is allowed through this client."""
        self._load = _LoadState.FAILED

    @contextlib.contextmanager
    def loading(self, where: str) -> Iterator[None]:
        """Around one restore: refused unless this client may still load; a failure marks the client
        failed (any Exception becomes RestoreRefusedError naming `where`), success marks it loaded."""
        self.check_may_load(where)
        try:
            yield
        except RestoreRefusedError:
            self.mark_failed()
            raise
        except BaseException as exc:
            self.mark_failed()
            if isinstance(exc, Exception):
                raise RestoreRefusedError(f"restore from {where}: load failed: {type(exc).__name__}: {exc}") from exc
            raise
        self.mark_loaded()
