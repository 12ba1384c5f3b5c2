"""The run's replication actor on Ray (controller/replication.py): it reads what the remote tier holds (after
each replication, and when asked), what it raises reaches the replication queue as itself, and a failed
replication is reported in one line — the cause's class and
message, as every other error — in the event, the run's summary (`--json` `replication_failed`) and the
progress line of `rlckpt train`, never as Ray's RayTaskError with the remote traceback and its colour codes.

The session's Ray cluster (the ``tq_session`` fixture) is shared; each test starts its own actor."""

from __future__ import annotations

import asyncio

import pytest

from rlckpt.cli.train import replication_line
from rlckpt.controller.config import TrainConfig
from rlckpt.controller.replication import RayReplicator, start_ray_replicator
from rlckpt.errors import StoreUnavailableError
from rlckpt.store import BundleStore
from rlckpt.tiers import ReplicationQueue
from support.store_checks import save_sample

pytestmark = pytest.mark.slow


@pytest.fixture
def unreachable_remote(tq_session, tmp_path):
    """A replication actor whose local tier holds bundle 2 and whose remote tier cannot be reached (a file
    stands where its directory should be)."""
    import ray

    local = str(tmp_path / "local")
    save_sample(BundleStore(local), 2)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the remote tier should be")
    replicator = start_ray_replicator(TrainConfig(run_dir=local, replicate_to=str(blocked / "remote")))
    assert replicator is not None
    yield replicator
    ray.kill(replicator.actor, no_restart=True)


def test_what_the_actor_raises_is_raised_as_itself(unreachable_remote: RayReplicator):
    with pytest.raises(StoreUnavailableError, match="not-a-dir") as raised:
        asyncio.run(unreachable_remote.replicate(2))
    assert type(raised.value) is StoreUnavailableError  # not RayTaskError(StoreUnavailableError)


def test_a_failed_replication_is_one_line_in_the_event_the_summary_and_the_progress_line(unreachable_remote):
    events: list[dict] = []

    async def replicate_once() -> ReplicationQueue:
        queue = ReplicationQueue(unreachable_remote, remote_url="the remote", on_event=events.append)
        queue.submit(2)
        await queue.drain()
        return queue

    queue = asyncio.run(replicate_once())
    error = queue.failed[2]  # what `rlckpt train --json` lists under replication_failed
    assert error.startswith("StoreUnavailableError: ") and "not-a-dir" in error
    assert "\n" not in error and "\x1b" not in error and "ray::" not in error and "Traceback" not in error
    assert events[-1]["error"] == error
    line = replication_line(events[-1], "the remote")
    assert line is not None and "\n" not in line and line.endswith(error)


def test_the_actor_reads_what_the_remote_tier_holds_after_a_replication(tq_session, tmp_path):
    import ray

    local = str(tmp_path / "local")
    for step in (2, 4):
        save_sample(BundleStore(local), step)
    replicator = start_ray_replicator(TrainConfig(run_dir=local, replicate_to=str(tmp_path / "remote")))
    assert replicator is not None
    try:
        assert asyncio.run(replicator.survey()).newest is None  # nothing there yet
        report = asyncio.run(replicator.replicate(2))
        assert report.state is not None and report.state.newest == 2
        assert asyncio.run(replicator.survey()).newest == 2
    finally:
        ray.kill(replicator.actor, no_restart=True)
