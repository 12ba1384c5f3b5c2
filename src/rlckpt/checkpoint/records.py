"""The run bundle's records as `rlckpt train` writes them today (``RUN_BUNDLE_FORMAT``): the run-bundle
metadata (the manifest's user metadata) and the data-plane metadata inside it, which ``data_plane/
metadata.json`` holds too. Older formats are declared and read in checkpoint/run_format.py."""

from __future__ import annotations

from rlckpt.checkpoint import layout
from rlckpt.errors import CorruptBundleError
from rlckpt.formats import SHA256_HEX, Field, Int, MapOf, Number, Record, Str

ROLLOUT_ORDERS = ("in_order", "async")  # the run's (`rlckpt train --mode`)
UPLOAD_TIMINGS = ("staged", "inline", "pinned")  # the save's (`--upload-timing`)

DATA_PLANE_METADATA = Record(
    "data-plane metadata",
    2,
    (
        Field(layout.META_INDEX_DIGEST, SHA256_HEX, "the digest of the replay index saved with the snapshot"),
        Field(layout.META_GROUP_COUNT, Int(minimum=0), "how many groups that index holds"),
        Field(layout.META_ROLLOUT_ORDER, Str(choices=ROLLOUT_ORDERS), "the run's rollout order"),
        Field("step", Int(minimum=0), "the step saved"),
        Field("partition_id", Str(), "the data-plane partition of the rows"),
    ),
    CorruptBundleError,
    version_key=None,
    stored_in="`data_plane/metadata.json` (its `user_metadata`) and the run-bundle metadata (`data_plane`)",
    writer="`rlckpt.checkpoint.save` (`_index_metadata`)",
    doc=(
        "Ties a data-plane snapshot to the replay index saved with it: a restore refuses a snapshot whose "
        "index digest is not the index's and the manifest's, before anything is loaded. It carries no "
        "number of its own: the run-bundle format says which shape it has (format 1: `mode`, 2 and 3: "
        "`rollout_order`)."
    ),
    written_by="rlckpt 0.1.0, run-bundle formats 2 and 3 (from d74e0d4)",
    changes="`rollout_order` (was `mode`)",
)

RUN_BUNDLE = Record(
    "run-bundle metadata",
    layout.RUN_BUNDLE_FORMAT,
    (
        Field(layout.META_INDEX_DIGEST, SHA256_HEX, "the replay index's digest"),
        Field(layout.META_GROUP_COUNT, Int(minimum=0), "how many groups the index holds"),
        Field(layout.META_ROLLOUT_ORDER, Str(choices=ROLLOUT_ORDERS), "the run's; a resume must ask for the same"),
        Field(layout.META_UPLOAD_TIMING, Str(choices=UPLOAD_TIMINGS), "the save's (recorded, never checked)"),
        Field("data_plane", DATA_PLANE_METADATA.body, "the data-plane metadata (below), as the snapshot holds it"),
        Field(layout.META_TRAINER_RANKS, Int(minimum=1), "how many trainer ranks saved `policy/`", False),
        Field("task", Str(), "the task, as `repr` shows it (recorded)", False),
        Field("steps_target", Int(minimum=0), "the run's `--steps` (recorded)", False),
        Field(
            "metrics",
            MapOf(Number()),
            "the run's numbers at the step saved (`reward`, `loss`): what `--keep-best K --metric NAME` ranks by",
            False,
        ),
    ),
    CorruptBundleError,
    closed=False,
    version_key=layout.META_FORMAT,
    constant="RUN_BUNDLE_FORMAT",
    stored_in="`manifest.json`, its `metadata` (the store's user metadata)",
    writer="`rlckpt.checkpoint.save` (`PendingSave`), with `SaveParticipants.extra_metadata`",
    doc=(
        "What a restore needs to know of a bundle before it fetches a byte: its format (and so where and in "
        "which form its policy is), the rollout order it must be resumed with, and the index digest every "
        "piece must agree on. Open: the keys of `SaveParticipants.extra_metadata` are kept beside these and "
        "not read. Every format is read by `rlckpt.checkpoint.run_format.read_run_bundle`; the policy's "
        "place by format: 1-2 `policy/state.pt` (the trainer's whole state, sharded at load), 3 `policy/` "
        "(the trainer ranks' DCP checkpoint). A newer format is refused in one line (`BundleFormatError`): "
        "resuming an older bundle instead would save over the newer one."
    ),
    written_by="rlckpt 0.1.0, from 3b34031",
    changes="`policy/` is the trainer ranks' DCP checkpoint; `trainer_ranks`",
)
