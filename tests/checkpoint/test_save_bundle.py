"""save_bundle: one transaction per save; nothing is committed unless every piece agrees.

Same body on local disk and on S3 (moto) through ``store_location``; the data plane is the
in-memory adapter (the real-TransferQueue path runs in tests/e2e).
"""

import asyncio
import dataclasses
import json

import pytest
import torch

from rlckpt.checkpoint import codec, layout
from rlckpt.checkpoint.save import SaveParticipants, StagedBytes, save_bundle
from rlckpt.dataplane.memory import InMemoryDataPlane
from rlckpt.errors import BundleExistsError, CheckpointError, InventoryMismatchError
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer
from rlckpt.store import BundleStore, Retention

GROUP = 4


class FakePolicy:
    def __init__(self, payload: bytes = b"weights-and-adam") -> None:
        self.payload = payload

    async def stage_policy(self):
        return StagedBytes(self.payload)


class FailingPolicy:
    async def stage_policy(self):
        raise RuntimeError("trainer worker died")


def _rows(seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {"completion": torch.randint(0, 10, (6,), generator=g), "reward": torch.rand(1, generator=g)}
        for _ in range(GROUP)
    ]


async def _parts(url, options, policy=None, groups=3, pending=1):
    plane = InMemoryDataPlane()
    replay = ReplayBuffer(plane, DataPlaneCheckpointBarrier(), partition_id="rollouts", group_size=GROUP)
    for i in range(groups):
        gid = replay.reserve(weight_version=0, target_step=0)
        await replay.commit(gid, _rows(i), start_weight=0, end_weight=0)
    for _ in range(pending):
        replay.reserve(weight_version=0, target_step=1)
    parts = SaveParticipants(
        store=BundleStore(url, options),
        policy=policy or FakePolicy(),
        replay=replay,
        capture_loader_state=lambda: {"position": 7},
        staging_root=None,
    )
    return parts, plane


def test_save_commits_every_piece_with_its_digest(store_location):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options))
    report = asyncio.run(save_bundle(parts, 2))
    bundle = BundleStore(url, options).open(2)
    files = set(bundle.manifest.files)
    assert {layout.POLICY_FILE, layout.LOADER_FILE, layout.REPLAY_FILE, layout.DATA_PLANE_METADATA} <= files
    assert bundle.read_bytes(layout.POLICY_FILE) == b"weights-and-adam"
    assert codec.loads(bundle.read_bytes(layout.LOADER_FILE), origin="t") == {"position": 7}
    index = codec.loads(bundle.read_bytes(layout.REPLAY_FILE), origin="t")
    assert bundle.manifest.metadata[layout.META_INDEX_DIGEST] == index["digest"]
    assert bundle.manifest.metadata[layout.META_GROUP_COUNT] == 4 == report.group_count
    snapshot_meta = json.loads(bundle.read_bytes(layout.DATA_PLANE_METADATA))["user_metadata"]
    assert snapshot_meta[layout.META_INDEX_DIGEST] == index["digest"]
    bundle.verify()


def test_data_plane_files_are_zstd_compressed_when_asked(store_location):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options))
    parts.compress_data_plane = True
    asyncio.run(save_bundle(parts, 2))
    files = BundleStore(url, options).open(2).manifest.files
    assert {e.compression for p, e in files.items() if p.startswith("data_plane/")} == {"zstd"}
    assert files[layout.POLICY_FILE].compression is None


def test_inline_upload_timing_writes_the_same_bundle_layout(store_location):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options))
    report = asyncio.run(save_bundle(parts, 3, upload_timing="inline"))
    assert report.upload_timing == "inline"
    BundleStore(url, options).open(3).verify()


def test_inventory_mismatch_aborts_the_save_and_keeps_the_previous_bundle_newest(store_location):
    url, options = store_location
    parts, plane = asyncio.run(_parts(url, options))
    asyncio.run(save_bundle(parts, 2))
    victim = parts.replay.groups()[0].sample_ids[1]
    asyncio.run(plane.clear_samples("rollouts", [victim]))  # behind the index's back
    with pytest.raises(InventoryMismatchError, match=victim):
        asyncio.run(save_bundle(parts, 4))
    store = BundleStore(url, options)
    assert store.steps() == [2]
    assert store.latest() == 2
    assert [e.step for e in store.entries() if e.state == "committed"] == [2]


def test_a_row_written_behind_the_index_also_aborts_the_save(store_location):
    url, options = store_location
    parts, plane = asyncio.run(_parts(url, options))
    asyncio.run(plane.put_samples("rollouts", ["stray:0"], {"reward": torch.zeros(1, 1)}))
    with pytest.raises(InventoryMismatchError, match="stray:0"):
        asyncio.run(save_bundle(parts, 2))
    assert BundleStore(url, options).steps() == []


def test_a_failing_policy_write_commits_nothing(store_location):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options, policy=FailingPolicy()))
    with pytest.raises(RuntimeError, match="trainer worker died"):
        asyncio.run(save_bundle(parts, 2))
    assert BundleStore(url, options).steps() == []


def test_the_window_releases_the_barrier_after_a_failed_save(store_location):
    url, options = store_location
    parts, plane = asyncio.run(_parts(url, options))
    asyncio.run(plane.put_samples("rollouts", ["stray:0"], {"reward": torch.zeros(1, 1)}))
    with pytest.raises(InventoryMismatchError):
        asyncio.run(save_bundle(parts, 2))
    assert not parts.replay.barrier.checkpoint_active
    assert parts.replay.barrier.mutations_in_flight == 0


