"""The replay index's records, their declaration (``REPLAY_INDEX``) and canonical (digestible) JSON form.
No tensors here."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rlckpt.errors import ReplayStateError
from rlckpt.formats import SHA256_HEX, Field, Int, ListOf, Nullable, Obj, Record, Str

# Stored under "format". 1-2 stored it under "schema_version" (replay/index_formats.py reads them); 2 added
# each group's fields, 3 renamed the key to the one every rlckpt record uses.
REPLAY_INDEX_FORMAT = 3

GROUP = Obj(
    "group",
    (
        Field("group_id", Str(), "the group's id, `g` and its `seq` in 8 digits: sorts in reservation order"),
        Field("seq", Int(minimum=0), "its place in reservation order"),
        Field("weight_version", Int(), "the policy version when it was reserved (its generation started)"),
        Field("target_step", Nullable(Int()), "the trainer step it is for (in-order rollouts), else null"),
        Field("sample_ids", ListOf(Str()), "its rows' data-plane keys `<group_id>:<i>`; empty while only reserved"),
        Field("start_weight", Nullable(Int()), "the oldest policy version behind its tokens; null until committed"),
        Field("end_weight", Nullable(Int()), "the newest policy version behind its tokens; null until committed"),
        Field("fields", ListOf(Str()), "the columns its commit wrote, sorted: a copy of its rows reads exactly these"),
    ),
    identity="group_id",
)

REPLAY_INDEX = Record(
    "replay index",
    REPLAY_INDEX_FORMAT,
    (
        Field("partition_id", Str(), "the data-plane partition its rows live in"),
        Field("group_size", Int(minimum=1), "rows per group"),
        Field("next_seq", Int(minimum=0), "the `seq` of the next reservation (above every group's)"),
        Field("groups", ListOf(GROUP), "every group, reserved or committed, in reservation order"),
        Field("digest", SHA256_HEX, "sha256 of the canonical JSON of `groups` (`groups_digest`)"),
    ),
    ReplayStateError,
    constant="REPLAY_INDEX_FORMAT",
    stored_in="`replay_buffer_metadata.pt`: `torch.save` of plain values (no tensors)",
    writer="`rlckpt.replay.IndexCapture.state_dict` (`ReplayBuffer.metadata_state_dict`)",
    doc=(
        "Which data-plane rows form which prompt group. Reserved but uncommitted groups are kept (empty "
        "`sample_ids`) so a resumed run generates exactly them again. The digest pairs the index with the "
        "data-plane snapshot of the same save: the manifest and `data_plane/metadata.json` name it too. "
        "`ReplayBuffer.load_state_dict` reads this format only; restore reads the older ones through "
        "`rlckpt.replay.index_formats.upgrade_index`."
    ),
    written_by="rlckpt 0.1.0, from the strict records (issue 17)",
    changes="the format number under `format`, the key every rlckpt record uses (was `schema_version`)",
)


def sample_id(group_id: str, index: int) -> str:
    """Data-plane key of sample ``index`` of a group (the main job's ``f"{group_id}:{i}"``)."""
    return f"{group_id}:{index}"


@dataclass(frozen=True)
class GroupRecord:
    """One prompt group in the index.

    ``weight_version``: policy version when the group was reserved (generation started).
    ``target_step``: the trainer step it is meant for (in-order mode), else None.
    ``sample_ids``: empty while only reserved; the data-plane keys once committed.
    ``start_weight``/``end_weight``: oldest/newest policy version that produced its tokens.
    ``fields``: the columns its commit wrote (sorted); a copy of its rows reads exactly these, so a
    column added later (``advantages``) is not part of what the group is.
    """

    group_id: str
    seq: int
    weight_version: int
    target_step: int | None
    sample_ids: tuple[str, ...] = ()
    start_weight: int | None = None
    end_weight: int | None = None
    fields: tuple[str, ...] = ()

    @property
    def committed(self) -> bool:
        """True once the group's rows are in the data plane."""
        return bool(self.sample_ids)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (sample_ids as a list)."""
        out = asdict(self)
        out["sample_ids"] = list(self.sample_ids)
        out["fields"] = list(self.fields)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroupRecord:
        """Inverse of to_json, for a dict that passed the ``GROUP`` declaration (``REPLAY_INDEX.check``)."""
        return cls(
            group_id=data["group_id"],
            seq=data["seq"],
            weight_version=data["weight_version"],
            target_step=data["target_step"],
            sample_ids=tuple(data["sample_ids"]),
            start_weight=data["start_weight"],
            end_weight=data["end_weight"],
            fields=tuple(data["fields"]),
        )


def groups_digest(groups: Sequence[dict[str, Any]]) -> str:
    """sha256 hex of the canonical JSON (sorted keys, no spaces, ASCII) of the group dicts."""
    text = json.dumps(list(groups), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class IndexCapture:
    """An immutable view of the replay index at one instant (see ``ReplayBuffer.capture_index``)."""

    partition_id: str
    group_size: int
    next_seq: int
    groups: tuple[GroupRecord, ...]

    @property
    def committed(self) -> list[GroupRecord]:
        """The captured groups that have rows in the data plane."""
        return [g for g in self.groups if g.committed]

    @property
    def sample_ids(self) -> set[str]:
        return {s for g in self.groups for s in g.sample_ids}

    def state_dict(self) -> dict[str, Any]:
        """The serialized index: header, groups as JSON dicts, and the digest over the groups."""
        groups = [g.to_json() for g in self.groups]
        return {
            "format": REPLAY_INDEX_FORMAT,
            "partition_id": self.partition_id,
            "group_size": self.group_size,
            "next_seq": self.next_seq,
            "groups": groups,
            "digest": groups_digest(groups),
        }
