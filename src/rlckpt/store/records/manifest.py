"""The manifest and COMMIT marker records and their canonical JSON form (the bytes that get digested).

Each record states its format; this rlckpt writes MANIFEST_FORMAT / COMMIT_FORMAT and reads every format
down to 1, each declared in manifest_formats.py (the one statement of their keys, which the readers here
check and docs/formats.md is rendered from). A malformed record is refused with CorruptBundleError naming
the file, the record and the field; one of a newer format with NewerFormatError, in one line naming the
format and the version that wrote it. Each format's keys are closed: a key this rlckpt does not know is
refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import rlckpt
from rlckpt.errors import NewerFormatError, UnreadableBundleError
from rlckpt.formats import (
    MAX_JSON_DEPTH,
    MapKey,
    Record,
    Refusal,
    json_problem,
    load_json,
    nested_deeper_than,
    quoted,
    read_format,
    readable,
)
from rlckpt.store.io.compression import PLANES
from rlckpt.store.io.digest import SHA256, Digest
from rlckpt.store.paths.path_set import PathSet
from rlckpt.store.paths.paths import COMMIT_NAME, MANIFEST_NAME
from rlckpt.store.records.manifest_formats import (
    COMMIT_FORMAT,
    COMMIT_FORMATS,
    FILE_ENTRY,
    MANIFEST_FORMAT,
    MANIFEST_FORMATS,
    RUN_ID,
)

# Caps on what a reader will fetch of each metadata record: no object in a run can make it allocate more.
COMMIT_MAX_BYTES = 64 << 10
WRITTEN_FORMATS = (2, MANIFEST_FORMAT)  # what this rlckpt writes: the oldest that holds the files (format_for)
MANIFEST_MAX_BYTES = 32 << 20  # ~180k files with short paths (docs/store-protocol.md, "Records")
# manifest.json holds the user's metadata one level down: the nesting a reader's bound leaves it.
METADATA_MAX_DEPTH = MAX_JSON_DEPTH - 1

_RUN_ID = re.compile(RUN_ID)
_MAJOR_MINOR = re.compile(r"([0-9]+)\.([0-9]+)")


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8, no NaN/Infinity."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def check_metadata(metadata: Any, what: str = "metadata") -> None:
    """Refuse `metadata` no manifest could hold, before anything walks it recursively; `what` names it in
    errors, and the path inside it leads there.

    Raises:
        UnreadableBundleError: nested deeper than readers take (found without recursing: a value 5,000
            deep is refused with its reason, not with RecursionError).
        TypeError, ValueError: not JSON, or NaN or an infinity, as canonical_json refuses it, naming where
            (``metadata['seen']: a builtins.set (not JSON)``).
    """
    if nested_deeper_than(metadata, METADATA_MAX_DEPTH):
        raise UnreadableBundleError(
            f"{what} is nested deeper than {METADATA_MAX_DEPTH} levels of objects and arrays (manifest.json, "
            f"which holds it, may nest {MAX_JSON_DEPTH}): readers would refuse the bundle"
        )
    problem = json_problem(metadata, what)
    if problem is not None:
        raise TypeError(problem)
    canonical_json(metadata)  # what the manifest will be written with: whatever the walk missed


def parse_canonical(data: bytes, what: str) -> dict[str, Any]:
    """Parse a JSON object that must be in canonical form: valid UTF-8, nested at most MAX_JSON_DEPTH levels
    (``load_json``), no duplicate keys, and exactly the bytes canonical_json would write for it (a record
    that differs was not written by rlckpt). Raises ValueError naming `what`."""
    try:
        data.decode("utf-8")
        obj = load_json(data, what, object_pairs_hook=_no_duplicate_keys)
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
            raise ValueError(f"duplicate key {quoted(key)}")
        obj[key] = value
    return obj


def _read_record(formats: Sequence[Record], data: bytes, where: str) -> tuple[dict[str, Any], Record]:
    """The record in `data` and the declaration of the format it is in: canonical JSON of a format this
    rlckpt reads, every field as that format declares it.

    Raises:
        NewerFormatError: a format newer than this rlckpt reads (one line naming it and its writer).
        CorruptBundleError: naming `where`, the record and the field: anything else.
    """
    today = formats[-1]
    try:
        obj = parse_canonical(data, today.name)
    except ValueError as exc:
        raise today.error(f"{where}: {exc}" if where else str(exc)) from None
    newest = today.format
    number = obj.get("format")
    if type(number) is int and newest is not None and number > newest:
        version = obj.get("writer_version")
        release = _MAJOR_MINOR.match(version) if isinstance(version, str) else None
        by = f"a newer rlckpt {release[1]}.{release[2]}" if release else "a newer rlckpt"
        raise NewerFormatError(
            f"{where}: " * bool(where) + f"{today.name} format {number} was written by {by}; this rlckpt "
            f"{rlckpt.__version__} reads {today.name} {readable(formats)}: upgrade rlckpt to read it"
        )
    return obj, read_format(formats, obj, where)


# --- file entries -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    """One file of a bundle: what is stored (size, digest) and what the reader gets back (logical size)."""

    size: int
    digest: Digest
    logical_size: int
    compression: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The entry as manifest format 2 (and every receipt) writes it."""
        return {
            "size": self.size,
            "algorithm": self.digest.algorithm,
            "digest": self.digest.hex,
            "logical_size": self.logical_size,
            "compression": self.compression,
        }


