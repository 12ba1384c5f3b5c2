"""Deterministic races for tests: hold one thread at an exact call while the test acts, then let it go.

with PauseAt(store.backend, "incomplete_uploads") as pause:
    gc = Background(store.gc)
    pause.wait_reached()
    ...                     # the other side of the race, at exactly this point
gc.result()                 # leaving the block releases the held thread
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

HANDSHAKE_TIMEOUT_S = 60.0


class PauseAt:
    """Replace `target.name` so that its first call blocks (before or after running) until released."""

    def __init__(self, target: Any, name: str, when: str = "before") -> None:
        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', got {when!r}")
        self.target, self.name, self.when = target, name, when
        self.reached = threading.Event()
        self._go = threading.Event()
        self._original = getattr(target, name)
        self._had_own = name in vars(target) if hasattr(target, "__dict__") else False

    def __enter__(self) -> PauseAt:
        original = self._original

        @functools.wraps(original)
        def held(*args: Any, **kwargs: Any) -> Any:
            first = not self.reached.is_set()
            if first and self.when == "before":
                self._hold()
            result = original(*args, **kwargs)
            if first and self.when == "after":
                self._hold()
            return result

        setattr(self.target, self.name, held)
        return self

    def _hold(self) -> None:
        self.reached.set()
        if not self._go.wait(HANDSHAKE_TIMEOUT_S):
            raise TimeoutError(f"{self.name} was held for {HANDSHAKE_TIMEOUT_S}s and never released")

    def wait_reached(self) -> None:
        """Block until the held thread is at the call."""
        if not self.reached.wait(HANDSHAKE_TIMEOUT_S):
            raise TimeoutError(f"nothing called {self.name} within {HANDSHAKE_TIMEOUT_S}s")

    def release(self) -> None:
        self._go.set()

    def __exit__(self, *exc: Any) -> None:
        self.release()
        if self._had_own:
            setattr(self.target, self.name, self._original)
        else:
            delattr(self.target, self.name)


class Background:
    """Run `fn` in a thread; `result()` joins it and returns its value or re-raises its exception."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn(*args, **kwargs)
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self, timeout: float = HANDSHAKE_TIMEOUT_S) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"background call did not finish within {timeout}s")
        if self._error is not None:
            raise self._error
        return self._value
