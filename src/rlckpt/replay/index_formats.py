"""Replay indexes saved in an older format, read into today's (``REPLAY_INDEX_FORMAT``): the one place
that knows their shapes (``REPLAY_INDEX_1``, ``REPLAY_INDEX_2``). ``ReplayBuffer.load_state_dict`` reads
today's format only.

| format | key              | groups hold                                                                         |
|--------|------------------|-------------------------------------------------------------------------------------|
| 1      | `schema_version` | group_id, seq, weight_version, target_step, sample_ids, start_weight, end_weight     |
| 2      | `schema_version` | the same and ``fields``: the columns the group's commit wrote (read by a pinned save) |
| 3      | `format`         | as in 2                                                                             |

Format 1 did not record ``fields``; the writer of the rows knew them. Whoever upgrades a format-1 index
names the columns its commits wrote (``commit_fields``); a reserved group has none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from rlckpt.errors import ReplayStateError
from rlckpt.formats import ListOf, Record, read_format
from rlckpt.replay.records import GROUP, REPLAY_INDEX, REPLAY_INDEX_FORMAT, groups_digest

_OLD_KEY = "schema_version"  # where formats 1-2 kept their number

REPLAY_INDEX_2 = Record(
    REPLAY_INDEX.name,
    2,
    REPLAY_INDEX.fields,
    ReplayStateError,
    version_key=_OLD_KEY,
    written_by="rlckpt 0.1.0, 4c913fc (the pinned save) until issue 17",
    changes="each group's `fields`: the columns its commit wrote, which a pinned save copies",
)
GROUP_1 = replace(GROUP, fields=tuple(f for f in GROUP.fields if f.name != "fields"))
REPLAY_INDEX_1 = Record(
    REPLAY_INDEX.name,
    1,
    tuple(replace(f, kind=ListOf(GROUP_1)) if f.name == "groups" else f for f in REPLAY_INDEX.fields),
    ReplayStateError,
    version_key=_OLD_KEY,
    written_by="rlckpt 0.1.0, 7e30a87..367cd92 (run-bundle format 1, and 2 before the pinned save)",
    changes="the first",
)
REPLAY_INDEX_FORMATS = (REPLAY_INDEX_1, REPLAY_INDEX_2, REPLAY_INDEX)  # every format this rlckpt reads, oldest first


def check_index(state: Any, where: str = "replay index") -> int:
    """Check a saved index against the declaration of the format it says it is in; that format.

    Raises:
        ReplayStateError: naming `where`, the record and the field: a format this code does not read (a
            newer one: "written by a newer rlckpt"), or a field missing, of another type or unknown.
    """
    record = read_format(REPLAY_INDEX_FORMATS, state, where)
    assert record.format is not None
    return record.format


def upgrade_index(
    state: Mapping[str, Any], *, commit_fields: Sequence[str] | None = None, where: str = "replay index"
) -> dict[str, Any]:
    """``state`` in today's format, with its digest over the groups as they now read. An index of
    today's format comes back as it is (its digest unchanged).

    Args:
        commit_fields: the columns every commit of the run that saved a format-1 index wrote.
        where: names the index in errors (step and file).
    Raises:
        ReplayStateError: naming `where`: what ``check_index`` refuses, or a format-1 index with committed
            groups and no `commit_fields`.
    """
    found = check_index(state, where)
    upgraded = dict(state)
    for number in range(found, REPLAY_INDEX_FORMAT):
        upgraded = _UPGRADES[number](upgraded, commit_fields, where)
    if found != REPLAY_INDEX_FORMAT:
        upgraded["digest"] = groups_digest(upgraded["groups"])
    return upgraded


def _from_format_1(state: dict[str, Any], commit_fields: Sequence[str] | None, where: str) -> dict[str, Any]:
    """Format 1 → 2: every committed group (one with sample ids) gets ``commit_fields``, a reserved one none."""
    groups = state["groups"]
    if commit_fields is None and any(g["sample_ids"] for g in groups):
        raise ReplayStateError(
            f"{where}: a replay index of format 1 does not record the columns its committed groups wrote, "
            "and none were given"
        )
    fields = sorted(commit_fields or ())
    upgraded = [{**g, "fields": list(fields) if g["sample_ids"] else []} for g in groups]
    return {**state, _OLD_KEY: 2, "groups": upgraded}


def _from_format_2(state: dict[str, Any], commit_fields: Sequence[str] | None, where: str) -> dict[str, Any]:
    """Format 2 → 3: the number moves to the key every record uses; the groups (and their digest) stay."""
    upgraded = {k: v for k, v in state.items() if k != _OLD_KEY}
    return {"format": 3, **upgraded}


_UPGRADES: dict[int, Callable[[dict[str, Any], Sequence[str] | None, str], dict[str, Any]]] = {
    1: _from_format_1,
    2: _from_format_2,
}
