"""Storage backends: the commit primitives and safe reads for each kind of storage (see base.Backend)."""

from __future__ import annotations

from typing import Any

from rlckpt.store.backends.base import Backend, CommitView, HeldFile, Listing, PendingWrite
from rlckpt.store.backends.local import LocalBackend
from rlckpt.store.backends.object_store import ObjectBackend
from rlckpt.store.backends.s3 import S3Backend

__all__ = [
    "Backend",
    "CommitView",
    "HeldFile",
    "Listing",
    "LocalBackend",
    "ObjectBackend",
    "PendingWrite",
    "S3Backend",
    "make_backend",
]


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def make_backend(fs: Any, root: str) -> Backend:
    """The backend for a filesystem (possibly behind a wrapper that forwards its attributes)."""
    protocols = _protocols(fs)
    if "file" in protocols or "local" in protocols:
        return LocalBackend(fs, root)
    if "s3" in protocols and hasattr(fs, "call_s3") and hasattr(fs, "split_path"):
        return S3Backend(fs, root)
    return ObjectBackend(fs, root)
