"""The restore order is asserted: nothing shares the data plane before the restore has finished."""

import pytest

from rlckpt.checkpoint.phase import Phase, RestorePhase
from rlckpt.controller.connect import connect_only_data_plane, replay_buffer_spec
from rlckpt.errors import RestoreOrderError


def _spec(phase: RestorePhase):
    return replay_buffer_spec(phase, partition_id="rollouts", group_size=4)


def test_connect_only_client_before_restore_started_raises():
    with pytest.raises(RestoreOrderError, match="connect-only data-plane client"):
        connect_only_data_plane(RestorePhase(), {})


def test_replay_buffer_before_restore_started_raises():
    with pytest.raises(RestoreOrderError, match="replay buffer"):
        _spec(RestorePhase())


def test_connect_only_client_while_restoring_raises():
    phase = RestorePhase()
    phase.begin_restore(4)
    with pytest.raises(RestoreOrderError, match="restoring"):
        connect_only_data_plane(phase, {})


def test_replay_buffer_while_restoring_raises():
    phase = RestorePhase()
    phase.begin_restore(4)
    with pytest.raises(RestoreOrderError, match="restoring"):
        _spec(phase)


def test_both_can_be_built_after_the_restore_finished():
    phase = RestorePhase()
    phase.begin_restore(4)
    phase.finish_restore()
    assert connect_only_data_plane(phase, {"backend": {}}).tq_config == {"backend": {}}
    assert _spec(phase).group_size == 4


def test_both_can_be_built_in_a_fresh_run():
    phase = RestorePhase()
    phase.start_fresh()
    connect_only_data_plane(phase, {})
    _spec(phase)


def test_a_failed_restore_keeps_the_data_plane_closed():
    phase = RestorePhase()
    phase.begin_restore(4)
    phase.fail()
    assert phase.state is Phase.FAILED
    with pytest.raises(RestoreOrderError, match="failed"):
        connect_only_data_plane(phase, {})


def test_finishing_a_restore_that_never_began_raises():
    with pytest.raises(RestoreOrderError, match="not_started"):
        RestorePhase().finish_restore()


def test_a_fresh_run_cannot_start_restoring_afterwards():
    phase = RestorePhase()
    phase.start_fresh()
    with pytest.raises(RestoreOrderError):
        phase.begin_restore(2)
