"""The pinned save: only the index is captured in the window; the captured rows are copied afterwards
while commits, removals and column writes go on, and the bundle holds exactly the captured rows.

In-memory data plane (the same RowCopyWorker runs as a Ray actor over TransferQueue in tests/dataplane
and the main job). Each interleaving is forced by holding the copy at an exact call.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
import torch

from rlckpt.checkpoint import codec, layout
from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.restore import restore_run
from rlckpt.checkpoint.row_copy import RowCopyWorker
from rlckpt.checkpoint.save import SaveParticipants, StagedBytes, save_bundle
from rlckpt.dataplane.memory import InMemoryDataPlane, InMemoryStore
from rlckpt.errors import InventoryMismatchError
from rlckpt.replay import DataPlaneCheckpointBarrier, ReplayBuffer
from rlckpt.store import BundleStore
from support.store_checks import debris

GROUP = 4
PARTITION = "rollouts"


@dataclass(frozen=True)
class PlaneSpec:
    plane: InMemoryStore

    def connect(self) -> InMemoryDataPlane:
        return InMemoryDataPlane(self.plane)


class HeldCopier(RowCopyWorker):
    """A RowCopyWorker that stops before copying batch `hold_at` until released (None: never stops)."""

    def __init__(self, plane: InMemoryStore, hold_at: int | None = None) -> None:
        super().__init__(PlaneSpec(plane))
        self.hold_at = hold_at
        self.batches = 0
        self.reached = asyncio.Event()
        self.go = asyncio.Event()
        self.first_done = asyncio.Event()

    async def copy(self, partition_id, keys, fields, relpath):
        if self.batches == self.hold_at:
            self.reached.set()
            await self.go.wait()
        self.batches += 1
        size = await super().copy(partition_id, keys, fields, relpath)
        self.first_done.set()
        return size


class Policy:
    async def stage_policy(self):
        return StagedBytes(b"policy")


def rows(seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {"completion": torch.randint(0, 50, (40,), generator=g), "reward": torch.rand(1, generator=g)}
        for _ in range(GROUP)
    ]


async def buffer_with(groups: int) -> tuple[ReplayBuffer, InMemoryStore]:
    store = InMemoryStore()
    replay = ReplayBuffer(
        InMemoryDataPlane(store), DataPlaneCheckpointBarrier(), partition_id=PARTITION, group_size=GROUP
    )
    for i in range(groups):
        gid = replay.reserve(weight_version=0)
        await replay.commit(gid, rows(i), start_weight=0, end_weight=0)
    return replay, store


def parts_for(url, options, replay, copier) -> SaveParticipants:
    return SaveParticipants(
        store=BundleStore(url, options),
        policy=Policy(),
        replay=replay,
        capture_loader_state=lambda: {"position": len(replay)},
        row_copier=copier,
    )


class NoTrainer:
    """The restore's trainer side, loading nothing (these tests look at the data plane)."""

    async def load_policy(self, location) -> None:
        return None


async def restored_rows(url, options, step) -> tuple[InMemoryStore, dict]:
    """Restore the bundle into a fresh plane, as a resumed run would; its rows and the index."""
    fresh = InMemoryStore()
    run = await restore_run(
        BundleStore(url, options),
        trainer=NoTrainer(),
        bootstrap=InMemoryDataPlane(fresh),
        phase=RestorePhase(),
        resume_step=step,
    )
    return fresh, run.replay_state


async def until(predicate, rounds: int = 1000) -> None:
    """Let the event loop run (no I/O pending) until `predicate` holds: a state, not a time, decides."""
    for _ in range(rounds):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the state never came")


def as_plain(plane: InMemoryStore) -> dict[str, dict[str, list]]:
    return {k: {f: t.tolist() for f, t in row.items()} for k, row in plane.rows.get(PARTITION, {}).items()}


