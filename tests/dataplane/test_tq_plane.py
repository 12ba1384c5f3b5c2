"""TransferQueueClient against a real TransferQueue on a private local Ray cluster."""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path

import pytest
import torch

from rlckpt.errors import InventoryMismatchError, MissingSamplesError, RestoreRefusedError
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer
from support.tq import connect_client, reset_tq_state, restore_in_fresh_cluster, write_json

pytestmark = pytest.mark.tq

P = "rollouts"
G = 4
L = 16


def run(coro):
    return asyncio.run(coro)


def group_rows(seed: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        {
            "prompt": torch.randint(0, 100, (8,), generator=gen, dtype=torch.int64),
            "completion": torch.randint(0, 100, (L,), generator=gen, dtype=torch.int64),
            "logprobs": torch.randn(L, generator=gen, dtype=torch.float32),
            "reward": torch.rand((), generator=gen, dtype=torch.float32),
        }
        for _ in range(G)
    ]


def stacked(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: torch.stack([r[name] for r in rows]) for name in rows[0]}


def buffer_on(plane) -> ReplayBuffer:
    return ReplayBuffer(plane, DataPlaneCheckpointBarrier(), partition_id=P, group_size=G)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_committed_groups_read_back_dense_and_in_key_order(tq_plane):
    async def main():
        buf = buffer_on(tq_plane)
        gids = [buf.reserve(0, 0) for _ in range(2)]
        for i, gid in enumerate(gids):
            await buf.commit(gid, group_rows(i), start_weight=0, end_weight=0)
        data = await buf.read_groups(list(reversed(gids)))
        expected = stacked(group_rows(1) + group_rows(0))
        assert set(data) == set(expected)
        for name, value in expected.items():
            assert not data[name].is_nested
            assert data[name].dtype == value.dtype, name
            assert torch.equal(data[name], value), name

    run(main())


def test_advantages_written_onto_existing_rows_read_back(tq_plane):
    async def main():
        buf = buffer_on(tq_plane)
        gid = buf.reserve(0)
        await buf.commit(gid, group_rows(3), start_weight=0, end_weight=0)
        advantages = torch.tensor([1.5, -0.5, 0.0, -1.0])
        await buf.write_fields(gid, {"advantages": advantages})
        data = await buf.read_groups([gid], ["advantages", "reward"])
        assert torch.equal(data["advantages"], advantages)
        assert torch.equal(data["reward"], stacked(group_rows(3))["reward"])

    run(main())


def test_missing_keys_are_named_not_silently_dropped(tq_plane):
    async def main():
        await tq_plane.put_samples(P, ["g:0", "g:1"], {"reward": torch.tensor([1.0, 2.0])})
        with pytest.raises(MissingSamplesError, match="nope:7"):
            await tq_plane.get_samples(P, ["g:0", "nope:7"])
        with pytest.raises(MissingSamplesError, match="nope:8"):
            await tq_plane.get_samples(P, ["nope:8"])

    run(main())


def test_removing_a_group_clears_exactly_its_rows(tq_plane):
    async def main():
        buf = buffer_on(tq_plane)
        gids = [buf.reserve(0) for _ in range(2)]
        for i, gid in enumerate(gids):
            await buf.commit(gid, group_rows(i), start_weight=0, end_weight=0)
        await buf.remove_group(gids[0])
        assert await tq_plane.list_sample_ids(P) == list(buf.group(gids[1]).sample_ids)

    run(main())


def test_inventory_check_catches_rows_changed_behind_the_index(tq_plane):
    async def main():
        buf = buffer_on(tq_plane)
        gid = buf.reserve(0)
        await buf.commit(gid, group_rows(0), start_weight=0, end_weight=0)
        buf.validate_inventory(await tq_plane.list_sample_ids(P))
        await tq_plane.clear_samples(P, [f"{gid}:2"])
        await tq_plane.put_samples(P, ["stray:0"], {"reward": torch.zeros(1)})
        with pytest.raises(InventoryMismatchError) as info:
            buf.validate_inventory(await tq_plane.list_sample_ids(P))
        assert f"{gid}:2" in str(info.value) and "stray:0" in str(info.value)

    run(main())


