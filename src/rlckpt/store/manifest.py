"""The manifest and COMMIT marker records and their canonical JSON form (the bytes that get digested)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from rlckpt.errors import InvalidPathError

from .path_set import PathSet
from .paths import is_txid, validate_relpath, validate_step

MANIFEST_FORMAT = 1
COMMIT_FORMAT = 1
COMPRESSIONS = (None, "zstd")
# Caps on what a reader will fetch of each metadata record: no object in a run can make it allocate more.
COMMIT_MAX_BYTES = 64 << 10
MANIFEST_MAX_BYTES = 32 << 20  # ~200k files with short paths (docs/store-protocol.md, "Records")


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8, no NaN/Infinity."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def parse_canonical(data: bytes, what: str) -> dict[str, Any]:
    """Parse a JSON object that must be in canonical form: valid UTF-8, no duplicate keys, and exactly
    the bytes canonical_json would write for it (a record that differs was not written by rlckpt).
    Raises ValueError naming `what`."""
    try:
        obj = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} is not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{what} is not a JSON object")
    if canonical_json(obj) != data:
        raise ValueError(f"{what} is not in canonical JSON form (sorted keys, no whitespace)")
    return obj


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of a bytes object."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One file of a bundle: what is stored (size, sha256) and what the reader gets back (logical size)."""

    size: int
    sha256: str
    logical_size: int
    compression: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "sha256": self.sha256,
            "logical_size": self.logical_size,
            "compression": self.compression,
        }


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to verify a bundle: every file, the step, the writer's txid and metadata."""

    step: int
    txid: str
    created: str
    files: dict[str, FileEntry]
    metadata: dict[str, Any] = field(default_factory=dict)
    format: int = MANIFEST_FORMAT

    @property
    def total_size(self) -> int:
        """Sum of stored sizes of all files (manifest and COMMIT excluded)."""
        return sum(entry.size for entry in self.files.values())

    def to_bytes(self) -> bytes:
        """The canonical bytes written as manifest.json."""
        return canonical_json(
            {
                "format": self.format,
                "step": self.step,
                "txid": self.txid,
                "created": self.created,
                "metadata": self.metadata,
                "files": {path: entry.to_json() for path, entry in sorted(self.files.items())},
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and validate manifest bytes; raise ValueError (or InvalidPathError) on anything malformed."""
        obj = parse_canonical(data, "manifest")
        if obj.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unsupported manifest format {obj.get('format')!r} (expected {MANIFEST_FORMAT})")
        files_obj = obj.get("files")
        if not isinstance(files_obj, dict):
            raise ValueError("manifest 'files' is not an object")
        files: dict[str, FileEntry] = {}
        paths = PathSet()
        for relpath, raw in files_obj.items():
            validate_relpath(relpath)
            files[relpath] = parse_file_entry(relpath, raw)
            clash = paths.add(relpath)
            if clash is not None:
                raise InvalidPathError(clash.describe())
        metadata = obj.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ValueError("manifest 'metadata' is not an object")
        if not is_txid(obj.get("txid")) or not isinstance(obj.get("created"), str):
            raise ValueError(f"manifest has a bad txid {obj.get('txid')!r} or no 'created' string")
        return cls(
            step=validate_step(obj.get("step")),
            txid=obj["txid"],
            created=obj["created"],
            files=files,
            metadata=metadata,
        )


def parse_file_entry(relpath: str, raw: Any) -> FileEntry:
    """A file entry from its JSON form; ValueError naming `relpath` on anything malformed. The one check
    of an entry: the manifest reader and the commit (each receipt's entries) both decide here."""
    if not isinstance(raw, dict):
        raise ValueError(f"manifest entry for {relpath!r} is not an object")
    size, digest, logical, comp = raw.get("size"), raw.get("sha256"), raw.get("logical_size"), raw.get("compression")
    for name, value in (("size", size), ("logical_size", logical)):
        if not _is_count(value):
            raise ValueError(f"manifest entry for {relpath!r} has a bad {name}: {value!r}")
    assert _is_count(size) and _is_count(logical)
    if not _is_sha256_hex(digest):
        raise ValueError(f"manifest entry for {relpath!r} has a bad sha256: {digest!r}")
    if comp not in COMPRESSIONS:
        raise ValueError(f"manifest entry for {relpath!r} has an unknown compression: {comp!r}")
    if comp is None and logical != size:
        raise ValueError(
            f"manifest entry for {relpath!r} is uncompressed but its logical size {logical} is not its size {size}"
        )
    return FileEntry(size=size, sha256=digest, logical_size=logical, compression=comp)


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _is_sha256_hex(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and _SHA256_HEX.fullmatch(value) is not None  # a commit checks 150k of these


@dataclass(frozen=True)
class CommitMarker:
    """The COMMIT record: names the sha256 of the manifest bytes beside it."""

    step: int
    txid: str
    manifest_sha256: str
    format: int = COMMIT_FORMAT

    def to_bytes(self) -> bytes:
        return canonical_json(
            {"format": self.format, "step": self.step, "txid": self.txid, "manifest_sha256": self.manifest_sha256}
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> CommitMarker:
        obj = parse_canonical(data, "COMMIT")
        if obj.get("format") != COMMIT_FORMAT:
            raise ValueError(f"unsupported COMMIT format {obj.get('format')!r} (expected {COMMIT_FORMAT})")
        digest = obj.get("manifest_sha256")
        if not _is_sha256_hex(digest):
            raise ValueError(f"COMMIT has a bad manifest_sha256: {digest!r}")
        if not is_txid(obj.get("txid")):
            raise ValueError(f"COMMIT has a bad txid: {obj.get('txid')!r}")
        return cls(step=validate_step(obj.get("step")), txid=obj["txid"], manifest_sha256=digest)
