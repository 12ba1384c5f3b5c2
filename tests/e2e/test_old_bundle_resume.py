"""`rlckpt train` resumes bundles older rlckpt versions wrote (tests/fixtures/, made by the old code: see
the README there) with a fresh TransferQueue: from the state the old run saved, and on deterministically.

Each run starts its own TransferQueue and actors (≈25-45 s, more on a loaded machine) on the worker's shared
Ray cluster (``shared_ray``, tests/e2e/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlckpt.checkpoint import layout
from rlckpt.store import BundleStore
from support.old_bundles import SAVED_STEP, OldBundle
from support.train_cli import run_train

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FORMAT_1 = OldBundle(FIXTURES / "run_format_1", 1)
FORMAT_1_ASYNC = OldBundle(FIXTURES / "run_format_1_async", 1)
FORMAT_2 = OldBundle(FIXTURES / "run_format_2", 2)


@pytest.fixture(scope="module")
def resumed_at_one_rank(tmp_path_factory, shared_ray) -> dict[int, dict]:
    """The in-order fixtures of formats 1 and 2 (the same policy and loader bytes) each resumed to step 4 at
    one trainer rank, as the old code resumed them."""
    return {
        old.run_format: run_train(
            old.copy_run(tmp_path_factory.mktemp(f"format-{old.run_format}")),
            4,
            "--trainer-ranks",
            "1",
            ray_address=shared_ray,
        )
        for old in (FORMAT_1, FORMAT_2)
    }


@pytest.mark.parametrize("old", [FORMAT_1, FORMAT_2], ids=["format-1", "format-2"])
def test_an_old_bundle_resumes_from_the_state_it_saved_and_trains_the_draws_the_old_code_trained(
    resumed_at_one_rank, old
):
    resumed = resumed_at_one_rank[old.run_format]
    assert resumed["resumed_from"] == SAVED_STEP
    assert resumed["start_policy_sha256"] == old.summary()["policy_sha256"]
    assert resumed["trained_draws"] == old.summary("old_resume_to_4")["trained_draws"]
    saved = BundleStore(resumed["run_dir"]).open(4).manifest.metadata
    assert saved[layout.META_FORMAT] == layout.RUN_BUNDLE_FORMAT  # the run goes on in today's format


def test_bundles_of_both_old_formats_holding_one_state_resume_to_the_same_weights(resumed_at_one_rank):
    """The old code's own resumes of both fixtures ended at one digest; today's code, reading each in its
    format, must too. (Not that digest itself: the old runs were made on another CPU, and float kernels
    differ between CPUs — the old code resuming `run_format_1` on an AMD EPYC with AVX-512 ends at
    51369c2e…, not at the b16e4fcd… it printed where the fixtures were made.)"""
    assert resumed_at_one_rank[1]["policy_sha256"] == resumed_at_one_rank[2]["policy_sha256"]
    assert resumed_at_one_rank[1]["trained_draws"] == resumed_at_one_rank[2]["trained_draws"]


def test_an_async_format_1_bundle_with_rows_in_transferqueue_resumes_losing_no_prompt(tmp_path, shared_ray):
    old = FORMAT_1_ASYNC.summary()
    resumed = run_train(FORMAT_1_ASYNC.copy_run(tmp_path), 4, "--mode", "async", ray_address=shared_ray)
    assert resumed["resumed_from"] == SAVED_STEP
    assert resumed["start_policy_sha256"] == old["policy_sha256"]
    trained = old["trained_draws"] + resumed["trained_draws"]
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    assert sorted(trained + resumed["unconsumed_draws"]) == list(range(resumed["drawn"])), "a prompt was lost"