def test_snapshot_restores_into_a_fresh_cluster_with_same_rows_and_index_digest(tq_plane, tmp_path):
    async def build():
        buf = buffer_on(tq_plane)
        gids = [buf.reserve(0, target_step=0) for _ in range(3)]
        for i, gid in enumerate(gids):
            await buf.commit(gid, group_rows(10 + i), start_weight=0, end_weight=1)
        await buf.remove_group(gids[1])
        for gid in (gids[0], gids[2]):
            await buf.write_fields(gid, {"advantages": torch.randn(G)})
        async with buf.barrier.checkpoint():
            state = buf.metadata_state_dict()
            ids = await tq_plane.list_sample_ids(P)
            buf.validate_inventory(ids)
            meta = {"replay_digest": state["digest"], "group_size": G}
            await tq_plane.save_checkpoint(tmp_path / "data_plane", meta)
        return state, ids, await tq_plane.get_samples(P, ids)

    state, ids, expected = run(build())
    report = restore_in_fresh_cluster(
        tmp_path / "data_plane",
        tmp_path / "report.pt",
        partition_id=P,
        replay_state_file=write_json(tmp_path / "replay.json", state),
    )
    assert report["sample_ids"] == ids
    assert json.loads(report["metadata_json"]) == {"replay_digest": state["digest"], "group_size": G}
    assert report["replay_digest"] == state["digest"]
    assert report["second_load_refused"] is True
    assert set(report["rows"]) == set(expected)
    for name, value in expected.items():
        assert torch.equal(report["rows"][name], value), name


def save_snapshot_then_reset(client, path: Path) -> None:
    run(client.put_samples(P, ["g:0"], {"reward": torch.ones(1)}))
    run(client.save_checkpoint(path, {"step": 1}))
    reset_tq_state()


def test_restore_onto_an_untouched_tq_succeeds_in_process(tq_plane, tmp_path):
    save_snapshot_then_reset(tq_plane, tmp_path / "snap")
    restorer = connect_client()
    assert run(restorer.load_checkpoint(tmp_path / "snap")) == {"step": 1}
    assert run(restorer.get_samples(P, ["g:0"]))["reward"].tolist() == [1.0]


def test_restore_is_refused_after_another_client_wrote(tq_plane, tmp_path):
    save_snapshot_then_reset(tq_plane, tmp_path / "snap")
    restorer = connect_client()
    other = connect_client()
    run(other.put_samples("elsewhere", ["x:0"], {"reward": torch.zeros(1)}))
    assert not restorer.touched
    with pytest.raises(RestoreRefusedError, match="already holds"):
        run(restorer.load_checkpoint(tmp_path / "snap"))


def test_restore_is_refused_after_this_client_did_a_data_operation(tq_plane, tmp_path):
    save_snapshot_then_reset(tq_plane, tmp_path / "snap")
    restorer = connect_client()
    run(restorer.put_samples("scratch", ["x:0"], {"reward": torch.zeros(1)}))
    reset_tq_state()  # TQ is empty again: only the per-client flag can refuse now
    with pytest.raises(RestoreRefusedError, match="data operations"):
        run(restorer.load_checkpoint(tmp_path / "snap"))


def test_a_failed_load_leaves_the_client_unusable_for_loads(tq_plane, tmp_path):
    save_snapshot_then_reset(tq_plane, tmp_path / "snap")
    broken = tmp_path / "broken"  # passes rlckpt's checks of a snapshot; TQ's own load then fails on it
    broken.mkdir()
    (broken / "metadata.json").write_text(json.dumps({"storage_saved": False, "user_metadata": {}}))
    (broken / "controller_state.pkl").write_bytes(pickle.dumps([]))
    restorer = connect_client()
    with pytest.raises(RestoreRefusedError, match="load failed"):
        run(restorer.load_checkpoint(broken))
    with pytest.raises(RestoreRefusedError, match="earlier load"):
        run(restorer.load_checkpoint(tmp_path / "snap"))


def put_payload(client, rows: int, row_bytes: int, per_put: int) -> int:
    """Put ``rows`` float32 rows of ``row_bytes`` in batches of ``per_put``; return payload bytes."""
    width = row_bytes // 4
    for start in range(0, rows, per_put):
        keys = [f"p:{i}" for i in range(start, start + per_put)]
        run(client.put_samples(P, keys, {"logprobs": torch.randn(per_put, width)}))
    return rows * width * 4


@pytest.mark.parametrize("row_parser", ["numpy", "torch"])
def test_snapshot_bytes_stay_within_ten_percent_of_the_payload(tq_session, tmp_path, row_parser):
    from rlckpt.dataplane.tq_client import TransferQueueClient

    reset_tq_state()
    try:
        client = TransferQueueClient(bootstrap=False, row_parser=row_parser)
        payload = put_payload(client, rows=128, row_bytes=32 * 1024, per_put=32)
        run(client.save_checkpoint(tmp_path / "snap", {}))
        assert dir_bytes(tmp_path / "snap") <= 1.1 * payload
    finally:
        reset_tq_state()


