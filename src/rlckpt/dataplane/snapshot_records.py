"""The records of a data-plane snapshot: ``metadata.json`` (TransferQueue's layout, with the rows section a
rows snapshot adds) and the JSON header of each rows file. Declared here, torch-free, so the metadata can
be checked before anything of the snapshot is loaded."""

from __future__ import annotations

from rlckpt.errors import DataPlaneError
from rlckpt.formats import Anything, Bool, Field, Int, ListOf, MapOf, Record, Str, Tuple

ROWS_FORMAT = 1  # the rows section of metadata.json and every rows file's header carry it
ROWS_MARKER = "rlckpt_rows"  # key of the rows section in metadata.json
ROWS_FILE_PATTERN = r"rows-[0-9]{6,}\.bin"  # a plain name in the snapshot's directory, never a path
# The dtypes a rows file holds, by their torch names (rows_snapshot.DTYPES maps them to torch's).
DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")

ROWS_SECTION = Record(
    "rows snapshot",
    ROWS_FORMAT,
    (
        Field("partition_id", Str(), "the data-plane partition the rows go back into"),
        Field("files", ListOf(Str(pattern=ROWS_FILE_PATTERN, meaning="`rows-NNNNNN.bin`")), "its rows files"),
    ),
    DataPlaneError,
    constant="ROWS_FORMAT",
    stored_in=f"`data_plane/metadata.json`, under `{ROWS_MARKER}`",
    writer="`rlckpt.dataplane.rows_snapshot.rows_metadata` (a pinned save's copy)",
    doc="Which partition a rows snapshot restores into and which files hold its rows, in order.",
    written_by="rlckpt 0.1.0, from 4c913fc (the pinned save)",
    changes="the first",
)

ROWS_ENTRY = Tuple(
    (Str(choices=DTYPE_NAMES), ListOf(Int(minimum=0)), Int(minimum=0), Int(minimum=0)),
    ("dtype", "shape", "offset", "length"),
)
ROWS_HEADER = Record(
    "rows header",
    ROWS_FORMAT,
    (
        Field("keys", ListOf(Str()), "the rows' data-plane keys, in file order"),
        Field(
            "fields",
            MapOf(ListOf(ROWS_ENTRY)),
            "per column, one entry per key: its tensor's dtype, shape, and where its raw bytes lie "
            "(offset and length into the payload after the header)",
        ),
    ),
    DataPlaneError,
    constant="ROWS_FORMAT",
    stored_in="each `data_plane/rows-NNNNNN.bin`: `RLCKROWS`, the header's length (u64 LE), the header "
    "(JSON), then the raw tensor bytes",
    writer="`rlckpt.dataplane.rows_snapshot.encode_rows`",
    doc=(
        "One batch of rows of a rows snapshot. No pickle anywhere: a restore builds nothing but tensors "
        "from it. Every header of a snapshot is checked, and every entry against its file's size, before "
        "the first row goes back into the data plane."
    ),
    written_by="rlckpt 0.1.0, from 4c913fc (the pinned save)",
    changes="the first",
)

SNAPSHOT_METADATA = Record(
    "snapshot metadata",
    None,
    (
        Field("storage_saved", Bool(), "TransferQueue's: whether its storage units were saved"),
        Field("user_metadata", MapOf(Anything()), "what the saver passed (`save_checkpoint(metadata=...)`)"),
        Field(ROWS_MARKER, MapOf(Anything()), "a rows snapshot's section (the next record); absent in TQ's own", False),
    ),
    DataPlaneError,
    closed=False,
    version_key=None,
    stored_in="`data_plane/metadata.json`: JSON",
    writer="TransferQueue's `save_checkpoint` (staged and inline saves), "
    "`rlckpt.dataplane.rows_snapshot.rows_metadata` (pinned saves)",
    doc=(
        "TransferQueue's own layout, which a rows snapshot keeps so a restore reads both alike. It has no "
        "format number of its own (TransferQueue's); it is open, since a TransferQueue upgrade may add keys. "
        "What `rlckpt train` keeps in `user_metadata` is the data-plane metadata (above)."
    ),
)
