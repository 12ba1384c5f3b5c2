"""`rlckpt train` resumes bundles older rlckpt versions wrote (tests/fixtures/, made by the old code: see
the README there) on a fresh Ray cluster: from the state the old run saved, and on deterministically.

Each run starts its own Ray cluster and TransferQueue (≈30-45 s, more on a loaded machine).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlckpt.checkpoint import layout
from rlckpt.store import BundleStore
from rlckpt.testing.old_bundles import SAVED_STEP, OldBundle
from rlckpt.testing.train_cli import run_train

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FORMAT_1 = OldBundle(FIXTURES / "run_format_1", 1)
FORMAT_1_ASYNC = OldBundle(FIXTURES / "run_format_1_async", 1)
FORMAT_2 = OldBundle(FIXTURES / "run_format_2", 2)


def test_a_format_1_bundle_resumed_at_one_rank_ends_where_the_old_code_went_on(tmp_path):
    run_dir = FORMAT_1.copy_run(tmp_path)
    resumed = run_train(run_dir, 4, "--trainer-ranks", "1")
    assert resumed["resumed_from"] == SAVED_STEP
    assert resumed["start_policy_sha256"] == FORMAT_1.summary()["policy_sha256"]
    old_went_on = FORMAT_1.summary("old_resume_to_4")
    assert resumed["policy_sha256"] == old_went_on["policy_sha256"]
    assert resumed["trained_draws"] == old_went_on["trained_draws"]
    saved = BundleStore(run_dir).open(4).manifest.metadata
    assert saved[layout.META_FORMAT] == layout.RUN_BUNDLE_FORMAT  # the run goes on in today's format


def test_a_format_2_bundle_resumed_twice_at_two_ranks_starts_from_the_saved_state_and_ends_alike(tmp_path):
    first = run_train(FORMAT_2.copy_run(tmp_path / "first"), 4, "--trainer-ranks", "2")
    second = run_train(FORMAT_2.copy_run(tmp_path / "second"), 4, "--trainer-ranks", "2")
    for resumed in (first, second):
        assert resumed["resumed_from"] == SAVED_STEP
        assert resumed["start_policy_sha256"] == FORMAT_2.summary()["policy_sha256"]
        assert resumed["trained_draws"] == FORMAT_2.summary("old_resume_to_4")["trained_draws"]
    assert first["policy_sha256"] == second["policy_sha256"]


def test_an_async_format_1_bundle_with_rows_in_transferqueue_resumes_losing_no_prompt(tmp_path):
    old = FORMAT_1_ASYNC.summary()
    resumed = run_train(FORMAT_1_ASYNC.copy_run(tmp_path), 4, "--mode", "async")
    assert resumed["resumed_from"] == SAVED_STEP
    assert resumed["start_policy_sha256"] == old["policy_sha256"]
    trained = old["trained_draws"] + resumed["trained_draws"]
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    assert sorted(trained + resumed["unconsumed_draws"]) == list(range(resumed["drawn"])), "a prompt was lost"
