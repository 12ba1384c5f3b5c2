"""The store's own records declared with ``rlckpt.formats``: every format of ``manifest.json`` (and of the
file entries it holds) and of ``COMMIT`` this rlckpt reads, oldest first. manifest.py reads through these;
docs/formats.md is rendered from them.

| record   | format | digests                                                                           |
|----------|--------|-----------------------------------------------------------------------------------|
| manifest | 1      | every entry sha256 under `sha256`; no `writer_version`                            |
| manifest | 2      | each entry names its `algorithm` beside its `digest`; `writer_version`            |
| manifest | 3      | as 2; an entry's `compression` may also be `zstd-planes2`, `-planes4`, `-planes8`  |
| COMMIT   | 1      | `manifest_sha256`                                                                 |
| COMMIT   | 2      | `manifest_algorithm` + `manifest_digest`; `writer_version`                        |
| COMMIT   | 3      | as 2, plus `run` (the run's id) and `signature` (null when committed unsigned)    |
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rlckpt.errors import CorruptBundleError, InvalidPathError
from rlckpt.formats import SHA256_HEX, Anything, Field, Int, MapOf, Nullable, Obj, Record, Refusal, Str
from rlckpt.store.io.compression import COMPRESSIONS, ZSTD
from rlckpt.store.io.digest import ALGORITHMS
from rlckpt.store.paths.paths import TXID_PATTERN, validate_relpath

MANIFEST_FORMAT = 3
COMMIT_FORMAT = 3
SIGNATURE_ALGORITHMS = ("ed25519",)
RUN_ID = "[0-9a-f]{32}"  # run_record.RUN_ID_PATTERN (run_record imports this package's manifest module)
KEY_ID = "[0-9a-f]{32}"  # signing.key_id_of
VERSION = "[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}"  # a PEP 440 version, as a plain token


@dataclass(frozen=True)
class RelPath(Str):
    """A bundle-relative path, as ``paths.validate_relpath`` takes it: what a manifest's files are keyed by."""

    def describe(self) -> str:
        return "bundle-relative path"

    def check(self, value: Any) -> None:
        if type(value) is not str:
            raise self.wrong(value)
        try:
            validate_relpath(value)
        except InvalidPathError as exc:
            raise Refusal(str(exc)) from None


TXID = Str(pattern=TXID_PATTERN, meaning="txid (1-64 of A-Z a-z 0-9 _ -)")
HEX_64 = Str(pattern="[0-9a-f]{64}", meaning="hex digest (64 lowercase hex digits)")
DIGEST_ALGORITHM = Str(choices=ALGORITHMS)
WRITER_VERSION = Field(
    "writer_version", Str(pattern=VERSION, meaning="rlckpt version (a PEP 440 token)"), "the rlckpt that wrote it"
)
STEP = Field("step", Int(minimum=0), "the bundle's step")
TXID_FIELD = Field("txid", TXID, "the transaction that wrote the bundle (its data lives under it)")


def _sizes(compressions: tuple[str, ...]) -> tuple[Field, ...]:
    return (
        Field("size", Int(minimum=0), "bytes stored (after compression, if any): what the digest is of"),
        Field(
            "logical_size",
            Int(minimum=0),
            "bytes a reader gets back (inflated); equal to `size` when uncompressed, which the reader checks",
        ),
        Field(
            "compression",
            Nullable(Str(choices=compressions)),
            "how the stored bytes are compressed: one zstd frame, of the bytes as they are (`zstd`) or regrouped "
            "into byte planes of 2, 4 or 8-byte elements first (`zstd-planes<W>`, [formats of "
            "files](store-protocol.md#compressed-files))",
        ),
    )


def _file_entry(compressions: tuple[str, ...]) -> Obj:
    sizes = _sizes(compressions)
    return Obj(
        "file entry",
        (
            sizes[0],
            Field("algorithm", DIGEST_ALGORITHM, "the digest's algorithm (this rlckpt writes blake3)"),
            Field("digest", HEX_64, "the digest of the stored bytes under `algorithm`"),
            *sizes[1:],
        ),
    )


_SIZES_1 = _sizes((ZSTD,))
FILE_ENTRY_1 = Obj(
    "file entry",
    (_SIZES_1[0], Field("sha256", SHA256_HEX, "sha256 of the stored bytes"), *_SIZES_1[1:]),
)
FILE_ENTRY_2 = _file_entry((ZSTD,))
FILE_ENTRY = _file_entry(COMPRESSIONS)


def _manifest_fields(entry: Obj, *versioned: Field) -> tuple[Field, ...]:
    return (
        *versioned,
        STEP,
        TXID_FIELD,
        Field("created", Str(), "when it was committed (UTC, ISO 8601)"),
        Field(
            "metadata",
            MapOf(Anything()),
            "the saver's own metadata: for a run bundle, the [run-bundle metadata](#run-bundle-metadata)",
        ),
        Field(
            "files",
            MapOf(entry, key=RelPath()),
            "every file of the bundle (no other may be in it) by its path: POSIX, relative, no `..`, `.` or "
            "empty segment, no backslash or NUL, not under manifest.json or COMMIT",
        ),
    )


