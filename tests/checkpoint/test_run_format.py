"""The run-bundle record is read in every format `rlckpt train` wrote; the old key names live in one place."""

from __future__ import annotations

import pytest

from rlckpt.checkpoint import layout
from rlckpt.checkpoint.run_format import POLICY_DCP, POLICY_WHOLE, READERS, RUN_BUNDLE_FORMATS, read_run_bundle
from rlckpt.errors import BundleFormatError, CorruptBundleError

DIGEST = "ab" * 32


def _data_plane(order_key: str = layout.META_ROLLOUT_ORDER, order: str = "in_order") -> dict:
    return {"index_digest": DIGEST, "group_count": 8, order_key: order, "step": 2, "partition_id": "rollouts"}


def _format_1(**changes) -> dict:
    meta = {
        layout.META_FORMAT: 1,
        "index_digest": DIGEST,
        "group_count": 8,
        "mode": "async",
        "save_mode": "inline",
        "data_plane": _data_plane("mode", "async"),
        "task": "DigitSumTask(...)",
        "steps_target": 2,
    }
    return {**meta, **changes}


def _format_2(**changes) -> dict:
    meta = {
        layout.META_FORMAT: 2,
        "index_digest": DIGEST,
        "group_count": 8,
        layout.META_ROLLOUT_ORDER: "in_order",
        layout.META_UPLOAD_TIMING: "staged",
        "data_plane": _data_plane(),
    }
    return {**meta, **changes}


def _format_3(**changes) -> dict:
    return {**_format_2(), layout.META_FORMAT: 3, layout.META_TRAINER_RANKS: 2, **changes}


def test_every_run_bundle_format_up_to_the_one_written_today_has_a_reader_and_a_declaration():
    assert sorted(READERS) == list(range(1, layout.RUN_BUNDLE_FORMAT + 1))
    assert [r.format for r in RUN_BUNDLE_FORMATS] == sorted(READERS)


def test_format_1_names_the_rollout_order_mode_and_the_upload_timing_save_mode():
    run = read_run_bundle(2, _format_1())
    assert (run.rollout_order, run.upload_timing) == ("async", "inline")
    assert (run.policy_path, run.policy_form) == (layout.POLICY_FILE, POLICY_WHOLE)


def test_format_2_holds_the_policy_whole_in_one_file_under_todays_key_names():
    run = read_run_bundle(2, _format_2())
    assert (run.rollout_order, run.upload_timing) == ("in_order", "staged")
    assert (run.policy_path, run.policy_form) == (layout.POLICY_FILE, POLICY_WHOLE)


def test_format_3_holds_the_trainer_ranks_dcp_checkpoint():
    run = read_run_bundle(4, _format_3())
    assert (run.policy_path, run.policy_form, run.trainer_ranks) == (layout.POLICY_DIR, POLICY_DCP, 2)


def test_the_metadata_is_open_to_keys_of_the_savers_own():
    assert read_run_bundle(4, _format_3(experiment="x")).format == 3


@pytest.mark.parametrize(
    ("meta", "path"),
    [
        (_format_1(mode=None), "mode"),
        (_format_2(data_plane=_data_plane("mode")), "data_plane.rollout_order"),  # format 1's key in format 2
        ({k: v for k, v in _format_3().items() if k != layout.META_UPLOAD_TIMING}, "upload_timing"),
        (_format_3(trainer_ranks=True), "trainer_ranks"),
        (_format_3(index_digest="not hex"), "index_digest"),
    ],
    ids=["format-1-mode-null", "format-2-data-plane-old-key", "upload-timing-missing", "ranks-bool", "digest"],
)
def test_metadata_of_a_format_this_rlckpt_reads_is_refused_naming_the_field_it_breaks(meta, path):
    with pytest.raises(CorruptBundleError, match=f"^step 4: manifest metadata: run-bundle metadata: {path}: "):
        read_run_bundle(4, meta)


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