def test_pinned_bundle_holds_exactly_the_captured_rows_while_the_plane_moves_on(store_location):
    url, options = store_location

    async def scenario():
        replay, plane = await buffer_with(10)  # 40 rows: two rows files
        captured_rows = as_plain(plane)
        copier = HeldCopier(plane, hold_at=1)  # the first file is written, the second not yet
        save = asyncio.create_task(save_bundle(parts_for(url, options, replay, copier), 2, upload_timing="pinned"))
        await copier.reached.wait()
        first, last = replay.groups()[0].group_id, replay.groups()[-1].group_id
        await copier.first_done.wait()  # the first file is written (copies overlap) ...
        await until(lambda: first not in replay.pinned)  # ... and its groups unpinned
        late = replay.reserve(weight_version=1)
        await replay.commit(late, rows(99), start_weight=1, end_weight=1)  # committed after the capture
        await replay.write_fields(last, {"advantages": torch.zeros(GROUP, 1)})  # a new column on a pinned group
        await replay.remove_group(last)  # removed while still pinned: its rows must stay until copied
        await replay.remove_group(first)  # already copied: cleared at once
        assert f"{last}:0" in plane.rows[PARTITION] and f"{first}:0" not in plane.rows[PARTITION]
        copier.go.set()
        report = await save
        assert f"{last}:0" not in plane.rows[PARTITION]  # the deferred clear ran once the copy had it
        fresh, index = await restored_rows(url, options, 2)
        return report, captured_rows, as_plain(fresh), index

    report, captured_rows, restored, index = asyncio.run(scenario())
    assert restored == captured_rows  # not the late group, no advantages, nothing removed missing
    assert len(index["groups"]) == 10
    assert report.upload_timing == "pinned" and report.window_s < report.snapshot_s


def test_overwriting_a_captured_column_waits_for_the_copy_but_adding_one_does_not(store_location):
    url, options = store_location

    async def scenario():
        replay, plane = await buffer_with(10)
        copier = HeldCopier(plane, hold_at=0)
        save = asyncio.create_task(save_bundle(parts_for(url, options, replay, copier), 2, upload_timing="pinned"))
        await copier.reached.wait()
        gid = replay.groups()[0].group_id
        await replay.write_fields(replay.groups()[1].group_id, {"advantages": torch.ones(GROUP, 1)})  # new: at once
        overwrite = asyncio.create_task(replay.write_fields(gid, {"reward": torch.full((GROUP, 1), 7.0)}))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not overwrite.done()  # held: the copy has not read this group's rewards yet
        copier.go.set()
        await save
        await overwrite
        fresh, _ = await restored_rows(url, options, 2)
        return plane, fresh, gid

    plane, fresh, gid = asyncio.run(scenario())
    assert fresh.rows[PARTITION][f"{gid}:0"]["reward"].item() != 7.0  # the bundle has the captured value
    assert plane.rows[PARTITION][f"{gid}:0"]["reward"].item() == 7.0  # and the live plane the new one


def test_a_stray_row_no_index_accounts_for_aborts_the_pinned_save(store_location):
    url, options = store_location

    async def scenario():
        replay, plane = await buffer_with(3)
        await InMemoryDataPlane(plane).put_samples(PARTITION, ["stray:0"], {"reward": torch.zeros(1, 1)})
        with pytest.raises(InventoryMismatchError, match="stray:0"):
            await save_bundle(parts_for(url, options, replay, HeldCopier(plane)), 2, upload_timing="pinned")
        return replay

    replay = asyncio.run(scenario())
    store = BundleStore(url, options)
    assert store.steps() == [] and debris(store) == []
    assert replay.pinned == set()  # the pins went with the save


def test_a_cancelled_pinned_save_releases_its_pins_and_runs_the_deferred_clears(store_location):
    url, options = store_location

    async def scenario():
        replay, plane = await buffer_with(10)
        copier = HeldCopier(plane, hold_at=1)
        save = asyncio.create_task(save_bundle(parts_for(url, options, replay, copier), 2, upload_timing="pinned"))
        await copier.reached.wait()
        last = replay.groups()[-1].group_id
        await replay.remove_group(last)
        assert f"{last}:0" in plane.rows[PARTITION]
        save.cancel()
        with pytest.raises(asyncio.CancelledError):
            await save
        return replay, plane, last

    replay, plane, last = asyncio.run(scenario())
    assert replay.pinned == set() and f"{last}:0" not in plane.rows[PARTITION]
    store = BundleStore(url, options)
    assert store.steps() == [] and debris(store) == []


