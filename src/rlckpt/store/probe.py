"""Probe once per store whether the server enforces create-exclusive writes (If-None-Match: *)."""

from __future__ import annotations

import logging
import uuid

from .backends import Backend
from .paths import PROBE_DIR

log = logging.getLogger(__name__)


def create_exclusive_enforced(backend: Backend) -> bool:
    """Write a fresh probe key twice with create-exclusive; True if the second write was refused."""
    if backend.local:
        return True  # O_EXCL on a local filesystem
    key = backend.path(PROBE_DIR, uuid.uuid4().hex)
    backend.create_exclusive(key, b"probe-1")
    try:
        backend.create_exclusive(key, b"probe-2")
    except FileExistsError:
        return True
    finally:
        try:
            backend.fs.rm_file(key)
        except FileNotFoundError:
            pass
    return False