def read_file_entry(raw: Any) -> FileEntry:
    """An entry of today's format (a receipt's: the commit checks each as the manifest reader will).

    Raises:
        Refusal: naming the field: what ``FILE_ENTRY`` refuses, or sizes that differ though uncompressed.
    """
    FILE_ENTRY.check(raw)
    return _file_entry(raw, MANIFEST_FORMAT)


def _file_entry(raw: dict[str, Any], manifest_format: int) -> FileEntry:
    """The entry `raw`, which its format's declaration accepted; Refusal when it is uncompressed and its
    logical size is not its size (what no declaration states: one field against another)."""
    size, logical, compression = raw["size"], raw["logical_size"], raw["compression"]
    if compression is None and logical != size:
        raise Refusal(f"uncompressed, so its logical size must be its size ({size}), got {logical}", "logical_size")
    digest = Digest(SHA256, raw["sha256"]) if manifest_format == 1 else Digest(raw["algorithm"], raw["digest"])
    return FileEntry(size=size, digest=digest, logical_size=logical, compression=compression)


# --- manifest ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to verify a bundle: every file, the step, the writer's txid and metadata.

    `format` and `writer_version` say what wrote it: a manifest read from format 1 has no writer version;
    one built to be written is of MANIFEST_FORMAT, by this rlckpt."""

    step: int
    txid: str
    created: str
    files: dict[str, FileEntry]
    metadata: dict[str, Any] = field(default_factory=dict)
    format: int = MANIFEST_FORMAT
    writer_version: str | None = rlckpt.__version__

    @property
    def total_size(self) -> int:
        """Sum of stored sizes of all files (manifest and COMMIT excluded)."""
        return sum(entry.size for entry in self.files.values())

    @property
    def digest_algorithms(self) -> tuple[str, ...]:
        """The algorithms its files' digests are of, sorted (one, unless entries were carried over)."""
        return tuple(sorted({entry.digest.algorithm for entry in self.files.values()}))

    @staticmethod
    def format_for(files: dict[str, FileEntry]) -> int:
        """The oldest format that holds `files`: 3 where an entry is stored in byte planes, else 2, so that a
        bundle saved without that option stays readable by every rlckpt that read format 2."""
        return MANIFEST_FORMAT if any(e.compression in PLANES for e in files.values()) else WRITTEN_FORMATS[0]

    def to_bytes(self) -> bytes:
        """The canonical bytes written as manifest.json (WRITTEN_FORMATS only: older formats are read, never
        written)."""
        if self.format not in WRITTEN_FORMATS or self.writer_version is None:
            raise ValueError(
                f"manifest format {self.format} is read, never written (this rlckpt writes {WRITTEN_FORMATS})"
            )
        if self.format < self.format_for(self.files):
            raise ValueError(f"manifest format {self.format} cannot hold byte-plane entries (format {MANIFEST_FORMAT})")
        return canonical_json(
            {
                "format": self.format,
                "writer_version": self.writer_version,
                "step": self.step,
                "txid": self.txid,
                "created": self.created,
                "metadata": self.metadata,
                "files": {path: entry.to_json() for path, entry in sorted(self.files.items())},
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes, where: str = MANIFEST_NAME) -> Manifest:
        """Parse manifest bytes of any format this rlckpt reads, checked against that format's declaration
        (``MANIFEST_FORMATS``), then each file's sizes against each other and its path against the others.

        Raises:
            NewerFormatError: a format newer than this rlckpt reads (one line naming it and its writer).
            CorruptBundleError: naming `where`, the record and the field: anything malformed.
        """
        obj, record = _read_record(MANIFEST_FORMATS, data, where)
        assert record.format is not None
        files: dict[str, FileEntry] = {}
        paths = PathSet()
        for relpath, raw in obj["files"].items():
            try:
                files[relpath] = _file_entry(raw, record.format)
                clash = paths.add(relpath)
                if clash is not None:
                    raise Refusal(clash.describe())
            except Refusal as refusal:
                refusal.steps[:0] = ["files", MapKey(relpath)]
                raise record.refusal(refusal.path, refusal.problem, where) from None
        return cls(
            step=obj["step"],
            txid=obj["txid"],
            created=obj["created"],
            files=files,
            metadata=obj["metadata"],
            format=record.format,
            writer_version=obj.get("writer_version"),
        )


# --- COMMIT -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommitSignature:
    """A bundle's signature as COMMIT carries it: the algorithm, the id of the key that made it and the
    signature's bytes. Plain data: what it signs and how it is checked are signing.py's."""

    key_id: str
    value: bytes
    algorithm: str = "ed25519"

    def to_json(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "key_id": self.key_id, "value": self.value.hex()}


@dataclass(frozen=True)
class CommitMarker:
    """The COMMIT record: names the digest (and its algorithm) of the manifest bytes beside it and, from
    format 3, the run it was written in and the bundle's signature (None: unsigned).

    To add a field: a dataclass field, its key in `_fields`, a new format declared in manifest_formats.py
    (``COMMIT_FORMATS``) and its value read in `from_bytes`."""

    step: int
    txid: str
    manifest: Digest
    run: str | None = None  # the run's id (run_record.py); None only in COMMITs of formats 1-2
    signature: CommitSignature | None = None
    format: int = COMMIT_FORMAT
    writer_version: str | None = rlckpt.__version__

    def _fields(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "writer_version": self.writer_version,
            "step": self.step,
            "txid": self.txid,
            "manifest_algorithm": self.manifest.algorithm,
            "manifest_digest": self.manifest.hex,
            "run": self.run,
            "signature": None if self.signature is None else self.signature.to_json(),
        }

    def to_bytes(self) -> bytes:
        """The canonical bytes written as COMMIT (COMMIT_FORMAT only, naming its run)."""
        if self.format != COMMIT_FORMAT or self.writer_version is None:
            raise ValueError(f"COMMIT format {self.format} is read, never written (this rlckpt writes {COMMIT_FORMAT})")
        if not isinstance(self.run, str) or _RUN_ID.fullmatch(self.run) is None:
            raise ValueError(f"COMMIT format {COMMIT_FORMAT} names its run's id, got {quoted(self.run)}")
        return canonical_json(self._fields())

    @classmethod
    def from_bytes(cls, data: bytes, where: str = COMMIT_NAME) -> CommitMarker:
        """Parse COMMIT bytes of any format this rlckpt reads, checked against that format's declaration
        (``COMMIT_FORMATS``).

        Raises:
            NewerFormatError: a format newer than this rlckpt reads (one line naming it and its writer).
            CorruptBundleError: naming `where`, the record and the field: anything malformed.
        """
        obj, record = _read_record(COMMIT_FORMATS, data, where)
        assert record.format is not None
        if record.format == 1:
            manifest = Digest(SHA256, obj["manifest_sha256"])
        else:
            manifest = Digest(obj["manifest_algorithm"], obj["manifest_digest"])
        signed = obj.get("signature")
        signature = None
        if signed is not None:
            signature = CommitSignature(signed["key_id"], bytes.fromhex(signed["value"]), signed["algorithm"])
        return cls(
            step=obj["step"],
            txid=obj["txid"],
            manifest=manifest,
            run=obj.get("run"),
            signature=signature,
            format=record.format,
            writer_version=obj.get("writer_version"),
        )