def test_torch_row_parser_rows_read_back_equal(tq_session):
    from rlckpt.dataplane.tq_client import TransferQueueClient

    reset_tq_state()
    try:
        client = TransferQueueClient(bootstrap=False, row_parser="torch")
        expected = stacked(group_rows(5))
        run(client.put_samples(P, [f"g:{i}" for i in range(G)], expected))
        got = run(client.get_samples(P, [f"g:{i}" for i in range(G)]))
        for name, value in expected.items():
            assert torch.equal(got[name], value), name
    finally:
        reset_tq_state()


def test_bfloat16_columns_survive_the_numpy_row_parser(tq_plane):
    values = torch.randn(3, 5).to(torch.bfloat16)
    run(tq_plane.put_samples(P, ["b:0", "b:1", "b:2"], {"h": values, "reward": torch.zeros(3)}))
    got = run(tq_plane.get_samples(P, ["b:0", "b:1", "b:2"]))
    assert got["h"].dtype == torch.bfloat16 and torch.equal(got["h"], values)


def test_without_the_per_row_parser_the_snapshot_blows_up(tq_session, tmp_path):
    from rlckpt.dataplane.tq_client import TransferQueueClient

    reset_tq_state()
    try:
        client = TransferQueueClient(bootstrap=False, row_parser="none")
        payload = put_payload(client, rows=64, row_bytes=16 * 1024, per_put=16)
        run(client.save_checkpoint(tmp_path / "snap", {}))
        assert dir_bytes(tmp_path / "snap") > 4 * payload
    finally:
        reset_tq_state()


# --- the pinned snapshot over TransferQueue ---------------------------------------------------------


class HeldRayCopier:
    """The main job's row copier (a RowCopyWorker Ray actor), held before batch `hold_at` until released."""

    def __init__(self, hold_at: int) -> None:
        from rlckpt.checkpoint.row_copy import start_ray_row_copier
        from rlckpt.controller.connect import ConnectOnlyDataPlane

        self.inner = start_ray_row_copier(ConnectOnlyDataPlane())
        self.hold_at, self.batches = hold_at, 0
        self.reached, self.go = asyncio.Event(), asyncio.Event()

    async def begin(self, handle, compression):
        await self.inner.begin(handle, compression)

    async def copy(self, partition_id, keys, fields, relpath):
        if self.batches == self.hold_at:
            self.reached.set()
            await self.go.wait()
        self.batches += 1
        return await self.inner.copy(partition_id, keys, fields, relpath)

    async def seal(self):
        return await self.inner.seal()

    async def abort(self):
        await self.inner.abort()


def test_a_pinned_snapshot_holds_exactly_the_captured_rows_while_commits_and_removals_run(tq_plane, tmp_path):
    from rlckpt.checkpoint.save import SaveParticipants, StagedBytes, save_bundle
    from rlckpt.dataplane.rows_snapshot import restore_snapshot
    from rlckpt.store import BundleStore

    class Policy:
        async def stage_policy(self):
            return StagedBytes(b"policy")

    async def main():
        buf = buffer_on(tq_plane)
        for i in range(24):  # 96 rows: three rows files
            gid = buf.reserve(0)
            await buf.commit(gid, group_rows(i), start_weight=0, end_weight=0)
        captured = {g.group_id: await buf.read_groups([g]) for g in buf.groups()}
        copier = HeldRayCopier(hold_at=1)
        store = BundleStore(str(tmp_path / "run"))
        parts = SaveParticipants(store=store, policy=Policy(), replay=buf, capture_loader_state=dict, row_copier=copier)
        save = asyncio.create_task(save_bundle(parts, 2, upload_timing="pinned"))
        await copier.reached.wait()
        groups = buf.groups()
        await buf.commit(buf.reserve(1), group_rows(100), start_weight=1, end_weight=1)
        await buf.write_fields(groups[-1].group_id, {"advantages": torch.ones(G, 1)})
        for g in (groups[0], groups[-1], groups[-2]):  # one copied already, two still pinned
            await buf.remove_group(g.group_id)
        copier.go.set()
        await save
        assert sorted(await tq_plane.list_sample_ids(P)) == buf.sample_ids()  # deferred clears done
        bundle = store.open(2)
        bundle.get_dir("data_plane", tmp_path / "snapshot")
        reset_tq_state()
        await restore_snapshot(connect_client(), tmp_path / "snapshot")
        restored = connect_client()
        assert sorted(await restored.list_sample_ids(P)) == sorted(k for g in groups for k in g.sample_ids)
        for gid, rows in captured.items():
            back = await restored.get_samples(P, [f"{gid}:{i}" for i in range(G)], list(rows))
            assert all(torch.equal(back[f], rows[f]) for f in rows), gid

    run(main())
