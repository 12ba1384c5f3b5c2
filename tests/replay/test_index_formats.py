"""Replay indexes of an older format are read into today's: format 1 recorded no columns per group."""

from __future__ import annotations

import pytest

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
    assert upgraded["schema_version"] == REPLAY_INDEX_FORMAT
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


@pytest.mark.parametrize("found", [0, REPLAY_INDEX_FORMAT + 1, "1", None])
def test_an_index_of_a_format_this_code_does_not_read_is_refused_naming_it(found):
    with pytest.raises(ReplayStateError, match=f"replay index format {found!r}, this code reads formats"):
        upgrade_index({**_format_1_index(), "schema_version": found}, commit_fields=COLUMNS)
