"""The manifest and COMMIT marker records and their canonical JSON form (the bytes that get digested)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from rlckpt.errors import InvalidPathError

from .paths import validate_relpath, validate_step

FORMAT_VERSION = 1
COMPRESSIONS = (None, "zstd")


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8, no NaN/Infinity."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


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
    format: int = FORMAT_VERSION

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
        obj = json.loads(data.decode("utf-8"))
        if not isinstance(obj, dict):
            raise ValueError("manifest is not a JSON object")
        if obj.get("format") != FORMAT_VERSION:
            raise ValueError(f"unsupported manifest format {obj.get('format')!r} (expected {FORMAT_VERSION})")
        files_obj = obj.get("files")
        if not isinstance(files_obj, dict):
            raise ValueError("manifest 'files' is not an object")
        files: dict[str, FileEntry] = {}
        for relpath, raw in files_obj.items():
            validate_relpath(relpath)
            files[relpath] = _parse_entry(relpath, raw)
        _check_no_file_dir_clash(files)
        metadata = obj.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ValueError("manifest 'metadata' is not an object")
        if not isinstance(obj.get("txid"), str) or not isinstance(obj.get("created"), str):
            raise ValueError("manifest 'txid'/'created' missing or not strings")
        return cls(
            step=validate_step(obj.get("step")),
            txid=obj["txid"],
            created=obj["created"],
            files=files,
            metadata=metadata,
        )


def _parse_entry(relpath: str, raw: Any) -> FileEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"manifest entry for {relpath!r} is not an object")
    size, digest, logical, comp = raw.get("size"), raw.get("sha256"), raw.get("logical_size"), raw.get("compression")
    for name, value in (("size", size), ("logical_size", logical)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"manifest entry for {relpath!r} has a bad {name}: {value!r}")
    if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"manifest entry for {relpath!r} has a bad sha256: {digest!r}")
    if comp not in COMPRESSIONS:
        raise ValueError(f"manifest entry for {relpath!r} has an unknown compression: {comp!r}")
    return FileEntry(size=size, sha256=digest, logical_size=logical, compression=comp)


def _check_no_file_dir_clash(files: dict[str, FileEntry]) -> None:
    """A path cannot be both a file and a directory of another file."""
    for relpath in files:
        parts = relpath.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in files:
                raise InvalidPathError(f"{relpath!r} lies under {'/'.join(parts[:i])!r}, which is a file")


@dataclass(frozen=True)
class CommitMarker:
    """The COMMIT record: names the sha256 of the manifest bytes beside it."""

    step: int
    txid: str
    manifest_sha256: str
    format: int = FORMAT_VERSION

    def to_bytes(self) -> bytes:
        return canonical_json(
            {"format": self.format, "step": self.step, "txid": self.txid, "manifest_sha256": self.manifest_sha256}
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> CommitMarker:
        obj = json.loads(data.decode("utf-8"))
        if not isinstance(obj, dict) or obj.get("format") != FORMAT_VERSION:
            raise ValueError("COMMIT is not a format-1 JSON object")
        digest = obj.get("manifest_sha256")
        if not isinstance(digest, str) or len(digest) != 64:
            raise ValueError(f"COMMIT has a bad manifest_sha256: {digest!r}")
        if not isinstance(obj.get("txid"), str):
            raise ValueError("COMMIT has no txid")
        return cls(step=validate_step(obj.get("step")), txid=obj["txid"], manifest_sha256=digest)
