"""The run record `_run.json`: the run's identity, a random id made once, by the run's first writer.

Every COMMIT written since names the run's id, and a signature covers it: a reader with a verify key
accepts a signed bundle only in the run whose record names the id it was signed for, so a bundle copied
into another run does not verify there. The id is not the run's URL: a run replicated to another tier
(the same COMMIT and manifest bytes, published there) takes its source's record, and its bundles verify
there as they did at the source.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import asdict, dataclass

from rlckpt.errors import MalformedRecordError, StoreConfigError
from rlckpt.formats import Field, Record, Str, quoted, read_format
from rlckpt.store.backends import Backend
from rlckpt.store.records.manifest import canonical_json, parse_canonical

RUN_RECORD_NAME = "_run.json"
RUN_RECORD_FORMAT = 1
RUN_RECORD_MAX_BYTES = 4 << 10
RUN_ID_PATTERN = "[0-9a-f]{32}"

RUN_RECORD = Record(
    "run record",
    RUN_RECORD_FORMAT,
    (
        Field(
            "run_id",
            Str(pattern=RUN_ID_PATTERN, meaning="run id (32 lowercase hex digits)"),
            "the run's identity: every COMMIT written since names it, and a bundle's signature covers it",
        ),
        Field("created", Str(), "when the record was made (UTC, ISO 8601)"),
    ),
    MalformedRecordError,
    constant="RUN_RECORD_FORMAT",
    stored_in="`_run.json` at the run's root: canonical JSON, at most 4 KiB",
    writer=(
        "`rlckpt.store.records.run_record.RunRecord` (the run's first `BundleStore.begin`, create-exclusive; a "
        "replica takes its source's through `BundleStore.ensure_run_record`)"
    ),
    doc=(
        "The run's identity. A reader with a verify key accepts a signed bundle only where the run record "
        "names the run the bundle was signed for (docs/security.md). Written once; never rewritten or "
        "removed by rlckpt."
    ),
    written_by="rlckpt 0.1.0, from issue 18's signed bundles",
    changes="the first",
)
RUN_RECORD_FORMATS = (RUN_RECORD,)  # every format this rlckpt reads, oldest first


@dataclass(frozen=True)
class RunRecord:
    """The run's id and when it was made."""

    run_id: str
    created: str
    format: int = RUN_RECORD_FORMAT

    @classmethod
    def new(cls, run_id: str | None = None) -> RunRecord:
        """A record made now: of `run_id` (a run whose id its writer was given), or a new random id."""
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return cls(run_id=run_id or uuid.uuid4().hex, created=created)

    def to_bytes(self) -> bytes:
        return canonical_json(asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes, where: str = RUN_RECORD_NAME) -> RunRecord:
        """Parse and check against ``RUN_RECORD``; MalformedRecordError naming `where` and the field."""
        try:
            obj = parse_canonical(data, "run record")
        except ValueError as exc:
            raise MalformedRecordError(f"{where}: {exc}") from None
        read_format(RUN_RECORD_FORMATS, obj, where)
        return cls(run_id=obj["run_id"], created=obj["created"])


def checked_run_id(run_id: object, what: str = "") -> str:
    """`run_id` if it can be a run's id (32 lowercase hex digits, as `_run.json` holds it).

    Raises:
        StoreConfigError: naming `what` (where the value came from, if anywhere) and the value (shortened).
    """
    if not isinstance(run_id, str) or re.fullmatch(RUN_ID_PATTERN, run_id) is None:
        source = f"{what} " if what else ""
        raise StoreConfigError(
            f"{source}{quoted(run_id)} is not a run id (32 lowercase hex digits, as `rlckpt ls --json` shows in `run`)"
        )
    return run_id


def read_run_record(backend: Backend) -> RunRecord | None:
    """The run's record, or None when it has none.

    Raises:
        MalformedRecordError: it does not read (names the field).
        UnsafeObjectError: larger than its cap, or not a regular file.
    """
    path = backend.path(RUN_RECORD_NAME)
    try:
        data = backend.read_object(path, RUN_RECORD_MAX_BYTES, "run record")
    except FileNotFoundError:
        return None
    return RunRecord.from_bytes(data, path)


def create_run_record(backend: Backend, record: RunRecord) -> RunRecord:
    """The run's record: `record`, written create-exclusively, or the one already there when another
    writer made it first (every writer of the run then signs for the same id). Raises as read_run_record."""
    try:
        backend.create_exclusive(backend.path(RUN_RECORD_NAME), record.to_bytes())
    except FileExistsError:
        existing = read_run_record(backend)
        if existing is None:  # made and removed meanwhile: not by rlckpt, which never removes it
            raise MalformedRecordError(f"{backend.path(RUN_RECORD_NAME)} appeared and vanished meanwhile") from None
        return existing
    return record
