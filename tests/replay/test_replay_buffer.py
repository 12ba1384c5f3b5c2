"""ReplayBuffer over InMemoryDataPlane: commit/rollback, take modes, state dict, inventory."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from rlckpt.dataplane import InMemoryDataPlane
from rlckpt.errors import (
    DataPlaneError,
    InventoryMismatchError,
    ReplayError,
    ReplayStateError,
)
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer

P = "rollouts"
G = 3


def run(coro):
    return asyncio.run(coro)


def make(plane=None, *, partition_id=P, group_size=G, **kw) -> ReplayBuffer:
    return ReplayBuffer(
        plane or InMemoryDataPlane(),
        DataPlaneCheckpointBarrier(),
        partition_id=partition_id,
        group_size=group_size,
        **kw,
    )


def group_rows(seed: int) -> list[dict[str, torch.Tensor]]:
    return [
        {
            "prompt": torch.full((2,), seed, dtype=torch.int64),
            "completion": torch.arange(4, dtype=torch.int64) + 100 * seed + i,
            "logprobs": torch.full((4,), -0.1 * i, dtype=torch.float32),
            "reward": torch.tensor(float(seed * 10 + i)),
        }
        for i in range(G)
    ]


async def fill(buf: ReplayBuffer, n: int, *, step: int | None = None, version: int = 0) -> list[str]:
    gids = [buf.reserve(version, step) for _ in range(n)]
    for i, gid in enumerate(gids):
        await buf.commit(gid, group_rows(i), start_weight=version, end_weight=version)
    return gids


def test_commit_writes_rows_under_sample_ids_and_indexes_them():
    async def main():
        plane = InMemoryDataPlane()
        buf = make(plane)
        gid = buf.reserve(weight_version=0, target_step=0)
        record = await buf.commit(gid, group_rows(7), start_weight=0, end_weight=1)
        assert record.sample_ids == (f"{gid}:0", f"{gid}:1", f"{gid}:2")
        assert await plane.list_sample_ids(P) == list(record.sample_ids)
        data = await buf.read_groups([record])
        assert torch.equal(data["reward"], torch.tensor([70.0, 71.0, 72.0]))
        assert (record.start_weight, record.end_weight) == (0, 1)

    run(main())


def test_commit_of_the_wrong_group_size_is_refused_and_writes_nothing():
    async def main():
        plane = InMemoryDataPlane()
        buf = make(plane)
        gid = buf.reserve(0)
        with pytest.raises(ReplayError, match="group size"):
            await buf.commit(gid, group_rows(1)[:2], start_weight=0, end_weight=0)
        assert await plane.list_sample_ids(P) == []
        assert not buf.group(gid).committed

    run(main())


class FailingPutPlane(InMemoryDataPlane):
    """Writes the rows, then fails: the buffer must clear them again."""

    async def put_samples(self, partition_id, keys, fields, tags=None):
        await super().put_samples(partition_id, keys, fields, tags)
        raise DataPlaneError("storage unit died mid-put")


def test_a_failed_commit_rolls_back_the_rows_and_keeps_the_reservation():
    async def main():
        plane = FailingPutPlane()
        buf = make(plane)
        gid = buf.reserve(0)
        with pytest.raises(DataPlaneError, match="mid-put"):
            await buf.commit(gid, group_rows(1), start_weight=0, end_weight=0)
        assert await plane.list_sample_ids(P) == []
        assert [g.group_id for g in buf.pending_groups()] == [gid]
        assert buf.barrier.mutations_in_flight == 0

    run(main())


class PausingAfterPutPlane(InMemoryDataPlane):
    """Writes the rows, then waits (forever, unless cancelled): a cancellation lands after the write."""

    def __init__(self) -> None:
        super().__init__()
        self.written = asyncio.Event()

    async def put_samples(self, partition_id, keys, fields, tags=None):
        await super().put_samples(partition_id, keys, fields, tags)
        self.written.set()
        await asyncio.Event().wait()


def test_a_cancelled_commit_rolls_back_and_releases_the_barrier():
    async def main():
        plane = PausingAfterPutPlane()
        buf = make(plane)
        gid = buf.reserve(0)
        task = asyncio.create_task(buf.commit(gid, group_rows(1), start_weight=0, end_weight=0))
        await plane.written.wait()
        assert len(await plane.list_sample_ids(P)) == G  # the rows are in the data plane when it lands
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await plane.list_sample_ids(P) == []
        assert buf.barrier.mutations_in_flight == 0
        assert not buf.group(gid).committed

    run(main())


def test_a_commit_waits_while_a_checkpoint_window_is_held():
    async def main():
        buf = make()
        gid = buf.reserve(0)
        async with buf.barrier.checkpoint():
            task = asyncio.create_task(buf.commit(gid, group_rows(1), start_weight=0, end_weight=0))
            while buf.barrier.waiting == 0:  # until the commit is parked at the barrier
                await asyncio.sleep(0)
            state = buf.metadata_state_dict()
            assert not task.done()
        await task
        assert state["groups"][0]["sample_ids"] == []

    run(main())


def test_remove_group_clears_its_rows_and_forgets_it():
    async def main():
        plane = InMemoryDataPlane()
        buf = make(plane)
        first, second = await fill(buf, 2)
        await buf.remove_group(first)
        assert [g.group_id for g in buf.groups()] == [second]
        assert await plane.list_sample_ids(P) == list(buf.group(second).sample_ids)

    run(main())


def test_remove_group_can_leave_the_rows_in_place():
    async def main():
        plane = InMemoryDataPlane()
        buf = make(plane)
        (gid,) = await fill(buf, 1)
        await buf.remove_group(gid, clear_data_plane=False)
        assert len(await plane.list_sample_ids(P)) == G
        assert len(buf) == 0

    run(main())


def test_write_fields_adds_advantages_on_the_group_rows():
    async def main():
        buf = make()
        (gid,) = await fill(buf, 1)
        await buf.write_fields(gid, {"advantages": torch.tensor([1.0, 0.0, -1.0])})
        data = await buf.read_groups([gid], ["advantages", "reward"])
        assert torch.equal(data["advantages"], torch.tensor([1.0, 0.0, -1.0]))

    run(main())


def test_reserve_refuses_beyond_max_groups():
    buf = make(max_groups=2)
    buf.reserve(0)
    buf.reserve(0)
    with pytest.raises(ReplayError, match="full"):
        buf.reserve(0)


# --- take: in_order and async modes ------------------------------------------------------------


def test_in_order_take_waits_for_all_groups_of_the_step_and_returns_them_in_reservation_order():
    async def main():
        buf = make()
        step0 = [buf.reserve(0, target_step=0) for _ in range(3)]
        step1 = buf.reserve(1, target_step=1)
        await buf.commit(step1, group_rows(9), start_weight=1, end_weight=1)
        taker = asyncio.create_task(buf.take(3, target_step=0))
        for i, gid in enumerate(reversed(step0)):  # finish out of order
            await asyncio.sleep(0)
            assert not taker.done()
            await buf.commit(gid, group_rows(i), start_weight=0, end_weight=0)
        taken = await taker
        assert [g.group_id for g in taken] == step0

    run(main())


def test_async_take_skips_groups_older_than_the_staleness_bound():
    async def main():
        buf = make()
        old = await fill(buf, 2, version=0)
        fresh = await fill(buf, 2, version=3)
        taken = await buf.take(2, min_weight_version=2)
        assert [g.group_id for g in taken] == fresh
        assert await buf.evict_stale(2) == old
        assert len(buf) == 2

    run(main())


def test_taken_groups_are_not_taken_twice_until_untaken():
    async def main():
        buf = make()
        await fill(buf, 2)
        first = await buf.take(2)
        assert buf.ready_groups() == []
        buf.untake(g.group_id for g in first)
        assert [g.group_id for g in await buf.take(2)] == [g.group_id for g in first]

    run(main())


def test_a_cancelled_take_takes_nothing():
    async def main():
        buf = make()
        await fill(buf, 1)
        taker = asyncio.create_task(buf.take(2))
        await asyncio.sleep(0)
        taker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taker
        assert len(buf.ready_groups()) == 1

    run(main())


# --- state dict ----------------------------------------------------------------------------------


def saved_buffer() -> tuple[ReplayBuffer, dict]:
    async def main():
        buf = make()
        await fill(buf, 2, step=0)
        buf.reserve(1, target_step=1)  # pending at checkpoint time
        return buf, buf.metadata_state_dict()

    return run(main())


def test_state_dict_round_trip_restores_groups_pending_reservations_and_digest():
    buf, state = saved_buffer()
    restored = make()
    restored.load_state_dict(copy.deepcopy(state), expected_digest=state["digest"])
    assert restored.groups() == buf.groups()
    assert [g.target_step for g in restored.pending_groups()] == [1]
    assert restored.metadata_state_dict() == state
    assert restored.reserve(2) not in {g.group_id for g in buf.groups()}


def test_state_dict_has_no_tensors_and_is_json():
    import json

    _, state = saved_buffer()
    assert json.loads(json.dumps(state)) == state


def test_digest_changes_when_any_group_field_changes():
    _, state = saved_buffer()
    tampered = copy.deepcopy(state)
    tampered["groups"][0]["start_weight"] = 5
    with pytest.raises(ReplayStateError, match="recorded digest"):
        make().load_state_dict(tampered, expected_digest=state["digest"])


def test_load_refuses_an_unexpected_digest():
    _, state = saved_buffer()
    with pytest.raises(ReplayStateError, match="expected digest"):
        make().load_state_dict(state, expected_digest="0" * 64)


def test_load_refuses_another_partition():
    _, state = saved_buffer()
    with pytest.raises(ReplayStateError, match="partition"):
        make(partition_id="other").load_state_dict(state, expected_digest=state["digest"])


def test_load_refuses_another_group_size():
    _, state = saved_buffer()
    with pytest.raises(ReplayStateError, match="group size"):
        make(group_size=G + 1).load_state_dict(state, expected_digest=state["digest"])


def test_load_refuses_more_groups_than_max_groups():
    _, state = saved_buffer()
    with pytest.raises(ReplayStateError, match="max_groups"):
        make(max_groups=2).load_state_dict(state, expected_digest=state["digest"])


def test_load_refuses_another_format():
    _, state = saved_buffer()
    state = dict(state, format=2)
    with pytest.raises(ReplayStateError, match="load_state_dict: replay index: format: expected 3, got 2"):
        make().load_state_dict(state, expected_digest=state["digest"])


def test_load_requires_an_empty_buffer():
    _, state = saved_buffer()
    buf = make()
    buf.reserve(0)
    with pytest.raises(ReplayStateError, match="not empty"):
        buf.load_state_dict(state, expected_digest=state["digest"])


def test_load_never_writes_to_the_data_plane():
    _, state = saved_buffer()
    plane = InMemoryDataPlane()
    make(plane).load_state_dict(state, expected_digest=state["digest"])
    assert not plane.touched and plane.store.is_empty()


# --- inventory -----------------------------------------------------------------------------------


def test_inventory_matching_the_index_passes():
    buf, _ = saved_buffer()
    buf.validate_inventory(reversed(buf.sample_ids()))


def test_inventory_mismatch_lists_missing_and_extra_ids():
    buf, _ = saved_buffer()
    ids = buf.sample_ids()
    with pytest.raises(InventoryMismatchError) as info:
        buf.validate_inventory(ids[1:] + ["g99999999:0"])
    assert ids[0] in str(info.value) and "g99999999:0" in str(info.value)


def test_a_captured_index_serializes_like_metadata_state_dict_and_ignores_later_changes():
    buf = ReplayBuffer(InMemoryDataPlane(), DataPlaneCheckpointBarrier(), partition_id="p", group_size=2)
    buf.reserve(weight_version=0, target_step=0)
    captured = buf.capture_index()
    before = buf.metadata_state_dict()
    buf.reserve(weight_version=1, target_step=1)
    asyncio.run(buf.remove_group(buf.groups()[0].group_id))
    assert captured.state_dict() == before
    assert captured.state_dict() != buf.metadata_state_dict()


# --- plain values at entry -------------------------------------------------------------------------


def test_reserve_and_commit_take_numpy_and_tensor_integer_scalars_as_the_ints_they_hold():
    import numpy as np

    async def main():
        buf = make()
        gid = buf.reserve(np.int64(2), target_step=torch.tensor(3))
        await buf.commit(gid, group_rows(0), start_weight=np.int32(1), end_weight=torch.tensor(2))
        return buf

    buf = run(main())
    record = buf.group("g00000000")
    values = (record.weight_version, record.target_step, record.start_weight, record.end_weight)
    assert values == (2, 3, 1, 2) and all(type(v) is int for v in values)
    state = buf.metadata_state_dict()
    make().load_state_dict(torch.load(_saved(state), weights_only=True), expected_digest=state["digest"])


def _saved(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize(
    ("weight_version", "target_step", "refused"),
    [(True, None, "weight_version: expected int, got bool"), (0, 1.0, "target_step: expected int or None, got float")],
)
def test_reserve_refuses_a_value_no_save_could_write_back_as_an_int(weight_version, target_step, refused):
    buf = make()
    with pytest.raises(ReplayError, match=f"^reserve: {refused}$"):
        buf.reserve(weight_version, target_step)
    assert len(buf) == 0


def test_commit_refuses_a_float_weight_before_writing_anything():
    plane = InMemoryDataPlane()
    buf = make(plane)
    gid = buf.reserve(0)
    with pytest.raises(ReplayError, match="^commit: start_weight: expected int, got float"):
        run(buf.commit(gid, group_rows(0), start_weight=0.5, end_weight=1))
    assert plane.store.is_empty() and not buf.group(gid).committed
