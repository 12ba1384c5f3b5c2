"""restore_run: verify everything, refuse mismatched pieces, and only then load — in that order."""

import asyncio
import os
from pathlib import Path

import pytest
import torch

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.phase import Phase, RestorePhase
from rlckpt.checkpoint.restore import PolicyLocation, restore_run
from rlckpt.controller.config import TrainConfig
from rlckpt.dataplane.memory import InMemoryDataPlane, InMemoryStore
from rlckpt.errors import (
    BundleFormatError,
    CheckpointError,
    NewerFormatError,
    RestoreOrderError,
    RestoreRefusedError,
)
from rlckpt.grpo import GRPOConfig
from rlckpt.store import COMMIT_FORMAT, BundleStore
from support.controller import run_in_process
from support.store_checks import rewrite_as_format_1

SMALL = GRPOConfig(group_size=4, prompts_per_step=4)


POLICY_SHARD = f"{layout.POLICY_DIR}/__0_0.distcp"  # the one rank's shard file (DCP's name)


class SpyTrainer:
    """Records where each restore told the trainer ranks to load the policy from."""

    def __init__(self) -> None:
        self.loaded: list[PolicyLocation] = []

    async def load_policy(self, location: PolicyLocation) -> None:
        self.loaded.append(location)


def _train(run_dir: str, steps: int, options=None) -> None:
    config = TrainConfig(run_dir=run_dir, steps=steps, save_every=2, grpo=SMALL, storage_options=options)
    asyncio.run(run_in_process(config))


def _restore(store: BundleStore, plane: InMemoryStore | None = None, phase: RestorePhase | None = None, **kw):
    trainer = SpyTrainer()
    phase = phase or RestorePhase()
    bootstrap = InMemoryDataPlane(plane if plane is not None else InMemoryStore())
    result = asyncio.run(restore_run(store, trainer=trainer, bootstrap=bootstrap, phase=phase, **kw))
    return result, trainer, phase, bootstrap


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> str:
    """A run dir with committed bundles at steps 2 and 4 (local disk)."""
    run_dir = str(tmp_path_factory.mktemp("trained") / "run")
    _train(run_dir, 4)
    return run_dir


def _copy_run(src: str, dst: Path) -> str:
    import shutil

    shutil.copytree(src, dst / "run")
    return str(dst / "run")


def test_no_bundle_means_a_fresh_start(tmp_path):
    result, trainer, phase, _ = _restore(BundleStore(str(tmp_path / "empty")))
    assert result is None
    assert phase.state is Phase.FRESH
    assert trainer.loaded == []


def test_restore_loads_the_newest_bundle_into_trainer_loader_and_data_plane(trained_run):
    store = BundleStore(trained_run)
    result, trainer, phase, bootstrap = _restore(store)
    bundle = store.open(4)
    assert result.step == 4 and phase.state is Phase.RESTORED
    assert trainer.loaded == [PolicyLocation(store.url, {}, 4, layout.POLICY_DIR)]
    assert result.loader_state["step"] == 4
    indexed = sorted(s for g in result.replay_state["groups"] for s in g["sample_ids"])
    assert asyncio.run(bootstrap.list_sample_ids("rollouts")) == indexed
    assert result.index_digest == bundle.manifest.metadata[layout.META_INDEX_DIGEST]


def test_restore_works_from_s3_with_an_empty_staging_dir(tmp_path, s3_run_url, s3_storage_options):
    _train(s3_run_url, 2, options=s3_storage_options)
    staging = tmp_path / "staging"
    result, _, phase, _ = _restore(BundleStore(s3_run_url, s3_storage_options), staging_root=str(staging))
    assert result.step == 2 and phase.state is Phase.RESTORED
    assert list(staging.iterdir()) == []  # staging is cleaned up after the load


def test_sidecar_and_snapshot_from_different_saves_are_refused_before_anything_loads(trained_run, tmp_path):
    run_dir = _copy_run(trained_run, tmp_path)
    store = BundleStore(run_dir)
    old, new = store.open(2), store.open(4)
    with store.begin(6) as txn:  # a buggy writer: replay index of step 2, everything else of step 4
        for rel in new.manifest.files:
            source = old if rel == layout.REPLAY_FILE else new
            txn.write_bytes(rel, source.read_bytes(rel))
        txn.commit(dict(new.manifest.metadata))
    plane = InMemoryStore()
    with pytest.raises(CheckpointError, match="cannot resume step 6 .*different saves"):
        _restore(store, plane=plane, resume_step=6)
    assert plane.is_empty()
    result, _, _, _ = _restore(store)  # unpinned: the newest bundle that verifies, the mixed one skipped
    assert result.step == 4 and "different saves" in result.skipped[0].reason


def test_a_refused_bundle_leaves_the_phase_closed_to_connect_only_clients(trained_run, tmp_path):
    run_dir = _copy_run(trained_run, tmp_path)
    snapshot_meta = Path(run_dir) / "step_4" / layout.DATA_PLANE_METADATA
    os.remove(snapshot_meta)
    phase = RestorePhase()
    with pytest.raises(CheckpointError, match="cannot resume step 4"):
        _restore(BundleStore(run_dir), phase=phase, resume_step=4)
    with pytest.raises(RestoreOrderError):
        phase.require_ready("the connect-only data-plane client")


