"""`rlckpt verify`: exit 0 valid, 1 corrupt (naming the file), 2 uncommitted or missing."""

from __future__ import annotations


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
