"""Signed bundles from the command line: `rlckpt keygen`, and --verify-key (or RLCKPT_VERIFY_KEY) on every
command that reads a run: ls shows signed / unsigned / bad, verify exits 1 with "unsigned" or "bad
signature", gc's retention never counts an unsigned bundle. Key files that cannot be used exit 64 in one
line. Store tests run on local disk and on S3."""

from __future__ import annotations

import json
import os
import stat

import pytest

from rlckpt.store import BundleStore, SigningKey, write_key_pair
from support.forge import carry_signature, copy_bundle, forge_step, rewrite_run_record


@pytest.fixture
def keys(tmp_path):
    return write_key_pair(tmp_path / "keys")


@pytest.fixture
def signed_run(run, keys):
    """The run with step 2 committed by a store with the signing key."""
    store = BundleStore(run.url, run.storage_options, signing_key=keys.signing_key)
    with store.begin(2) as txn:
        txn.write_bytes("policy/weights.bin", b"w" * 3000)
        txn.commit({"step": 2})
    return run


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# --- keygen -------------------------------------------------------------------------------------------------


def test_keygen_writes_a_private_key_for_its_owner_only_and_a_public_key(cli, tmp_path):
    out = tmp_path / "keys"
    result = cli("keygen", "--out", str(out), "--json")
    assert result.code == 0, result.err
    written = result.json()
    assert written == {
        "key_id": SigningKey.load(out / "signing.key").key_id,
        "signing_key": str(out / "signing.key"),
        "verify_key": str(out / "signing.pub"),
    }
    assert stat.S_IMODE(os.stat(out / "signing.key").st_mode) == 0o600
    assert "PRIVATE" not in result.out and "PUBLIC" not in result.out


def test_keygen_never_overwrites_a_key_and_says_so_in_one_line(cli, keys):
    before = open(keys.signing_key, "rb").read()  # noqa: SIM115
    result = cli("keygen", "--out", os.path.dirname(keys.signing_key))
    assert result.code == 64
    assert "exists: keygen never overwrites a key" in one_line(result.err)
    assert open(keys.signing_key, "rb").read() == before  # noqa: SIM115


# --- key files that cannot be used --------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["ls", "verify", "gc"])
def test_a_missing_verify_key_file_exits_64_in_one_line(cli, signed_run, tmp_path, command):
    missing = tmp_path / "nowhere.pub"
    result = cli(command, signed_run.url, "--verify-key", str(missing), *signed_run.options_args())
    assert result.code == 64
    assert f"verify key {missing} does not exist" in one_line(result.err)


def test_train_refuses_a_signing_key_file_others_may_read_before_anything_starts(cli, keys, tmp_path):
    os.chmod(keys.signing_key, 0o644)
    result = cli("train", "--run-dir", str(tmp_path / "run"), "--steps", "2", "--signing-key", keys.signing_key)
    assert result.code == 64
    assert "is open to others (mode 0644)" in one_line(result.err)
    assert not (tmp_path / "run").exists()


def test_train_given_the_public_key_as_its_signing_key_says_it_is_the_public_key(cli, keys, tmp_path):
    result = cli("train", "--run-dir", str(tmp_path / "run"), "--steps", "2", "--signing-key", keys.verify_key)
    assert result.code == 64
    assert f"signing key {keys.verify_key} is a public key: signing needs the private key" in one_line(result.err)
    assert not (tmp_path / "run").exists()


def test_train_takes_its_signing_key_from_the_environment(cli, keys, tmp_path, monkeypatch):
    os.chmod(keys.signing_key, 0o640)
    monkeypatch.setenv("RLCKPT_SIGNING_KEY", keys.signing_key)
    result = cli("train", "--run-dir", str(tmp_path / "run"), "--steps", "2")
    assert result.code == 64 and "is open to others (mode 0640)" in one_line(result.err)


def test_train_with_a_verify_key_and_no_signing_key_warns_that_its_own_bundles_will_not_verify(cli, signed_run, keys):
    args = ("--steps", "4", "--fresh", "--verify-key", keys.verify_key, *signed_run.options_args())
    result = cli("train", "--run-dir", signed_run.url, *args)  # --fresh over bundle 2: stops before Ray starts
    assert result.code != 0 and "--fresh but" in result.err
    assert "WARNING: a verify key and no signing key: the bundles this run saves are unsigned" in result.err


