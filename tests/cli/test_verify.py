"""`rlckpt verify`: exit 0 valid, 1 corrupt (naming the file), 2 uncommitted or missing, 3 unreadable (a
newer rlckpt's format)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import rlckpt
from rlckpt.store import COMMIT_FORMAT
from support.store_checks import raw_path, rewrite_as_format_1

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_verify_of_a_valid_bundle_exits_0(run, cli):
    run.commit(3)
    result = cli("verify", run.url, "--step", "3", *run.options_args())
    assert result.code == 0, result.err
    assert "step 3: valid (2 files" in result.out


def test_verify_without_step_checks_the_newest_committed_bundle(run, cli):
    run.commit(1)
    run.commit(7)
    result = cli("verify", run.url, "--json", *run.options_args())
    assert result.code == 0
    assert [(r["step"], r["status"]) for r in result.json()["results"]] == [(7, "valid")]


def test_verify_of_a_flipped_byte_exits_1_and_names_the_file(run, cli):
    run.commit(2)
    fs, path = run.stored_path(2, "policy/weights.bin")
    data = bytearray(fs.cat_file(path))
    data[1000] ^= 0x01
    fs.pipe_file(path, bytes(data))
    result = cli("verify", run.url, "--step", "2", *run.options_args())
    assert result.code == 1
    assert "CORRUPT" in result.err and "policy/weights.bin" in result.err


def test_verify_of_a_deleted_file_exits_1(run, cli):
    run.commit(2)
    fs, path = run.stored_path(2, "loader.pt")
    fs.rm_file(path)
    result = cli("verify", run.url, "--step", "2", "--json", *run.options_args())
    assert result.code == 1
    (verdict,) = result.json()["results"]
    assert verdict["status"] == "corrupt" and "loader.pt" in verdict["error"]


def test_verify_of_a_step_without_commit_exits_2(run, cli):
    tx = run.store().begin(4)
    tx.write_bytes("a.bin", b"a")
    try:
        result = cli("verify", run.url, "--step", "4", "--json", *run.options_args())
    finally:
        tx.abort()
    assert result.code == 2
    assert result.json()["results"][0]["status"] == "uncommitted"


def test_verify_of_a_missing_step_exits_2(run, cli):
    run.commit(1)
    result = cli("verify", run.url, "--step", "99", *run.options_args())
    assert result.code == 2
    assert result.err.startswith("MISSING: ") and "step 99" in result.err


def test_verify_of_a_run_without_committed_bundles_exits_2(run, cli):
    result = cli("verify", run.url, *run.options_args())
    assert result.code == 2
    assert "no committed bundle" in result.err


def test_verify_all_reports_every_step_and_fails_on_the_corrupt_one(run, cli):
    run.commit(1)
    run.commit(2)
    fs, path = run.raw_path("step_1", "COMMIT")
    fs.rm_file(fs._strip_protocol(run.raw_path("step_1", "manifest.json")[1]))  # COMMIT left, manifest gone
    result = cli("verify", run.url, "--all", "--json", *run.options_args())
    assert result.code == 1
    assert [(r["step"], r["status"]) for r in result.json()["results"]] == [(1, "corrupt"), (2, "valid")]


def test_verify_progress_bar_goes_to_stderr(run, cli):
    run.commit(1, {"big.bin": b"b" * 300_000})
    result = cli("verify", run.url, "--progress", *run.options_args())
    assert result.code == 0
    assert "step 1" in result.err and "%" in result.err
    assert "%" not in result.out


def test_verify_says_what_wrote_a_format_2_bundle(run, cli):
    run.commit(3, metadata={"rlckpt_run_format": 3})
    result = cli("verify", run.url, "--step", "3", *run.options_args())
    assert result.code == 0, result.err
    assert (
        f"step 3: valid (2 files, 3.0 KiB; manifest format 2, blake3, run-bundle format 3, written by rlckpt "
        f"{rlckpt.__version__}, unsigned)" in result.out
    )


@pytest.mark.parametrize(
    ("metadata", "shown", "kind"),
    [
        ({"rlckpt_run_format": 3}, "run-bundle format 3", ("run", 3)),
        ({"checkpointer_format": 1, "world_size": 2}, "checkpointer-bundle format 1", ("checkpointer", 1)),
        ({"anything": "else"}, "no run-bundle or checkpointer-bundle format", (None, None)),
    ],
    ids=["run", "checkpointer", "neither"],
)
def test_verify_names_a_bundles_kind_and_its_own_format(run, cli, metadata, shown, kind):
    run.commit(3, metadata=metadata)
    result = cli("verify", run.url, "--step", "3", *run.options_args())
    assert result.code == 0, result.err
    assert f"manifest format 2, blake3, {shown}, written by rlckpt" in result.out
    verdict = cli("verify", run.url, "--step", "3", "--json", *run.options_args()).json()["results"][0]
    assert (verdict["bundle_kind"], verdict["bundle_format"]) == kind


def test_verify_checks_a_hand_built_format_1_bundle_under_sha256(run, cli):
    run.commit(3)
    rewrite_as_format_1(run.store(), 3)
    result = cli("verify", run.url, "--step", "3", "--json", *run.options_args())
    assert result.code == 0, result.err
    (verdict,) = result.json()["results"]
    assert (verdict["status"], verdict["manifest_format"], verdict["digest"], verdict["writer_version"]) == (
        "valid",
        1,
        "sha256",
        None,
    )


def test_verify_of_a_flipped_byte_in_a_format_1_bundle_exits_1_naming_sha256(run, cli):
    run.commit(2)
    rewrite_as_format_1(run.store(), 2)
    fs, path = run.stored_path(2, "policy/weights.bin")
    data = bytearray(fs.cat_file(path))
    data[1000] ^= 0x01
    fs.pipe_file(path, bytes(data))
    result = cli("verify", run.url, "--step", "2", *run.options_args())
    assert result.code == 1
    assert "policy/weights.bin has sha256:" in result.err


def test_verify_of_a_bundle_of_a_newer_commit_format_exits_3_in_one_line(run, cli):
    run.commit(2)
    store = run.store()
    fs, path = store.fs, raw_path(store, "step_2", "COMMIT")
    fs.pipe_file(
        path,
        fs.cat_file(path)
        .replace(f'"format":{COMMIT_FORMAT}'.encode(), b'"format":5')
        .replace(rlckpt.__version__.encode(), b"0.4.2"),
    )
    result = cli("verify", run.url, "--json", *run.options_args())
    assert result.code == 3
    (verdict,) = result.json()["results"]
    assert verdict["status"] == "newer"
    assert "COMMIT format 5 was written by a newer rlckpt 0.4;" in verdict["error"]


@pytest.mark.parametrize(
    ("fixture", "run_format"), [("run_format_1", 1), ("run_format_1_async", 1), ("run_format_2", 2)]
)
def test_verify_of_a_bundle_written_by_an_old_rlckpt_is_valid_under_sha256(fixture, run_format, cli, tmp_path):
    run_dir = shutil.copytree(FIXTURES / fixture / "run", tmp_path / "run")
    result = cli("verify", str(run_dir), "--json")
    assert result.code == 0, result.err
    (verdict,) = result.json()["results"]
    written_by = (verdict["manifest_format"], verdict["digest"], verdict["run_format"], verdict["writer_version"])
    assert written_by == (1, "sha256", run_format, None)
