"""A run with a signing key signs every bundle it saves and, resumed with the verify key, reads only
bundles that key signed for it: one committed by anyone else (every digest intact) is skipped like a
corrupt one, loudly, and retention never counts it. The private key reaches no file of the run and no
log line. In process (in-memory data plane, one in-process trainer rank), on local disk."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest

from rlckpt.checkpoint.phase import RestorePhase
from rlckpt.checkpoint.restore import PolicyLocation, restore_run
from rlckpt.controller.config import TrainConfig
from rlckpt.dataplane.memory import InMemoryDataPlane, InMemoryStore
from rlckpt.errors import CheckpointError, RunIdentityError
from rlckpt.grpo import GRPOConfig
from rlckpt.store import COMMIT_FORMAT, BundleStore, SigningKey
from support.controller import InProcessRun, run_in_process
from support.dcp_ranks import quiet_dcp_warnings
from support.forge import commit_json, forge_step, put_commit_json

quiet_dcp_warnings()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SMALL = GRPOConfig(group_size=4, prompts_per_step=4)
KEY = SigningKey.generate()


def config(run_dir: str, steps: int, **overrides) -> TrainConfig:
    keys = {"signing_key": KEY, "verify_key": KEY.public}
    return TrainConfig(run_dir=run_dir, steps=steps, save_every=2, grpo=SMALL, **(keys | overrides))


@pytest.fixture(scope="module")
def signed_run(tmp_path_factory) -> str:
    """A run dir whose bundles 2 and 4 a run with the signing key saved."""
    run_dir = str(tmp_path_factory.mktemp("signed") / "run")
    asyncio.run(run_in_process(config(run_dir, 4)))
    return run_dir


@pytest.fixture
def run(signed_run, tmp_path) -> BundleStore:
    """A copy of the signed run, with step 6 committed by someone without the key (step 4's files)."""
    shutil.copytree(signed_run, tmp_path / "run")
    store = BundleStore(str(tmp_path / "run"))
    forge_step(store, 4, 6, {})
    return store


def test_every_bundle_a_run_with_a_signing_key_saves_is_signed_by_it(signed_run):
    store = BundleStore(signed_run, verify_key=KEY.public)
    assert store.steps() == [2, 4]
    assert {e.signed_by for e in store.entries()} == {KEY.key_id}


def test_a_resume_with_the_verify_key_skips_an_unsigned_newer_bundle_loudly_and_saves_its_step_signed(run, caplog):
    with caplog.at_level(logging.WARNING, logger="rlckpt"):
        resumed = asyncio.run(run_in_process(config(run.url, 6)))
    assert resumed.restored is not None and resumed.restored.step == 4
    (skipped,) = resumed.restored.skipped
    assert skipped.step == 6 and "unsigned" in skipped.reason
    assert "SKIPPING step 6" in caplog.text
    store = BundleStore(run.url, verify_key=KEY.public)
    assert store.steps() == [2, 4, 6]  # step 6 saved anew, signed; the unsigned one moved to _quarantine/
    assert store.open(6).commit.signature.key_id == KEY.key_id


def test_a_resume_with_the_verify_key_skips_an_unsigned_bundle_declaring_a_newer_format(run):
    put_commit_json(run, 6, {**commit_json(run, 6), "format": COMMIT_FORMAT + 1})  # no rlckpt can check it here
    resumed = asyncio.run(run_in_process(config(run.url, 6)))
    assert resumed.restored is not None and resumed.restored.step == 4
    (skipped,) = resumed.restored.skipped
    assert skipped.step == 6 and f"bad signature: not checked (COMMIT format {COMMIT_FORMAT + 1}" in skipped.reason


def test_a_pinned_resume_of_an_unsigned_bundle_is_refused(run):
    with pytest.raises(CheckpointError, match="cannot resume step 6 .*: it does not verify .*unsigned"):
        asyncio.run(run_in_process(config(run.url, 8, resume_step=6)))


def test_the_private_key_is_in_no_file_of_the_run_and_in_no_log_line(tmp_path, caplog):
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.DEBUG):
        asyncio.run(run_in_process(config(str(run_dir), 2), run=InProcessRun()))
    raw = KEY.__reduce__()[1][0]  # the 32 bytes a pickle of the key carries
    pem_body = b"".join(KEY.private_pem().splitlines()[1:-1])
    secrets = [raw, raw.hex().encode(), pem_body]
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "COMMIT" for p in files)
    for path in files:
        data = path.read_bytes()
        assert not any(secret in data for secret in secrets), path
    logged = "\n".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records).encode()
    assert logged and not any(secret in logged for secret in secrets)
    assert Path(run_dir / "_run.json").exists()


# --- one key, two runs: the resume pins its run -------------------------------------------------------------


class SpyTrainer:
    """Where a restore told the trainer ranks to load the policy from (nothing is loaded)."""

    def __init__(self) -> None:
        self.loaded: list[PolicyLocation] = []

    async def load_policy(self, location: PolicyLocation) -> None:
        self.loaded.append(location)


@pytest.fixture(scope="module")
def other_run(tmp_path_factory) -> str:
    """Run Y, signed with the same key as `signed_run` (run X): its one bundle, step 2."""
    run_dir = str(tmp_path_factory.mktemp("other") / "run")
    asyncio.run(run_in_process(config(run_dir, 2)))
    return run_dir


@pytest.fixture
def attacked(signed_run, other_run, tmp_path) -> tuple[str, str, str]:
    """Run Y with X's step 4 and X's _run.json copied in (issue 24): (Y's dir, Y's id, X's id)."""
    y_dir = tmp_path / "y"
    shutil.copytree(other_run, y_dir)
    y_id = BundleStore(str(y_dir)).run_record().run_id
    x_id = BundleStore(signed_run).run_record().run_id
    shutil.copytree(Path(signed_run) / "step_4", y_dir / "step_4")
    shutil.copy(Path(signed_run) / "_run.json", y_dir / "_run.json")
    return str(y_dir), y_id, x_id


def test_a_restore_pinned_to_its_run_skips_another_runs_bundle_signed_by_the_same_key(attacked):
    y_dir, y_id, x_id = attacked
    trainer = SpyTrainer()
    store = BundleStore(y_dir, verify_key=KEY.public, run_id=y_id)
    restored = asyncio.run(
        restore_run(store, trainer=trainer, bootstrap=InMemoryDataPlane(InMemoryStore()), phase=RestorePhase())
    )
    assert restored is not None and restored.step == 2  # Y's own, not X's step 4
    (skipped,) = restored.skipped
    assert skipped.step == 4 and f"signed for another run ({x_id}); this run is {y_id}" in skipped.reason
    assert [(location.step, location.run_id) for location in trainer.loaded] == [(2, y_id)]  # the ranks pin it too


def test_a_run_pinned_to_its_id_refuses_to_start_on_a_run_record_of_another_run(attacked):
    y_dir, y_id, x_id = attacked
    with pytest.raises(RunIdentityError, match=f"_run.json names run {x_id}, not the pinned run {y_id}"):
        asyncio.run(run_in_process(config(y_dir, 4, run_id=y_id)))