def test_a_flipped_byte_in_the_policy_is_caught_before_the_trainer_loads_it(trained_run, tmp_path):
    run_dir = _copy_run(trained_run, tmp_path)
    path = Path(run_dir) / "step_4" / POLICY_SHARD
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    spy = SpyTrainer()
    plane = InMemoryStore()
    with pytest.raises(CheckpointError, match=f"cannot resume step 4 .*{POLICY_SHARD}"):
        asyncio.run(
            restore_run(
                BundleStore(run_dir),
                trainer=spy,
                bootstrap=InMemoryDataPlane(plane),
                phase=RestorePhase(),
                resume_step=4,
            )
        )
    assert spy.loaded == [] and plane.is_empty()
    result, trainer, _, _ = _restore(BundleStore(run_dir))  # unpinned: step 2's policy, never step 4's
    assert result.step == 2 and [loc.step for loc in trainer.loaded] == [2]


def test_restore_onto_a_data_plane_another_client_touched_is_refused(trained_run):
    plane = InMemoryStore()
    asyncio.run(InMemoryDataPlane(plane).put_samples("other", ["k:0"], {"x": torch.zeros(1, 1)}))
    phase = RestorePhase()
    with pytest.raises(RestoreRefusedError):
        _restore(BundleStore(trained_run), plane=plane, phase=phase)
    assert phase.state is Phase.FAILED


def test_resuming_with_another_rollout_order_is_refused_naming_the_flag_to_use(trained_run):
    with pytest.raises(CheckpointError, match="--mode in_order"):
        _restore(BundleStore(trained_run), expected_rollout_order="async")


def _recommitted(trained_run: str, run_dir: Path, **metadata: object) -> BundleStore:
    """A run dir holding bundle 4 of `trained_run` with its manifest metadata changed as given."""
    store = BundleStore(str(run_dir))
    bundle = BundleStore(trained_run).open(4)
    with store.begin(4) as txn:
        for rel in bundle.manifest.files:
            txn.write_bytes(rel, bundle.read_bytes(rel))
        txn.commit({**bundle.manifest.metadata, **metadata})
    return store


def test_a_bundle_of_a_newer_run_bundle_format_is_refused_in_one_line_naming_it_before_anything_loads(
    trained_run, tmp_path
):
    store = _recommitted(trained_run, tmp_path / "run", **{layout.META_FORMAT: layout.RUN_BUNDLE_FORMAT + 1})
    plane = InMemoryStore()
    with pytest.raises(BundleFormatError) as refused:
        _restore(store, plane=plane)
    message = str(refused.value)
    assert f"run-bundle format {layout.RUN_BUNDLE_FORMAT + 1} was written by a newer rlckpt" in message
    assert "resume it with that newer rlckpt" in message and "\n" not in message
    assert plane.is_empty()


def _newer_commit(run_dir: str, step: int) -> None:
    """Make `step`'s COMMIT one of a format this rlckpt does not read (what a newer rlckpt would write)."""
    commit = Path(run_dir) / f"step_{step}" / "COMMIT"
    newer = f'"format":{COMMIT_FORMAT + 1}'.encode()
    commit.write_bytes(commit.read_bytes().replace(f'"format":{COMMIT_FORMAT}'.encode(), newer))


def test_a_newest_bundle_of_a_newer_commit_format_is_refused_in_one_line_and_no_older_one_is_tried(
    trained_run, tmp_path
):
    run_dir = _copy_run(trained_run, tmp_path)
    _newer_commit(run_dir, 4)
    plane = InMemoryStore()
    with pytest.raises(NewerFormatError) as refused:
        _restore(BundleStore(run_dir), plane=plane)
    message = str(refused.value)
    assert (
        "step 4" in message
        and f"COMMIT format {COMMIT_FORMAT + 1} was written by a newer rlckpt" in message
        and "\n" not in message
    )
    assert plane.is_empty()


def test_resuming_an_older_step_below_a_bundle_of_a_newer_format_is_refused(trained_run, tmp_path):
    run_dir = _copy_run(trained_run, tmp_path)
    _newer_commit(run_dir, 4)
    with pytest.raises(CheckpointError, match=r"newer committed bundles \[4\] exist"):
        _restore(BundleStore(run_dir), resume_step=2)


def test_a_run_bundle_rewritten_as_manifest_format_1_restores(trained_run, tmp_path):
    store = BundleStore(_copy_run(trained_run, tmp_path))
    rewrite_as_format_1(store, 4)
    result, trainer, phase, _ = _restore(store)
    assert (result.step, result.manifest.format, phase.state) == (4, 1, Phase.RESTORED)
    assert [location.step for location in trainer.loaded] == [4]


def test_the_manifest_says_which_mode_is_the_rollout_order_and_which_the_upload_timing(trained_run):
    metadata = BundleStore(trained_run).open(4).manifest.metadata
    assert metadata[layout.META_ROLLOUT_ORDER] == "in_order"
    assert metadata[layout.META_UPLOAD_TIMING] == "pinned"  # the run's default
    assert metadata[layout.META_FORMAT] == layout.RUN_BUNDLE_FORMAT