# --- ls -----------------------------------------------------------------------------------------------------


def test_ls_with_the_verify_key_shows_signed_unsigned_and_bad(cli, signed_run, keys):
    plain = signed_run.store()
    forge_step(plain, 2, 4, {})  # committed without the key
    forge_step(plain, 2, 6, {})
    carry_signature(plain, 2, 6)  # ... wearing step 2's signature
    result = cli("ls", signed_run.url, "--verify-key", keys.verify_key, "--json", *signed_run.options_args())
    assert result.code == 0
    shown = {r["step"]: (r["state"], r["signature"], r["signature_checked"]) for r in result.json()}
    assert shown == {2: ("committed", "signed", True), 4: ("corrupt", "unsigned", True), 6: ("corrupt", "bad", True)}
    table = cli("ls", signed_run.url, "--verify-key", keys.verify_key, *signed_run.options_args()).out
    assert [line.split()[2] for line in table.splitlines()[1:]] == ["signed", "unsigned", "bad"]


def test_ls_without_a_verify_key_says_a_signature_is_unchecked(cli, signed_run, keys):
    (record,) = cli("ls", signed_run.url, "--json", *signed_run.options_args()).json()
    assert (record["state"], record["signature"], record["signature_checked"]) == ("committed", "signed", False)
    assert record["signed_by"] == SigningKey.load(keys.signing_key).key_id
    assert "signed (unchecked)" in cli("ls", signed_run.url, *signed_run.options_args()).out


def test_ls_takes_the_verify_key_from_the_environment(cli, signed_run, keys, monkeypatch):
    forge_step(signed_run.store(), 2, 4, {})
    monkeypatch.setenv("RLCKPT_VERIFY_KEY", keys.verify_key)
    records = cli("ls", signed_run.url, "--json", *signed_run.options_args()).json()
    assert [r["signature"] for r in records] == ["signed", "unsigned"]


# --- verify -------------------------------------------------------------------------------------------------


def test_verify_with_the_verify_key_passes_a_signed_bundle_naming_its_key(cli, signed_run, keys):
    result = cli("verify", signed_run.url, "--verify-key", keys.verify_key, *signed_run.options_args())
    assert result.code == 0, result.err
    assert f"signed by key {SigningKey.load(keys.signing_key).key_id}" in result.out
    assert "not checked" not in result.out


def test_verify_with_the_verify_key_exits_1_on_an_unsigned_bundle(cli, signed_run, keys):
    forge_step(signed_run.store(), 2, 4, {})
    result = cli("verify", signed_run.url, "--step", "4", "--verify-key", keys.verify_key, *signed_run.options_args())
    assert result.code == 1
    assert one_line(result.err).startswith("UNSIGNED: step 4 at ")


def test_verify_with_the_verify_key_exits_1_on_a_bad_signature(cli, signed_run, keys):
    plain = signed_run.store()
    forge_step(plain, 2, 4, {})
    carry_signature(plain, 2, 4)
    args = ("verify", signed_run.url, "--all", "--verify-key", keys.verify_key, *signed_run.options_args())
    result = cli(*args, "--json")
    assert result.code == 1
    verdicts = {r["step"]: r["status"] for r in result.json()["results"]}
    assert verdicts == {2: "valid", 4: "bad_signature"}
    assert "BAD SIGNATURE: step 4 at " in cli(*args).err


def test_verify_with_another_key_exits_1_naming_the_signing_key(cli, signed_run, keys, tmp_path):
    other = write_key_pair(tmp_path / "other")
    result = cli("verify", signed_run.url, "--verify-key", other.verify_key, *signed_run.options_args())
    assert result.code == 1
    line = one_line(result.err)
    assert line.startswith("BAD SIGNATURE:") and f"signed by another key ({keys.key_id})" in line


# --- gc -----------------------------------------------------------------------------------------------------


def test_gc_retention_with_the_verify_key_never_counts_an_unsigned_bundle(cli, signed_run, keys):
    forge_step(signed_run.store(), 2, 4, {})  # the newest bundle: intact and unsigned
    args = ("gc", signed_run.url, "--keep-last", "1", "--verify-key", keys.verify_key, "--json")
    record = cli(*args, *signed_run.options_args()).json()
    assert record["kept_steps"] == [2] and record["deleted_steps"] == []
    assert record["corrupt_steps"] == [4]
    assert signed_run.store().steps() == [2, 4]


