"""The run-bundle record — the manifest metadata `rlckpt train` writes — read in every format this rlckpt
resumes, into one ``RunBundle``. Restore asks it, never the raw keys, what a bundle holds; the old
formats' key names and layouts are known here and nowhere else.

Formats (all written by rlckpt 0.1.0; ``RUN_BUNDLE_FORMAT`` is the one written today):

- 1, commits 154794b..ec2a90b: the rollout order under ``mode``, the upload timing under ``save_mode``;
  the policy as one file, ``policy/state.pt``
- 2, commits d74e0d4..95cbc60: ``rollout_order`` and ``upload_timing``; the policy still one file
- 3, from 3b34031: ``policy/`` is a DCP checkpoint written by the trainer ranks; ``trainer_ranks``

A one-file policy holds the trainer's whole state (``Trainer.state_dict``); the trainer ranks load it
as the full state and each keeps its shard, at any rank count. A format newer than this rlckpt knows
is refused: resuming an older bundle instead would save over the newer one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import rlckpt
from rlckpt.checkpoint import layout
from rlckpt.checkpoint.records import DATA_PLANE_METADATA, ROLLOUT_ORDERS, RUN_BUNDLE
from rlckpt.errors import BundleFormatError
from rlckpt.formats import Field, Record, Str

PolicyForm = Literal["dcp", "whole"]
POLICY_DCP: PolicyForm = "dcp"  # a DCP checkpoint directory, one participant per trainer rank
POLICY_WHOLE: PolicyForm = "whole"  # the trainer's whole (unsharded) state in one torch.save file

# The columns every rollout row `rlckpt train` committed had while its replay index was of format 1
# (run format 1 and format 2 before the pinned save, 4c913fc); that index did not record them.
INDEX_1_COMMIT_FIELDS = (
    "completion", "draw_seq", "logprobs", "prompt", "prompt_id", "reward", "sample_index", "weight_version",
)  # fmt: skip


def _renamed(record: Record, fields: Mapping[str, Field], drop: Collection[str] = (), **changes: Any) -> Record:
    """`record` with some fields swapped for others (declared in its own format's words) and some dropped."""
    kept = tuple(f for f in record.fields if f.name not in drop)
    return replace(record, fields=tuple(fields.get(f.name, f) for f in kept), **changes)


_MODE = Field("mode", Str(choices=ROLLOUT_ORDERS), "the run's rollout order")
DATA_PLANE_METADATA_1 = _renamed(
    DATA_PLANE_METADATA,
    {layout.META_ROLLOUT_ORDER: _MODE},
    format=1,
    written_by="rlckpt 0.1.0, run-bundle format 1 (154794b..ec2a90b)",
    changes="the first",
)
RUN_BUNDLE_2 = _renamed(
    RUN_BUNDLE,
    {},
    drop=(layout.META_TRAINER_RANKS,),
    format=2,
    written_by="rlckpt 0.1.0, d74e0d4..95cbc60",
    changes="`rollout_order` and `upload_timing` (were `mode` and `save_mode`)",
)
RUN_BUNDLE_1 = _renamed(
    RUN_BUNDLE_2,
    {
        layout.META_ROLLOUT_ORDER: _MODE,
        layout.META_UPLOAD_TIMING: Field("save_mode", Str(choices=("staged", "inline")), "the save's upload timing"),
        "data_plane": replace(RUN_BUNDLE.body.field("data_plane"), kind=DATA_PLANE_METADATA_1.body),
    },
    format=1,
    written_by="rlckpt 0.1.0, 154794b..ec2a90b",
    changes="the first",
)
RUN_BUNDLE_FORMATS = (RUN_BUNDLE_1, RUN_BUNDLE_2, RUN_BUNDLE)  # every format this rlckpt reads, oldest first
# The data-plane metadata (in the manifest and in data_plane/metadata.json) by run-bundle format.
DATA_PLANE_RECORDS = {1: DATA_PLANE_METADATA_1, 2: DATA_PLANE_METADATA, 3: DATA_PLANE_METADATA}


@dataclass(frozen=True)
class RunBundle:
    """What a run bundle's manifest metadata says, whatever format wrote it."""

    format: int
    rollout_order: str  # the run's "in_order" / "async"
    upload_timing: str  # the save's "staged" / "inline" / "pinned" (recorded, never checked)
    policy_path: str  # where the policy is inside the bundle
    policy_form: PolicyForm
    trainer_ranks: int | None = None  # how many ranks wrote a DCP policy (None: one process, or not recorded)

    def missing_pieces(self, files: Collection[str]) -> list[str]:
        """Of the pieces a restore reads, those `files` (a manifest's paths) lack. The policy counts as there
        when its one file is, or, in a directory, when any file is (its reader names what it needs: DCP's
        `.metadata` for the trainer ranks, one blob for the benchmarks' stand-in trainer)."""
        missing = [rel for rel in layout.RUN_BUNDLE_COMMON_PIECES if rel not in files]
        under = self.policy_path + "/"
        if self.policy_path not in files and not any(rel.startswith(under) for rel in files):
            missing.insert(0, self.policy_path if self.policy_form == POLICY_WHOLE else under)
        return missing

    @property
    def data_plane_record(self) -> Record:
        """The data-plane metadata's declaration in this format (``data_plane/metadata.json``'s user metadata)."""
        return DATA_PLANE_RECORDS[self.format]


def _format_1(meta: Mapping[str, Any]) -> RunBundle:
    """Format 1 named the rollout order ``mode`` and the upload timing ``save_mode``."""
    return RunBundle(1, meta["mode"], meta["save_mode"], layout.POLICY_FILE, POLICY_WHOLE)


def _format_2(meta: Mapping[str, Any]) -> RunBundle:
    """Format 2: today's key names, the policy still one file."""
    order, timing = meta[layout.META_ROLLOUT_ORDER], meta[layout.META_UPLOAD_TIMING]
    return RunBundle(2, order, timing, layout.POLICY_FILE, POLICY_WHOLE)


def _format_3(meta: Mapping[str, Any]) -> RunBundle:
    """Format 3: the policy is the trainer ranks' DCP checkpoint."""
    order, timing = meta[layout.META_ROLLOUT_ORDER], meta[layout.META_UPLOAD_TIMING]
    return RunBundle(3, order, timing, layout.POLICY_DIR, POLICY_DCP, meta.get(layout.META_TRAINER_RANKS))


_BY_NUMBER = {record.format: record for record in RUN_BUNDLE_FORMATS}
READERS: dict[int, Callable[[Mapping[str, Any]], RunBundle]] = {1: _format_1, 2: _format_2, 3: _format_3}


def read_run_bundle(step: int, meta: Mapping[str, Any]) -> RunBundle:
    """The run-bundle record of a manifest's metadata, in whichever format wrote it, checked against that
    format's declaration (``RUN_BUNDLE_FORMATS``).

    Raises:
        BundleFormatError: one line naming the format, who wrote it and what to do: a format newer than
            this rlckpt reads, or no run-bundle format at all (not a bundle of `rlckpt train`).
        CorruptBundleError: a format this rlckpt reads, but a field missing or of another type (named).
    """
    found = meta.get(layout.META_FORMAT)
    number = found if isinstance(found, int) and not isinstance(found, bool) else None
    if number in READERS:
        _BY_NUMBER[number].check(dict(meta), f"step {step}: manifest metadata")
        return READERS[number](meta)
    readable = f"formats {min(READERS)}-{max(READERS)}"
    if number is not None and number > max(READERS):
        raise BundleFormatError(
            f"step {step}: run-bundle format {found} was written by a newer rlckpt than this one "
            f"({rlckpt.__version__}, which reads {readable}); resume it with that newer rlckpt"
        )
    if found is None:
        raise BundleFormatError(
            f"step {step} is not a run bundle: its manifest names no run-bundle format under {layout.META_FORMAT!r}; "
            "not a bundle written by `rlckpt train`"
        )
    raise BundleFormatError(
        f"step {step}: manifest metadata has run-bundle format {found!r}, this rlckpt ({rlckpt.__version__}) "
        f"reads {readable}; not a bundle written by `rlckpt train`?"
    )
