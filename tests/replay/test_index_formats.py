"""Replay indexes of an older format are read into today's: format 1 recorded no columns per group, formats
1-2 kept their number under "schema_version"."""

from __future__ import annotations

import re

import pytest

import rlckpt
from rlckpt.errors import ReplayStateError
from rlckpt.replay import REPLAY_INDEX_FORMAT, DataPlaneCheckpointBarrier, ReplayBuffer, groups_digest, sample_id
from rlckpt.replay.index_formats import upgrade_index

COLUMNS = ("reward", "completion", "prompt")


def _format_1_index() -> dict:
    """An index as format 1 saved it: one committed group, one only reserved; no "fields" anywhere."""
    groups = [
        {
            "group_id": "g00000000",
            "seq": 0,
            "weight_version": 0,
            "target_step": 0,
            "sample_ids": [sample_id("g00000000", i) for i in range(2)],
            "start_weight": 0,
            "end_weight": 0,
        },
        {
            "group_id": "g00000001",
            "seq": 1,
            "weight_version": 0,
            "target_step": 1,
            "sample_ids": [],
            "start_weight": None,
            "end_weight": None,
        },
    ]
    return {
        "schema_version": 1,
        "partition_id": "rollouts",
        "group_size": 2,
        "next_seq": 2,
        "groups": groups,
        "digest": groups_digest(groups),
    }


def test_a_format_1_index_gets_the_commit_columns_on_its_committed_groups_and_none_on_reserved_ones():
    upgraded = upgrade_index(_format_1_index(), commit_fields=COLUMNS)
    assert upgraded["format"] == REPLAY_INDEX_FORMAT and "schema_version" not in upgraded
    assert [g["fields"] for g in upgraded["groups"]] == [sorted(COLUMNS), []]
    assert upgraded["digest"] == groups_digest(upgraded["groups"]) != _format_1_index()["digest"]


def test_an_upgraded_format_1_index_loads_into_a_replay_buffer():
    upgraded = upgrade_index(_format_1_index(), commit_fields=COLUMNS)
    replay = ReplayBuffer(None, DataPlaneCheckpointBarrier(), partition_id="rollouts", group_size=2)
    replay.load_state_dict(upgraded, expected_digest=upgraded["digest"])
    assert replay.group("g00000000").fields == tuple(sorted(COLUMNS))
    assert [g.group_id for g in replay.pending_groups()] == ["g00000001"]


def test_a_format_1_index_with_committed_groups_is_refused_without_their_columns():
    with pytest.raises(ReplayStateError, match="step 6: .* format 1 does not record the columns"):
        upgrade_index(_format_1_index(), where="step 6: replay_buffer_metadata.pt")


def test_an_index_of_todays_format_comes_back_as_it_is():
    today = upgrade_index(_format_1_index(), commit_fields=COLUMNS)
    assert upgrade_index(today, commit_fields=("other",)) == today


def test_a_format_2_index_moves_its_number_under_format_and_keeps_its_digest():
    format_2 = {**_format_1_index(), "schema_version": 2}
    format_2["groups"] = [{**g, "fields": sorted(COLUMNS) if g["sample_ids"] else []} for g in format_2["groups"]]
    format_2["digest"] = groups_digest(format_2["groups"])
    upgraded = upgrade_index(format_2)
    assert upgraded == {**{k: v for k, v in format_2.items() if k != "schema_version"}, "format": REPLAY_INDEX_FORMAT}


@pytest.mark.parametrize("found", [0, "1", None, 1.0, True])
def test_an_index_of_a_format_rlckpt_never_wrote_is_refused_naming_the_field(found):
    with pytest.raises(ReplayStateError, match=r"replay index: schema_version .* is not a format rlckpt wrote"):
        upgrade_index({**_format_1_index(), "schema_version": found}, commit_fields=COLUMNS)


@pytest.mark.parametrize("key", ["format", "schema_version"])
def test_an_index_of_a_newer_format_is_refused_as_written_by_a_newer_rlckpt(key):
    newer = {k: v for k, v in _format_1_index().items() if k != "schema_version"}
    with pytest.raises(
        ReplayStateError,
        match=f"^step 6: x.pt: replay index: {key} {REPLAY_INDEX_FORMAT + 1} was written by a newer rlckpt; "
        rf"this one \({re.escape(rlckpt.__version__)}\) reads formats 1-3$",
    ):
        upgrade_index({**newer, key: REPLAY_INDEX_FORMAT + 1}, commit_fields=COLUMNS, where="step 6: x.pt")


def test_an_old_index_is_held_to_the_fields_of_its_own_format():
    format_1 = _format_1_index()
    format_1["groups"][0]["fields"] = ["reward"]  # format 1 had no such field
    with pytest.raises(ReplayStateError, match=r"replay index: groups\[0\]\.fields: unknown field"):
        upgrade_index(format_1, commit_fields=COLUMNS)