def test_no_json_output_carries_key_material(cli, signed_run, keys):
    private = open(keys.signing_key).read()  # noqa: SIM115
    body = "".join(private.splitlines()[1:-1])
    for command in ("ls", "verify"):
        result = cli(command, signed_run.url, "--verify-key", keys.verify_key, "--json", *signed_run.options_args())
        assert body not in result.out and body not in result.err
    assert json.loads(cli("keygen", "--out", str(os.path.dirname(keys.signing_key)) + "2", "--json").out)


# --- --run-id: the run a key shared by several runs is read for ---------------------------------------------


@pytest.fixture
def attacked_run(signed_run, keys) -> tuple[str, str]:
    """The signed run (Y: step 2) with step 4 of run X, signed with the same key, and X's _run.json copied
    in (issue 24). Returns (Y's id, X's id)."""
    y = signed_run.store()
    y_id = y.run_record().run_id
    x = BundleStore(signed_run.url + "-x", signed_run.storage_options, signing_key=keys.signing_key)
    with x.begin(4) as txn:
        txn.write_bytes("policy/weights.bin", b"x" * 3000)
        txn.commit({"step": 4})
    copy_bundle(x, 4, y)
    rewrite_run_record(y, x.run_record().run_id)
    return y_id, x.run_record().run_id


def test_verify_with_the_run_pinned_refuses_another_runs_bundle_and_passes_its_own(cli, signed_run, keys, attacked_run):
    y_id, x_id = attacked_run
    args = ("verify", signed_run.url, "--all", "--verify-key", keys.verify_key, "--run-id", y_id)
    result = cli(*args, "--json", *signed_run.options_args())
    assert result.code == 1
    verdicts = {r["step"]: (r["status"], r["run"]) for r in result.json()["results"]}
    assert verdicts == {2: ("valid", y_id), 4: ("bad_signature", None)}
    assert f"_run.json names run {x_id}, not the pinned run {y_id}" in result.err
    lines = cli(*args, *signed_run.options_args()).err.splitlines()
    assert f"BAD SIGNATURE: step 4 at {signed_run.url}: bad signature: signed for another run ({x_id})" in lines[-1]


def test_ls_takes_the_pinned_run_from_the_environment(cli, signed_run, keys, attacked_run, monkeypatch):
    y_id, _x_id = attacked_run
    monkeypatch.setenv("RLCKPT_RUN_ID", y_id)
    records = cli("ls", signed_run.url, "--verify-key", keys.verify_key, "--json", *signed_run.options_args()).json()
    assert [(r["step"], r["state"], r["signature"]) for r in records] == [
        (2, "committed", "signed"),
        (4, "corrupt", "bad"),
    ]


def test_train_pinned_to_its_run_refuses_a_run_record_of_another_run_before_anything_starts(
    cli, signed_run, keys, attacked_run
):
    y_id, x_id = attacked_run
    args = ("--run-dir", signed_run.url, "--steps", "6", "--signing-key", keys.signing_key, "--run-id", y_id)
    result = cli("train", *args, *signed_run.options_args())
    assert result.code == 3
    assert f"names run {x_id}, not the pinned run {y_id}" in one_line(result.err)


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("flag", "argument --run-id: 'RUN1' is not a run id"),
        ("environment", "$RLCKPT_RUN_ID 'RUN1' is not a run id"),
        ("no verify key", "goes with a verify key"),
    ],
)
def test_a_pin_that_is_not_a_run_id_or_has_no_verify_key_exits_64_in_one_line(
    cli, signed_run, keys, monkeypatch, how, why
):
    args = ["ls", signed_run.url, *signed_run.options_args()]
    if how == "flag":
        args += ["--verify-key", keys.verify_key, "--run-id", "RUN1"]
    elif how == "environment":
        monkeypatch.setenv("RLCKPT_RUN_ID", "RUN1")
        args += ["--verify-key", keys.verify_key]
    else:
        args += ["--run-id", "a" * 32]
    result = cli(*args)
    assert result.code == 64 and why in one_line(result.err)
