"""Transactional bundle store over fsspec (local disk, S3, memory). Imports neither torch, Ray nor TransferQueue.

A bundle `step_<N>/` is visible only when its COMMIT names the sha256 of its manifest.json, which
lists every file's size and digest. See docs/store-protocol.md. What callers may import is below;
the submodules are the store's own.
"""

from .backends.object_store import WRITE_BLOCK_SIZE
from .bundle import Bundle
from .gc import GcReport
from .intent import Intent
from .location import open_location
from .manifest import CommitMarker, FileEntry, Manifest, sha256_hex
from .participant import ParticipantWriter, Receipt, TransactionHandle, validate_participant
from .paths import join_relpath, step_dirname, validate_relpath, validate_step
from .storage_errors import as_store_error, unavailable_as_store_error
from .store import BundleStore, StoreEntry
from .transaction import BundleTransaction

__all__ = [
    "WRITE_BLOCK_SIZE",
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
    "as_store_error",
    "join_relpath",
    "open_location",
    "sha256_hex",
    "step_dirname",
    "unavailable_as_store_error",
    "validate_participant",
    "validate_relpath",
    "validate_step",
]
