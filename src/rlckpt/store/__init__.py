"""Transactional bundle store over fsspec (local disk, S3, memory). Imports neither torch, Ray nor TransferQueue.

A bundle `step_<N>/` is visible only when its COMMIT names the digest of its manifest.json, which
lists every file's size and digest (BLAKE3 in bundles written now, sha256 in those of manifest format
1). See docs/store-protocol.md. With a signing key, COMMIT also carries an Ed25519 signature of the run,
the step and the manifest's digest, and a store with the verify key reads only bundles it signed for the
run (docs/security.md). What callers may import is below; the submodules are the store's own.
"""

from rlckpt.store.backends.object_store import WRITE_BLOCK_SIZE
from rlckpt.store.bundle import Bundle, InOrderRead
from rlckpt.store.commit.commit_check import CommitRecords
from rlckpt.store.commit.participant import ParticipantWriter, Receipt, TransactionHandle, validate_participant
from rlckpt.store.commit.transaction import BundleTransaction
from rlckpt.store.io.buffers import READ_BUFFERS, BufferPool
from rlckpt.store.io.compression import planes_for
from rlckpt.store.io.digest import Digest
from rlckpt.store.io.storage_errors import as_store_error, unavailable_as_store_error
from rlckpt.store.paths.location import open_location
from rlckpt.store.paths.paths import join_relpath, step_dirname, validate_relpath, validate_step
from rlckpt.store.records.intent import Intent
from rlckpt.store.records.manifest import (
    COMMIT_FORMAT,
    MANIFEST_FORMAT,
    CommitMarker,
    CommitSignature,
    FileEntry,
    Manifest,
)
from rlckpt.store.records.run_record import RunRecord
from rlckpt.store.signing import (
    KeyPairFiles,
    SigningKey,
    SigningKeyInput,
    VerifyKey,
    VerifyKeyInput,
    signing_key_of,
    verify_key_of,
    write_key_pair,
)
from rlckpt.store.store import BundleStore, StoreEntry
from rlckpt.store.upkeep.gc import GcReport
from rlckpt.store.upkeep.replica import CopyReport, copy_bundle
from rlckpt.store.upkeep.retention import METRICS_KEY, Retention, finite_metrics

__all__ = [
    "COMMIT_FORMAT",
    "MANIFEST_FORMAT",
    "METRICS_KEY",
    "READ_BUFFERS",
    "WRITE_BLOCK_SIZE",
    "BufferPool",
    "Bundle",
    "BundleStore",
    "BundleTransaction",
    "CommitMarker",
    "CommitSignature",
    "CommitRecords",
    "CopyReport",
    "Digest",
    "FileEntry",
    "GcReport",
    "InOrderRead",
    "Intent",
    "KeyPairFiles",
    "Manifest",
    "ParticipantWriter",
    "Receipt",
    "RunRecord",
    "SigningKey",
    "SigningKeyInput",
    "Retention",
    "StoreEntry",
    "TransactionHandle",
    "VerifyKey",
    "VerifyKeyInput",
    "as_store_error",
    "copy_bundle",
    "finite_metrics",
    "join_relpath",
    "open_location",
    "planes_for",
    "signing_key_of",
    "step_dirname",
    "unavailable_as_store_error",
    "validate_participant",
    "validate_relpath",
    "validate_step",
    "verify_key_of",
    "write_key_pair",
]
