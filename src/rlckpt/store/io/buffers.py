"""Reused read buffers. The first touch of each page of fresh memory is a page fault: copying 256 MiB into a
fresh buffer took 197 ms here, into one touched before 28 ms. A checked reader must hold a private copy
of the bytes it hashes, so it copies into buffers taken from here and given back, already faulted in.

One pool per process (`READ_BUFFERS`): a trainer rank's loads reuse the buffers of its earlier loads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIZE_STEP = 1 << 20  # sizes are rounded up to this, so files of about one size share buffers
POOL_MAX_IDLE = 64 << 20  # idle bytes a pool keeps in buffers up to this size (a load's read-ahead and one more)


class BufferPool:
    """Byte buffers lent out and given back. `take(n)` is an idle buffer of at least n bytes, or a new one
    (zero-filled, so its pages are faulted in once, here); `give(buf)` keeps it for the next `take`.

    What stays idle is bounded, not a history of every size ever read: buffers up to `max_idle` bytes while
    their total stays within it (the smallest make room), and one larger buffer at most, the newest (a file
    that large is read alone, so one is all the next such file needs). A buffer must not be used once it is
    given back. `lent_bytes` is what is lent out now, `peak_lent` the most that ever was (what a reader's
    bound is checked against), `reused` how many takes an idle buffer served."""

    def __init__(self, max_idle: int = POOL_MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._idle: list[bytearray] = []  # up to max_idle each, largest first
        self._large: bytearray | None = None  # the newest idle buffer above max_idle
        self._lent = 0
        self.peak_lent = 0
        self.reused = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bytearray:
        """A buffer of at least `size` bytes (its contents are whatever the last user left)."""
        with self._lock:
            buf = self._take_idle(size)
            self.reused += buf is not None
        if buf is None:
            buf = bytearray(-(-max(size, 1) // SIZE_STEP) * SIZE_STEP)
        with self._lock:
            self._lent += len(buf)
            self.peak_lent = max(self.peak_lent, self._lent)
        return buf

    def _take_idle(self, size: int) -> bytearray | None:
        fits = [buf for buf in self._idle if len(buf) >= size]
        if fits:
            buf = min(fits, key=len)
            self._idle.remove(buf)
            return buf
        if self._large is not None and len(self._large) >= size:
            buf, self._large = self._large, None
            return buf
        return None

    def give(self, buf: bytearray) -> None:
        """Return a buffer from `take`: kept within the bounds above (the class doc), or freed."""
        with self._lock:
            self._lent -= len(buf)
            if len(buf) > self.max_idle:
                self._large = buf
                return
            self._idle.append(buf)
            self._idle.sort(key=len, reverse=True)
            while sum(len(b) for b in self._idle) > self.max_idle:
                self._idle.pop()

    @contextmanager
    def lent(self, size: int) -> Iterator[memoryview]:
        """A view of exactly `size` bytes of a pooled buffer, given back (and the view released) on exit."""
        buf = self.take(size)
        view = memoryview(buf)[:size]
        try:
            yield view
        finally:
            view.release()
            self.give(buf)

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._idle) + (len(self._large) if self._large is not None else 0)

    @property
    def lent_bytes(self) -> int:
        with self._lock:
            return self._lent


READ_BUFFERS = BufferPool()
