"""A corrupt newest bundle is skipped on resume, loudly, and the run goes on from the newest bundle that
verifies, ending where an uninterrupted run ends; --resume-step pins one bundle or fails. Retention
in the resumed run (keep_last) never deletes the last good bundle."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rlckpt.controller.config import TrainConfig
from rlckpt.errors import CheckpointError
from rlckpt.grpo import GRPOConfig
from rlckpt.store import BundleStore
from support.controller import run_in_process
from support.store_checks import all_paths, corrupt_file

POLICY_SHARD = "policy/__0_0.distcp"  # rank 0's shard file (DCP's name) in a bundle's policy/
SMALL = GRPOConfig(group_size=4, prompts_per_step=4)


def _run(url, steps, options=None, **kw):
    config = TrainConfig(run_dir=url, steps=steps, save_every=2, grpo=SMALL, storage_options=options, **kw)
    return asyncio.run(run_in_process(config))


@pytest.fixture
def saved_to_4(store_location):
    """A run saved at steps 2 and 4, whose newest bundle then rots (one bit of the policy)."""
    url, options = store_location
    _run(url, 4, options)
    corrupt_file(BundleStore(url, options), 4, POLICY_SHARD, "flip")
    return url, options


def test_resume_skips_a_corrupt_newest_bundle_and_says_so(saved_to_4, caplog):
    url, options = saved_to_4
    with caplog.at_level(logging.WARNING):
        run = _run(url, 4, options)
    assert run.restored.step == 2
    assert [s.step for s in run.restored.skipped] == [4]
    assert POLICY_SHARD in run.restored.skipped[0].reason
    assert "SKIPPING step 4" in caplog.text


def test_resumed_run_saves_over_the_corrupt_step_and_ends_like_an_uninterrupted_run(saved_to_4, tmp_path):
    url, options = saved_to_4
    straight = _run(str(tmp_path / "straight"), 6).summary
    resumed = _run(url, 6, options).summary
    assert resumed.resumed_from == 2
    assert resumed.policy_sha256 == straight.policy_sha256
    store = BundleStore(url, options)
    assert store.steps() == [2, 4, 6]
    for step in (2, 4, 6):
        store.open(step).verify()
    assert any(p.startswith("_quarantine/step_4-") for p in all_paths(store))  # the corrupt one, kept aside


def test_retention_in_the_resumed_run_keeps_the_newest_good_bundles(saved_to_4):
    url, options = saved_to_4
    _run(url, 6, options, keep_last=1)
    store = BundleStore(url, options)
    assert store.steps() == [6]
    store.open(6).verify()


def test_resume_step_pins_an_older_bundle(saved_to_4):
    url, options = saved_to_4
    store = BundleStore(url, options)
    store.backend.quarantine("step_4", "by-hand")  # the operator moved the bad one away
    run = _run(url, 4, options, resume_step=2)
    assert run.restored.step == 2 and run.restored.skipped == []


def test_resume_step_of_a_bundle_that_does_not_verify_fails_and_loads_nothing(saved_to_4):
    url, options = saved_to_4
    with pytest.raises(CheckpointError, match="cannot resume step 4 .* does not verify"):
        _run(url, 6, options, resume_step=4)


def test_resume_step_below_newer_good_bundles_is_refused(store_location):
    url, options = store_location
    _run(url, 4, options)
    with pytest.raises(CheckpointError, match=r"newer committed bundles \[4\]"):
        _run(url, 6, options, resume_step=2)


def test_resume_step_that_does_not_exist_fails(store_location):
    url, options = store_location
    _run(url, 2, options)
    with pytest.raises(CheckpointError, match="cannot resume step 8"):
        _run(url, 4, options, resume_step=8)


def test_resume_fails_without_loading_anything_when_no_bundle_verifies(saved_to_4):
    url, options = saved_to_4
    corrupt_file(BundleStore(url, options), 2, POLICY_SHARD, "truncate")
    with pytest.raises(CheckpointError, match="no committed bundle .* verifies"):
        _run(url, 6, options)
