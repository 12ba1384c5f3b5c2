"""Replay indexes saved in an older format, read into today's (``REPLAY_INDEX_FORMAT``): the one place
that knows their shapes. ``ReplayBuffer.load_state_dict`` reads today's format only.

| format | groups hold                                                                          |
|--------|--------------------------------------------------------------------------------------|
| 1      | group_id, seq, weight_version, target_step, sample_ids, start_weight, end_weight      |
| 2      | the same and ``fields``: the columns the group's commit wrote (read by a pinned save) |

Format 1 did not record ``fields``; the writer of the rows knew them. Whoever upgrades a format-1 index
names the columns its commits wrote (``commit_fields``); a reserved group has none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlckpt.errors import ReplayStateError
from rlckpt.replay.records import REPLAY_INDEX_FORMAT, groups_digest


def index_format(state: Mapping[str, Any]) -> Any:
    """The format a saved index says it has (its ``schema_version``)."""
    return state.get("schema_version")


def upgrade_index(
    state: Mapping[str, Any], *, commit_fields: Sequence[str] | None = None, where: str = "replay index"
) -> dict[str, Any]:
    """``state`` in today's format, with its digest over the groups as they now read. An index of
    today's format comes back as it is (its digest unchanged).

    Args:
        commit_fields: the columns every commit of the run that saved a format-1 index wrote.
        where: names the index in errors (step and file).
    Raises:
        ReplayStateError: naming `where`: a format this code does not read, groups that are not a list of
            objects, or a format-1 index with committed groups and no `commit_fields`.
    """
    found = index_format(state)
    if found == REPLAY_INDEX_FORMAT:
        return dict(state)
    reader = _FROM.get(found) if isinstance(found, int) and not isinstance(found, bool) else None
    if reader is None:
        raise ReplayStateError(
            f"{where}: replay index format {found!r}, this code reads formats {sorted([*_FROM, REPLAY_INDEX_FORMAT])}"
        )
    groups = state.get("groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise ReplayStateError(f"{where}: replay index format {found} has no list of group objects")
    upgraded = reader(groups, commit_fields, where)
    return {**state, "schema_version": REPLAY_INDEX_FORMAT, "groups": upgraded, "digest": groups_digest(upgraded)}


def _from_format_1(
    groups: list[dict[str, Any]], commit_fields: Sequence[str] | None, where: str
) -> list[dict[str, Any]]:
    """Format 1 → 2: every committed group (one with sample ids) gets ``commit_fields``, a reserved one none."""
    if commit_fields is None and any(g.get("sample_ids") for g in groups):
        raise ReplayStateError(
            f"{where}: a replay index of format 1 does not record the columns its committed groups wrote, "
            "and none were given"
        )
    fields = sorted(commit_fields or ())
    return [{**g, "fields": list(fields) if g.get("sample_ids") else []} for g in groups]


_FROM: dict[int, Callable[[list[dict[str, Any]], Sequence[str] | None, str], list[dict[str, Any]]]] = {
    1: _from_format_1
}
