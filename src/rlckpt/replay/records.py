"""The replay index's records and their canonical (digestible) JSON form. No tensors here."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

REPLAY_INDEX_FORMAT = 2  # a saved index carries it as "schema_version"; 2 added each group's fields


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
        """Inverse of to_json; raises KeyError/TypeError/ValueError on malformed input."""
        target = data["target_step"]
        return cls(
            group_id=str(data["group_id"]),
            seq=int(data["seq"]),
            weight_version=int(data["weight_version"]),
            target_step=None if target is None else int(target),
            sample_ids=tuple(str(s) for s in data["sample_ids"]),
            start_weight=None if data["start_weight"] is None else int(data["start_weight"]),
            end_weight=None if data["end_weight"] is None else int(data["end_weight"]),
            fields=tuple(str(f) for f in data["fields"]),
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
            "schema_version": REPLAY_INDEX_FORMAT,
            "partition_id": self.partition_id,
            "group_size": self.group_size,
            "next_seq": self.next_seq,
            "groups": groups,
            "digest": groups_digest(groups),
        }
