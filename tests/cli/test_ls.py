"""`rlckpt ls`: one row per step with state, signature, size, files and creation time; --json for scripts."""

from __future__ import annotations

import json

import rlckpt
from support.store_checks import rewrite_as_format_1, rewrite_manifest


def test_ls_table_lists_each_committed_step_with_its_file_count(run, cli):
    run.commit(1)
    run.commit(2, {"only.bin": b"x" * 10})
    result = cli("ls", run.url, *run.options_args())
    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[0].split()[:6] == ["STEP", "STATE", "SIGNATURE", "SIZE", "UNCHANGED", "FILES"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1], r[2], r[-3]) for r in rows] == [
        ("1", "committed", "unsigned", "2"),
        ("2", "committed", "unsigned", "1"),
    ]


def test_ls_shows_the_bytes_of_each_bundle_its_predecessor_also_holds(run, cli):
    store = run.store()
    for step, live in ((1, b"1"), (2, b"2")):
        with store.begin(step, reuse=True) as txn:
            txn.write_bytes("frozen.bin", b"f" * 4000)
            txn.write_bytes("live.bin", live * 100)
            txn.commit()
    records = cli("ls", run.url, "--json", *run.options_args()).json()
    assert [(r["step"], r["size"], r["unchanged"]) for r in records] == [(1, 4100, None), (2, 4100, 4000)]
    table = cli("ls", run.url, *run.options_args()).out.splitlines()
    assert table[2].split()[5:7] == ["3.9", "KiB"]


def test_ls_json_gives_step_state_size_files_created(run, cli):
    run.commit(5, {"a.bin": b"a" * 1234, "b/c.bin": b"c" * 66})
    records = cli("ls", run.url, "--json", *run.options_args()).json()
    assert len(records) == 1
    record = records[0]
    assert (record["step"], record["state"], record["size"], record["files"]) == (5, "committed", 1300, 2)
    assert record["created"].startswith("20")


def test_ls_shows_a_transaction_in_progress_as_writing(run, cli):
    run.commit(1)
    tx = run.store().begin(2)
    tx.write_bytes("half.bin", b"h" * 10)
    try:
        records = cli("ls", run.url, "--json", *run.options_args()).json()
    finally:
        tx.abort()
    assert [(r["step"], r["state"]) for r in records] == [(1, "committed"), (2, "writing")]


def test_ls_shows_a_bundle_with_a_forged_commit_as_corrupt(run, cli):
    run.commit(1)
    fs, path = run.raw_path("step_1", "manifest.json")
    fs.pipe_file(path, fs.cat_file(path).replace(b'"step":1', b'"step":1 '))
    records = cli("ls", run.url, "--json", *run.options_args()).json()
    assert [(r["step"], r["state"]) for r in records] == [(1, "corrupt")]


def test_ls_json_shows_what_wrote_each_bundle_in_either_manifest_format(run, cli):
    run.commit(1, metadata={"rlckpt_run_format": 2})
    run.commit(2, metadata={"rlckpt_run_format": 3})
    run.commit(3)
    rewrite_as_format_1(run.store(), 1)
    records = cli("ls", run.url, "--json", *run.options_args()).json()
    written_by = [(r["manifest_format"], r["digest"], r["run_format"], r["writer_version"]) for r in records]
    assert written_by == [
        (1, "sha256", 2, None),
        (2, "blake3", 3, rlckpt.__version__),
        (2, "blake3", None, rlckpt.__version__),
    ]


def test_ls_json_names_each_bundles_kind_and_its_own_format(run, cli):
    run.commit(1, metadata={"rlckpt_run_format": 3})
    run.commit(2, metadata={"checkpointer_format": 1})
    run.commit(3)
    records = cli("ls", run.url, "--json", *run.options_args()).json()
    kinds = [(r["step"], r["bundle_kind"], r["bundle_format"]) for r in records]
    assert kinds == [(1, "run", 3), (2, "checkpointer", 1), (3, None, None)]


def test_ls_shows_a_bundle_of_a_newer_manifest_format_as_newer_naming_it(run, cli):
    run.commit(1)
    fs, path = run.raw_path("step_1", "manifest.json")
    rewrite_manifest(run.store(), 1, fs.cat_file(path).replace(b'"format":2', b'"format":9'))
    (record,) = cli("ls", run.url, "--json", *run.options_args()).json()
    assert record["state"] == "newer"
    assert "manifest format 9 was written by a newer rlckpt" in record["detail"]


def test_ls_of_an_empty_run_says_so_and_succeeds(run, cli):
    result = cli("ls", run.url, *run.options_args())
    assert result.code == 0
    assert "no bundles" in result.out


def _manifest_with(run, step: int, key: str, value: bytes) -> None:
    """Rewrite `step`'s manifest (and its COMMIT to name it) with `value`, raw JSON, under `key` of its
    metadata: what whoever writes the run can commit."""
    fs, path = run.raw_path(f"step_{step}", "manifest.json")
    original = fs.cat_file(path)
    placeholder = json.dumps({"placeholder": 0}, separators=(",", ":")).encode()
    manifest = json.loads(original)
    manifest["metadata"] = {key: {"placeholder": 0}}
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    rewrite_manifest(run.store(), step, text.replace(placeholder, value, 1))


def test_ls_shows_a_manifest_nested_800_deep_as_corrupt_in_one_row(run, cli):
    run.commit(1)
    run.commit(2)
    _manifest_with(run, 2, "rlckpt_run_format", b'{"a":' * 800 + b"1" + b"}" * 800)
    result = cli("ls", run.url, *run.options_args())
    assert result.code == 0, result.err
    header, first, second = result.out.splitlines()
    assert second.split()[:2] == ["2", "corrupt"]
    assert "manifest.json: manifest is nested deeper than 64 levels" in second and "Recursion" not in result.out


def test_ls_quotes_a_ten_million_character_manifest_key_short(run, cli):
    run.commit(1)
    fs, path = run.raw_path("step_1", "manifest.json")
    manifest = json.loads(fs.cat_file(path))
    key = "k" * 10_000_000
    rewrite_manifest(run.store(), 1, json.dumps({**manifest, key: 1}, sort_keys=True, separators=(",", ":")).encode())
    result = cli("ls", run.url, *run.options_args())
    header, row = result.out.splitlines()
    assert row.split()[:2] == ["1", "corrupt"]
    assert f"manifest: [{'k' * 80!r}… (10000000 characters)]: unknown field" in row and len(row) < 500
