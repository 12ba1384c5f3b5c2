"""Deny access to a path by its mode, also when the tests run as root (as in CI containers).

Root ignores file modes (CAP_DAC_OVERRIDE and friends), so `chmod 0o555` alone denies nothing there.
`mode_enforced` drops those capabilities from the *effective* set of the calling thread for the block
(threads it starts meanwhile inherit that); they stay in the permitted set and come back on exit, so
nothing else in the process is affected.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

import pytest

_CAPS_BYPASSING_MODES = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def _without_mode_bypass() -> Iterator[None]:
    """The calling thread obeys file modes for the block (a no-op unless running as root)."""
    if os.geteuid() != 0:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)  # pid 0: this thread
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        pytest.skip(f"running as root and capget failed (errno {ctypes.get_errno()}): cannot make a path unwritable")
    saved = data[0].effective
    for cap in _CAPS_BYPASSING_MODES:
        data[0].effective &= ~(1 << cap)
    if libc.capset(ctypes.byref(header), data) != 0:
        pytest.skip(f"running as root and capset failed (errno {ctypes.get_errno()}): cannot make a path unwritable")
    try:
        yield
    finally:
        data[0].effective = saved
        if libc.capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "could not restore this thread's capabilities")


@contextlib.contextmanager
def mode_enforced(path: str | os.PathLike[str], mode: int) -> Iterator[None]:
    """`chmod path mode` for the block, obeyed by this thread even as root; the old mode is restored after.
    E.g. 0o555 on a directory: nothing can be created or removed in it; 0o000 on a file: it cannot be read."""
    old = os.stat(path).st_mode & 0o7777
    os.chmod(path, mode)
    try:
        with _without_mode_bypass():
            yield
    finally:
        os.chmod(path, old)
