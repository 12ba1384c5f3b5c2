"""The run-bundle record is read in every format `rlckpt train` wrote; the old key names live in one place."""

from __future__ import annotations

import pytest

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.run_format import POLICY_DCP, POLICY_WHOLE, READERS, read_run_bundle
from rlckpt.errors import BundleFormatError


def test_every_run_bundle_format_up_to_the_one_written_today_has_a_reader():
    assert sorted(READERS) == list(range(1, layout.RUN_BUNDLE_FORMAT + 1))


def test_format_1_names_the_rollout_order_mode_and_the_upload_timing_save_mode():
    run = read_run_bundle(2, {layout.META_FORMAT: 1, "mode": "async", "save_mode": "inline"})
    assert (run.rollout_order, run.upload_timing) == ("async", "inline")
    assert (run.policy_path, run.policy_form) == (layout.POLICY_FILE, POLICY_WHOLE)


def test_format_2_holds_the_policy_whole_in_one_file_under_todays_key_names():
    meta = {layout.META_FORMAT: 2, layout.META_ROLLOUT_ORDER: "in_order", layout.META_UPLOAD_TIMING: "staged"}
    run = read_run_bundle(2, meta)
    assert (run.rollout_order, run.upload_timing) == ("in_order", "staged")
    assert (run.policy_path, run.policy_form) == (layout.POLICY_FILE, POLICY_WHOLE)


def test_format_3_holds_the_trainer_ranks_dcp_checkpoint():
    meta = {layout.META_FORMAT: 3, layout.META_ROLLOUT_ORDER: "in_order", layout.META_TRAINER_RANKS: 2}
    run = read_run_bundle(4, meta)
    assert (run.policy_path, run.policy_form, run.trainer_ranks) == (layout.POLICY_DIR, POLICY_DCP, 2)


def test_a_newer_format_is_refused_in_one_line_naming_it_and_the_way_forward():
    with pytest.raises(BundleFormatError) as refused:
        read_run_bundle(8, {layout.META_FORMAT: layout.RUN_BUNDLE_FORMAT + 1})
    message = str(refused.value)
    assert message.startswith(f"step 8: run-bundle format {layout.RUN_BUNDLE_FORMAT + 1} was written by a newer rlckpt")
    assert message.endswith("resume it with that newer rlckpt") and "\n" not in message


@pytest.mark.parametrize("found", [None, 0, True, "3"])
def test_metadata_without_a_run_bundle_format_is_refused_as_not_written_by_rlckpt_train(found):
    with pytest.raises(BundleFormatError, match="not a bundle written by `rlckpt train`"):
        read_run_bundle(2, {layout.META_FORMAT: found})
