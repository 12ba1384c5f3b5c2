"""Transactional bundle store over fsspec (local disk, S3, memory). Imports neither torch, Ray nor TransferQueue.

A bundle `step_<N>/` is visible only when its COMMIT names the sha256 of its manifest.json, which
lists every file's size and digest. See docs/store-protocol.md.
"""

from .bundle import Bundle
from .gc import GcReport
from .intent import Intent
from .manifest import CommitMarker, FileEntry, Manifest
from .participant import ParticipantWriter, Receipt, TransactionHandle
from .store import BundleStore, StoreEntry
from .transaction import BundleTransaction

__all__ = [
    "Bundle",
    "BundleStore",
    "BundleTransaction",
    "CommitMarker",
    "FileEntry",
    "GcReport",
    "Intent",
    "Manifest",
    "ParticipantWriter",
    "Receipt",
    "StoreEntry",
    "TransactionHandle",
]