def test_rollout_commits_wait_while_the_window_is_held_and_proceed_after():
    async def scenario(tmp):
        parts, _ = await _parts(tmp, None, groups=1, pending=0)
        order = []
        async with parts.replay.barrier.checkpoint():
            gid = parts.replay.reserve(weight_version=0, target_step=0)
            commit = asyncio.create_task(parts.replay.commit(gid, _rows(9), start_weight=0, end_weight=0))
            while parts.replay.barrier.waiting == 0:  # until the commit is parked at the barrier
                await asyncio.sleep(0)
            order.append(("window", commit.done()))
        await commit
        order.append(("after", commit.done()))
        return order

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        assert asyncio.run(scenario(tmp + "/run")) == [("window", False), ("after", True)]


def test_retention_keeps_only_the_newest_bundles(store_location):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options))
    parts.retention = Retention(keep_last=2)
    for step in (1, 2, 3):
        asyncio.run(save_bundle(parts, step))
    assert BundleStore(url, options).steps() == [2, 3]


def test_by_default_data_plane_files_are_compressed_on_object_stores_only(store_location):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options))
    asyncio.run(save_bundle(parts, 2))
    store = BundleStore(url, options)
    compressions = {e.compression for p, e in store.open(2).manifest.files.items() if p.startswith("data_plane/")}
    assert compressions == ({None} if store.is_local else {"zstd"})


def test_before_commit_is_awaited_with_the_step_while_the_bundle_is_not_yet_committed(store_location):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options))
    seen = []

    async def hook(step: int) -> None:
        seen.append((step, BundleStore(url, options).steps()))

    parts.before_commit = hook
    asyncio.run(save_bundle(parts, 2))
    assert seen == [(2, [])]
    assert BundleStore(url, options).steps() == [2]


class RecordingPolicy:
    """Stages a blob and records whether the save wrote or dropped it; `gate` (optional) holds the staging."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate
        self.staging = asyncio.Event()
        self.outcome: str | None = None

    async def stage_policy(self):
        self.staging.set()
        if self.gate is not None:
            await self.gate.wait()
        policy = self

        class Staged(StagedBytes):
            async def write(self, txn):
                policy.outcome = "written"
                return await super().write(txn)

            async def discard(self):
                policy.outcome = "discarded"

        return Staged(b"weights")


def _no_transaction_left(url, options) -> bool:
    store = BundleStore(url, options)
    report = store.gc(dry_run=True, stale_after=0)
    return report.removed == [] and [e for e in store.entries() if e.state != "committed"] == []


def test_a_failed_staging_aborts_the_transaction_begun_beside_it(store_location):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options, policy=FailingPolicy()))
    with pytest.raises(RuntimeError, match="trainer worker died"):
        asyncio.run(save_bundle(parts, 2))
    assert _no_transaction_left(url, options)


def test_a_refused_begin_drops_the_policy_staged_beside_it(store_location):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options))
    asyncio.run(save_bundle(parts, 2))
    parts.policy = policy = RecordingPolicy()
    with pytest.raises(BundleExistsError):
        asyncio.run(save_bundle(parts, 2))
    assert policy.outcome == "discarded"
    assert BundleStore(url, options).steps() == [2]


def test_a_save_cancelled_while_the_policy_stages_leaves_no_transaction_behind(store_location):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options))
    parts.policy = policy = RecordingPolicy(gate=asyncio.Event())  # staging never finishes by itself

    async def main():
        save = asyncio.create_task(save_bundle(parts, 2))
        await policy.staging.wait()
        save.cancel()
        with pytest.raises(asyncio.CancelledError):
            await save
        assert _no_transaction_left(url, options)  # checked before asyncio.run's shutdown

    asyncio.run(main())
    assert BundleStore(url, options).steps() == []


def test_a_failed_window_drops_the_staged_policy_unwritten(store_location):
    url, options = store_location
    parts, plane = asyncio.run(_parts(url, options))
    asyncio.run(plane.put_samples("rollouts", ["stray:0"], {"reward": torch.zeros(1, 1)}))
    parts.policy = policy = RecordingPolicy()
    with pytest.raises(InventoryMismatchError):
        asyncio.run(save_bundle(parts, 2))
    assert policy.outcome == "discarded"
    assert _no_transaction_left(url, options)


@pytest.mark.parametrize(
    ("change", "field"),
    [({"rollout_order": "sideways"}, "rollout_order"), ({"extra_metadata": {"trainer_ranks": "two"}}, "trainer_ranks")],
)
def test_a_save_refuses_to_commit_run_bundle_metadata_no_restore_would_read(store_location, change, field):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options))
    parts = dataclasses.replace(parts, **change)
    with pytest.raises(CheckpointError, match=f"refusing to commit .*run-bundle metadata: {field}: expected"):
        asyncio.run(save_bundle(parts, 2))
    assert BundleStore(url, options).entries() == []


def test_a_diverged_runs_non_finite_metrics_are_dropped_and_the_save_commits(store_location, caplog):
    url, options = store_location
    parts, _ = asyncio.run(_parts(url, options))
    parts = dataclasses.replace(parts, metrics=lambda: {"reward": 0.25, "loss": float("nan")})
    asyncio.run(save_bundle(parts, 2))
    assert BundleStore(url, options).open(2).manifest.metadata["metrics"] == {"reward": 0.25}
    assert "save of step 2: metrics not recorded, not finite: loss=nan" in caplog.text