class HeldClears(InMemoryDataPlane):
    """An in-memory plane whose ``clear_samples`` stops once ``hold`` is set, until ``go`` is."""

    def __init__(self, store: InMemoryStore) -> None:
        super().__init__(store)
        self.hold = False
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    async def clear_samples(self, partition_id, keys):
        if self.hold:
            self.reached.set()
            await self.go.wait()
        await super().clear_samples(partition_id, keys)


def test_a_save_cancelled_while_a_deferred_clear_runs_still_clears_those_rows_and_the_next_save_commits(
    store_location,
):
    """The cancel lands inside the clear of a group removed while pinned: the clear runs to its end, else
    its rows stay in the data plane as strays no index accounts for, and every later save fails on them."""
    url, options = store_location

    async def scenario():
        _, plane = await buffer_with(0)
        held = HeldClears(plane)
        replay = ReplayBuffer(held, DataPlaneCheckpointBarrier(), partition_id=PARTITION, group_size=GROUP)
        for i in range(10):
            await replay.commit(replay.reserve(weight_version=0), rows(i), start_weight=0, end_weight=0)
        copier = HeldCopier(plane, hold_at=1)
        save = asyncio.create_task(save_bundle(parts_for(url, options, replay, copier), 2, upload_timing="pinned"))
        await copier.reached.wait()
        last = replay.groups()[-1].group_id
        await replay.remove_group(last)  # pinned: its clear waits for the copy
        held.hold = True
        copier.go.set()
        await held.reached.wait()  # the copy is done with it: its deferred clear has begun
        save.cancel()
        with pytest.raises(asyncio.CancelledError):
            await save
        held.hold = False
        held.go.set()
        await until(lambda: f"{last}:0" not in plane.rows[PARTITION])
        await save_bundle(parts_for(url, options, replay, HeldCopier(plane)), 4, upload_timing="pinned")
        return replay

    replay = asyncio.run(scenario())
    assert BundleStore(url, options).steps() == [4]
    assert replay.pinned == set() and replay.deferred_sample_ids == set()


def test_commits_never_wait_at_the_barrier_during_a_pinned_save(tmp_path):
    async def scenario():
        replay, plane = await buffer_with(10)
        copier = HeldCopier(plane, hold_at=0)
        waits_before = len(replay.barrier.stats().checkpoint_windows)
        save = asyncio.create_task(
            save_bundle(parts_for(str(tmp_path / "run"), None, replay, copier), 2, upload_timing="pinned")
        )
        await copier.reached.wait()
        for i in range(5):  # rollouts commit while the copy is held
            await replay.commit(replay.reserve(weight_version=1), rows(50 + i), start_weight=1, end_weight=1)
        copier.go.set()
        await save
        return replay.barrier.stats(), waits_before

    stats, windows_before = asyncio.run(scenario())
    assert len(stats.checkpoint_windows) == windows_before  # the exclusive side was never taken


def test_the_replay_index_and_loader_position_of_a_pinned_bundle_are_the_captured_ones(store_location):
    url, options = store_location

    async def scenario():
        replay, plane = await buffer_with(4)
        replay.reserve(weight_version=1)  # in flight at the capture: regenerated after a resume
        await save_bundle(parts_for(url, options, replay, HeldCopier(plane)), 2, upload_timing="pinned")

    asyncio.run(scenario())
    bundle = BundleStore(url, options).open(2)
    index = codec.loads(bundle.read_bytes(layout.REPLAY_FILE), origin="t")
    assert [bool(g["sample_ids"]) for g in index["groups"]] == [True, True, True, True, False]
    assert codec.loads(bundle.read_bytes(layout.LOADER_FILE), origin="t") == {"position": 5}
    bundle.verify()
