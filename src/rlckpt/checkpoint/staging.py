"""Local staging directories for data-plane snapshots: tmpfs when the machine has one.

Staging keeps the barrier window independent of the destination's speed: TransferQueue writes
its snapshot to local memory or disk, and the upload happens after the window is released.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

TMPFS = Path("/dev/shm")


def default_staging_root() -> Path:
    """``/dev/shm`` when it exists and is writable, else the system temp dir."""
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK):
        return TMPFS
    return Path(tempfile.gettempdir())


@contextlib.contextmanager
def staging_dir(root: str | os.PathLike[str] | None, prefix: str) -> Iterator[Path]:
    """A fresh private directory under ``root`` (default: tmpfs), removed on exit whatever happens."""
    base = Path(root) if root is not None else default_staging_root()
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        logger.debug("removed staging dir %s", path)
