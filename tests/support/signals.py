"""Signals that came before Python could run their handler, made deterministic for tests."""

from __future__ import annotations

import os
import signal


def came_before_the_handler_ran(*signums: int) -> None:
    """Do what the C-level handler does for each of `signums` before Python runs the Python-level handler: write
    its byte to the wakeup fd (``signal.set_wakeup_fd``). Python then runs the handler once for all of them —
    or, here, not at all until the test sends one more signal or calls the handler."""
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
    if fd == -1:
        raise AssertionError("no wakeup fd is set: nothing counts the signals Python hands over as one")
    os.write(fd, bytes(signums))
