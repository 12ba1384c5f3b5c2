"""The manifest and COMMIT marker records and their canonical JSON form (the bytes that get digested).

Each record states its format; this rlckpt writes MANIFEST_FORMAT / COMMIT_FORMAT and reads every
format down to 1:

- manifest 1, COMMIT 1: every digest is sha256 (entry key `sha256`, COMMIT key `manifest_sha256`).
- manifest 2, COMMIT 2: every digest names its algorithm (entry keys `algorithm` + `digest`, COMMIT keys
  `manifest_algorithm` + `manifest_digest`), and both records name the rlckpt version that wrote them
  (`writer_version`).
- COMMIT 3: names the run it was written in (`run`, the id of the run's `_run.json`) and carries the
  bundle's signature (`signature`: null, or the signing key's id and its Ed25519 signature of the run,
  the step and the manifest's digest; see signing.py).

A record of a newer format is refused with NewerFormatError, in one line naming the format and the
version that wrote it. Each format's keys are closed: a key this rlckpt does not know is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

import rlckpt
from rlckpt.errors import InvalidPathError, NewerFormatError

from .digest import SHA256, Digest
from .path_set import PathSet
from .paths import is_txid, validate_relpath, validate_step

MANIFEST_FORMAT = 2
COMMIT_FORMAT = 3
COMPRESSIONS = (None, "zstd")
# Caps on what a reader will fetch of each metadata record: no object in a run can make it allocate more.
COMMIT_MAX_BYTES = 64 << 10
MANIFEST_MAX_BYTES = 32 << 20  # ~180k files with short paths (docs/store-protocol.md, "Records")

_RUN_ID = re.compile(r"[0-9a-f]{32}")  # run_record.RUN_ID_PATTERN
_KEY_ID = re.compile(r"[0-9a-f]{32}")  # signing.key_id_of
_SIGNATURE_HEX = re.compile(r"[0-9a-f]{128}")  # an Ed25519 signature: 64 bytes
SIGNATURE_ALGORITHMS = ("ed25519",)
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}")  # a PEP 440 version, as a plain token
_MAJOR_MINOR = re.compile(r"([0-9]+)\.([0-9]+)")


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


def _record_format(obj: dict[str, Any], what: str, written: int) -> int:
    """The format a record states: one this rlckpt reads (1..written), or NewerFormatError in one line
    naming the format and the version that wrote it; ValueError when it states none."""
    found = obj.get("format")
    if not _is_count(found) or found < 1:
        raise ValueError(f"{what} has no format number: {found!r:.40}")
    if found > written:
        version = obj.get("writer_version")
        release = _MAJOR_MINOR.match(version) if isinstance(version, str) else None
        by = f"a newer rlckpt {release[1]}.{release[2]}" if release else "a newer rlckpt"
        raise NewerFormatError(
            f"{what} format {found} was written by {by}; this rlckpt {rlckpt.__version__} reads {what} formats "
            f"1-{written}: upgrade rlckpt to read it"
        )
    return found


def _check_keys(obj: dict[str, Any], keys: frozenset[str], what: str) -> None:
    unknown = sorted(set(obj) - keys)
    if unknown:
        raise ValueError(f"{what} has unknown keys {unknown[:5]!r:.200}")
    missing = sorted(keys - set(obj))
    if missing:
        raise ValueError(f"{what} lacks {missing}")


def _writer_version(value: Any, what: str) -> str:
    if not isinstance(value, str) or _VERSION.fullmatch(value) is None:
        raise ValueError(f"{what} has a bad writer_version: {value!r:.80}")
    return value


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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


_ENTRY_KEYS = {
    1: frozenset({"size", "sha256", "logical_size", "compression"}),
    2: frozenset({"size", "algorithm", "digest", "logical_size", "compression"}),
}


def parse_file_entry(relpath: str, raw: Any, manifest_format: int = MANIFEST_FORMAT) -> FileEntry:
    """A file entry from its JSON form in `manifest_format`; ValueError naming `relpath` on anything
    malformed. The one check of an entry: the manifest reader and the commit (each receipt's entries, in
    today's format) both decide here."""
    what = f"manifest entry for {relpath!r}"
    if not isinstance(raw, dict):
        raise ValueError(f"{what} is not an object")
    _check_keys(raw, _ENTRY_KEYS[manifest_format], what)
    size, logical, comp = raw["size"], raw["logical_size"], raw["compression"]
    for name, value in (("size", size), ("logical_size", logical)):
        if not _is_count(value):
            raise ValueError(f"{what} has a bad {name}: {value!r:.40}")
    try:
        digest = Digest(SHA256, raw["sha256"]) if manifest_format == 1 else Digest(raw["algorithm"], raw["digest"])
    except ValueError as exc:
        raise ValueError(f"{what} has a bad digest: {exc}") from None
    if comp not in COMPRESSIONS:
        raise ValueError(f"{what} has an unknown compression: {comp!r:.40}")
    if comp is None and logical != size:
        raise ValueError(f"{what} is uncompressed but its logical size {logical} is not its size {size}")
    return FileEntry(size=size, digest=digest, logical_size=logical, compression=comp)


# --- manifest ---------------------------------------------------------------------------------------

_MANIFEST_KEYS = {
    1: frozenset({"format", "step", "txid", "created", "metadata", "files"}),
    2: frozenset({"format", "step", "txid", "created", "metadata", "files", "writer_version"}),
}


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

    def to_bytes(self) -> bytes:
        """The canonical bytes written as manifest.json (MANIFEST_FORMAT only: older formats are read, never
        written)."""
        if self.format != MANIFEST_FORMAT or self.writer_version is None:
            raise ValueError(
                f"manifest format {self.format} is read, never written (this rlckpt writes {MANIFEST_FORMAT})"
            )
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
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and validate manifest bytes of any format this rlckpt reads.

        Raises:
            NewerFormatError: a format newer than this rlckpt reads (one line naming it and its writer).
            ValueError (or InvalidPathError): anything malformed.
        """
        obj = parse_canonical(data, "manifest")
        fmt = _record_format(obj, "manifest", MANIFEST_FORMAT)
        _check_keys(obj, _MANIFEST_KEYS[fmt], "manifest")
        files_obj = obj["files"]
        if not isinstance(files_obj, dict):
            raise ValueError("manifest 'files' is not an object")
        files: dict[str, FileEntry] = {}
        paths = PathSet()
        for relpath, raw in files_obj.items():
            validate_relpath(relpath)
            files[relpath] = parse_file_entry(relpath, raw, fmt)
            clash = paths.add(relpath)
            if clash is not None:
                raise InvalidPathError(clash.describe())
        if not isinstance(obj["metadata"], dict):
            raise ValueError("manifest 'metadata' is not an object")
        if not is_txid(obj["txid"]) or not isinstance(obj["created"], str):
            raise ValueError(f"manifest has a bad txid {obj['txid']!r:.80} or no 'created' string")
        return cls(
            step=validate_step(obj["step"]),
            txid=obj["txid"],
            created=obj["created"],
            files=files,
            metadata=obj["metadata"],
            format=fmt,
            writer_version=_writer_version(obj["writer_version"], "manifest") if fmt >= 2 else None,
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

    @classmethod
    def from_json(cls, raw: Any) -> CommitSignature:
        """ValueError on anything but an object of exactly these three keys, each well-formed."""
        if not isinstance(raw, dict):
            raise ValueError(f"COMMIT's signature is not an object or null: {raw!r:.80}")
        _check_keys(raw, frozenset({"algorithm", "key_id", "value"}), "COMMIT's signature")
        if raw["algorithm"] not in SIGNATURE_ALGORITHMS:
            raise ValueError(f"COMMIT's signature is of an unknown algorithm {raw['algorithm']!r:.40}")
        if not isinstance(raw["key_id"], str) or _KEY_ID.fullmatch(raw["key_id"]) is None:
            raise ValueError(f"COMMIT's signature has a bad key_id: {raw['key_id']!r:.80}")
        if not isinstance(raw["value"], str) or _SIGNATURE_HEX.fullmatch(raw["value"]) is None:
            raise ValueError("COMMIT's signature value is not 128 lowercase hex digits")
        return cls(key_id=raw["key_id"], value=bytes.fromhex(raw["value"]), algorithm=raw["algorithm"])


@dataclass(frozen=True)
class CommitMarker:
    """The COMMIT record: names the digest (and its algorithm) of the manifest bytes beside it and, from
    format 3, the run it was written in and the bundle's signature (None: unsigned).

    To add a field: a dataclass field, its key in `_fields`, and its check in the reader of the format
    that has it (`_COMMIT_READERS`)."""

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
            raise ValueError(f"COMMIT format {COMMIT_FORMAT} names its run's id, got {self.run!r:.80}")
        return canonical_json(self._fields())

    @classmethod
    def from_bytes(cls, data: bytes) -> CommitMarker:
        """Parse and validate COMMIT bytes of any format this rlckpt reads.

        Raises:
            NewerFormatError: a format newer than this rlckpt reads (one line naming it and its writer).
            ValueError: anything malformed.
        """
        obj = parse_canonical(data, "COMMIT")
        fmt = _record_format(obj, "COMMIT", COMMIT_FORMAT)
        _check_keys(obj, _COMMIT_KEYS[fmt], "COMMIT")
        if not is_txid(obj["txid"]):
            raise ValueError(f"COMMIT has a bad txid: {obj['txid']!r:.80}")
        return _COMMIT_READERS[fmt](obj, validate_step(obj["step"]))


_COMMIT_KEYS = {
    1: frozenset({"format", "step", "txid", "manifest_sha256"}),
    2: frozenset({"format", "writer_version", "step", "txid", "manifest_algorithm", "manifest_digest"}),
    3: frozenset(
        {"format", "writer_version", "step", "txid", "manifest_algorithm", "manifest_digest", "run", "signature"}
    ),
}


def _commit_1(obj: dict[str, Any], step: int) -> CommitMarker:
    try:
        digest = Digest(SHA256, obj["manifest_sha256"])
    except ValueError as exc:
        raise ValueError(f"COMMIT has a bad manifest_sha256: {exc}") from None
    return CommitMarker(step=step, txid=obj["txid"], manifest=digest, format=1, writer_version=None)


def _commit_2(obj: dict[str, Any], step: int) -> CommitMarker:
    try:
        digest = Digest(obj["manifest_algorithm"], obj["manifest_digest"])
    except ValueError as exc:
        raise ValueError(f"COMMIT names a bad manifest digest: {exc}") from None
    version = _writer_version(obj["writer_version"], "COMMIT")
    return CommitMarker(step=step, txid=obj["txid"], manifest=digest, format=2, writer_version=version)


def _commit_3(obj: dict[str, Any], step: int) -> CommitMarker:
    marker = _commit_2(obj, step)
    if not isinstance(obj["run"], str) or _RUN_ID.fullmatch(obj["run"]) is None:
        raise ValueError(f"COMMIT names a bad run id: {obj['run']!r:.80}")
    signature = None if obj["signature"] is None else CommitSignature.from_json(obj["signature"])
    return replace(marker, run=obj["run"], signature=signature, format=3)


_COMMIT_READERS: dict[int, Callable[[dict[str, Any], int], CommitMarker]] = {1: _commit_1, 2: _commit_2, 3: _commit_3}