MANIFEST = Record(
    "manifest",
    MANIFEST_FORMAT,
    _manifest_fields(FILE_ENTRY, WRITER_VERSION),
    CorruptBundleError,
    constant="MANIFEST_FORMAT",
    stored_in="`step_<N>/manifest.json`: canonical JSON, at most 32 MiB (about 180,000 files)",
    writer="`rlckpt.store.records.manifest.Manifest` (`BundleTransaction.commit`, from every participant's receipt)",
    doc=(
        "Every file of a committed bundle with its stored size and digest, the bundle's step and txid, and "
        "the saver's metadata. A reader checks it once its digest matches the one COMMIT names (a path "
        "listed twice, or a file where another path needs a directory, is refused too), then each file's "
        "bytes against its entry ([store-protocol.md](store-protocol.md#reading-storeopenstep--bundle))."
    ),
    written_by="rlckpt 0.1.0, from byte-plane compression (issue 40), for a bundle with a byte-plane entry",
    changes="an entry's `compression` may be `zstd-planes2`, `zstd-planes4` or `zstd-planes8` (byte planes, then zstd)",
)
MANIFEST_2 = replace(
    MANIFEST,
    format=2,
    fields=_manifest_fields(FILE_ENTRY_2, WRITER_VERSION),
    written_by="rlckpt 0.1.0, from the BLAKE3 change (2b39f30); still, for a bundle with no byte-plane entry",
    changes="each entry names its digest's `algorithm` (`sha256` → `algorithm` + `digest`); `writer_version`",
)
MANIFEST_1 = replace(
    MANIFEST,
    format=1,
    fields=_manifest_fields(FILE_ENTRY_1),
    written_by="rlckpt 0.1.0, deb1516 until the BLAKE3 change (2b39f30); the bundles in `tests/fixtures/`",
    changes="the first: every digest sha256",
)
MANIFEST_FORMATS = (MANIFEST_1, MANIFEST_2, MANIFEST)  # every format this rlckpt reads, oldest first

SIGNATURE = Obj(
    "signature",
    (
        Field("algorithm", Str(choices=SIGNATURE_ALGORITHMS), "the signature's algorithm"),
        Field(
            "key_id",
            Str(pattern=KEY_ID, meaning="key id (32 lowercase hex digits)"),
            "the signing key's id: the first half of the sha256 of its raw public key",
        ),
        Field(
            "value",
            Str(pattern="[0-9a-f]{128}", meaning="128 lowercase hex digits"),
            'the 64-byte signature of the canonical JSON `{"manifest":"<alg>:<hex>","purpose":"rlckpt bundle",'
            '"run":<run>,"step":<step>}` ([security.md](security.md#what-a-signature-covers))',
        ),
    ),
)
_COMMIT_2 = (
    WRITER_VERSION,
    STEP,
    TXID_FIELD,
    Field("manifest_algorithm", DIGEST_ALGORITHM, "the algorithm of `manifest_digest` (this rlckpt writes blake3)"),
    Field("manifest_digest", HEX_64, "the digest of manifest.json's bytes under `manifest_algorithm`"),
)
COMMIT = Record(
    "COMMIT",
    COMMIT_FORMAT,
    (
        *_COMMIT_2,
        Field(
            "run",
            Str(pattern=RUN_ID, meaning="run id (32 lowercase hex digits)"),
            "the `run_id` of the run's [run record](#run-record) when the bundle was committed",
        ),
        Field("signature", Nullable(SIGNATURE), "null: committed without a signing key"),
    ),
    CorruptBundleError,
    constant="COMMIT_FORMAT",
    stored_in="`step_<N>/COMMIT`: canonical JSON, at most 64 KiB; written last",
    writer="`rlckpt.store.records.manifest.CommitMarker` (`BundleTransaction.commit`)",
    doc=(
        "The marker that makes a bundle committed: a step without it is not read. It names the digest of "
        "the manifest beside it, and from format 3 the run it was committed in and the bundle's signature. "
        "A store with a verify key accepts only a COMMIT signed by that key for this run "
        "([security.md](security.md)); formats 1 and 2 read as unsigned."
    ),
    written_by="rlckpt 0.1.0, from signed bundles (22045c8)",
    changes="`run` and `signature` (both always present)",
)
COMMIT_2 = replace(
    COMMIT,
    format=2,
    fields=_COMMIT_2,
    written_by="rlckpt 0.1.0, from the BLAKE3 change (2b39f30) until signed bundles (22045c8)",
    changes="the manifest's digest names its algorithm (`manifest_algorithm` + `manifest_digest`); `writer_version`",
)
COMMIT_1 = replace(
    COMMIT,
    format=1,
    fields=(STEP, TXID_FIELD, Field("manifest_sha256", SHA256_HEX, "sha256 of manifest.json's bytes")),
    written_by="as manifest format 1",
    changes="the first",
)
COMMIT_FORMATS = (COMMIT_1, COMMIT_2, COMMIT)  # every format this rlckpt reads, oldest first
