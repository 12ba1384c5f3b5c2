"""Every place rlckpt takes a key — BundleStore, the Checkpointer (and its config), ReplicationConfig, rlckpt
train's TrainConfig — takes the key itself or the path of its file (str or PathLike), through one loader; a
key file that cannot be used is KeyFileError naming the file, whichever place was given it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlckpt import Checkpointer
from rlckpt.checkpointer import CheckpointerConfig
from rlckpt.controller.config import TrainConfig
from rlckpt.errors import KeyFileError
from rlckpt.store import BundleStore, SigningKey, VerifyKey, write_key_pair
from rlckpt.tiers import ReplicationConfig
from support.permissions import mode_enforced


@pytest.fixture
def pair(tmp_path):
    return write_key_pair(tmp_path / "keys")


def _checkpointer_signing(run: str, key: Any) -> SigningKey | None:
    ckpt = Checkpointer(run, signing_key=key)
    try:
        return ckpt.store.signing_key
    finally:
        ckpt.close()


def _checkpointer_verify(run: str, key: Any) -> VerifyKey | None:
    ckpt = Checkpointer(run, verify_key=key)
    try:
        return ckpt.store.verify_key
    finally:
        ckpt.close()


# Each place a signing key is taken, and what it holds once given `key` (the run is a fresh local dir).
SIGNING: dict[str, Callable[[str, Any], SigningKey | None]] = {
    "BundleStore": lambda run, key: BundleStore(run, signing_key=key).signing_key,
    "CheckpointerConfig": lambda run, key: CheckpointerConfig(run, signing_key=key).store().signing_key,
    "Checkpointer": _checkpointer_signing,
    "TrainConfig": lambda run, key: TrainConfig(run_dir=run, signing_key=key).store().signing_key,
}
VERIFY: dict[str, Callable[[str, Any], VerifyKey | None]] = {
    "BundleStore": lambda run, key: BundleStore(run, verify_key=key).verify_key,
    "CheckpointerConfig": lambda run, key: CheckpointerConfig(run, verify_key=key).store().verify_key,
    "Checkpointer": _checkpointer_verify,
    "ReplicationConfig": lambda run, key: ReplicationConfig(run, verify_key=key).remote_store().verify_key,
    "TrainConfig": lambda run, key: TrainConfig(run_dir=run, verify_key=key).store().verify_key,
}


@pytest.mark.parametrize("place", SIGNING)
@pytest.mark.parametrize("given", ["str", "Path", "key"])
def test_a_signing_key_is_taken_as_its_file_or_as_itself(pair, tmp_path, place, given):
    key = {"str": str(pair.signing_key), "Path": Path(pair.signing_key), "key": SigningKey.load(pair.signing_key)}
    loaded = SIGNING[place](str(tmp_path / "run"), key[given])
    assert isinstance(loaded, SigningKey) and loaded.key_id == pair.key_id


@pytest.mark.parametrize("place", VERIFY)
@pytest.mark.parametrize("given", ["str", "Path", "key"])
def test_a_verify_key_is_taken_as_its_file_or_as_itself(pair, tmp_path, place, given):
    key = {"str": str(pair.verify_key), "Path": Path(pair.verify_key), "key": VerifyKey.load(pair.verify_key)}
    loaded = VERIFY[place](str(tmp_path / "run"), key[given])
    assert isinstance(loaded, VerifyKey) and loaded.key_id == pair.key_id


def test_a_checkpointer_given_a_signing_key_file_reads_with_its_public_half(pair, tmp_path):
    config = CheckpointerConfig(str(tmp_path / "run"), signing_key=pair.signing_key)
    assert isinstance(config.verify_key, VerifyKey) and config.verify_key.key_id == pair.key_id


def _bad_signing_file(pair: Any, tmp_path: Path, kind: str) -> str:
    """A signing key file of `kind` that cannot be used."""
    path = tmp_path / f"{kind}.key"
    if kind == "missing":
        return str(path)
    if kind == "world-readable":
        os.chmod(pair.signing_key, 0o644)
        return str(pair.signing_key)
    path.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64 at all\n-----END PRIVATE KEY-----\n")
    path.chmod(0o600)
    return str(path)


@pytest.mark.parametrize("place", SIGNING)
@pytest.mark.parametrize(
    ("kind", "reason"),
    [("missing", "does not exist"), ("world-readable", "is open to others"), ("malformed", "is not a PEM private key")],
)
def test_a_signing_key_file_that_cannot_be_used_is_a_key_file_error_naming_it(pair, tmp_path, place, kind, reason):
    path = _bad_signing_file(pair, tmp_path, kind)
    with pytest.raises(KeyFileError, match=reason) as caught:
        SIGNING[place](str(tmp_path / "run"), path)
    assert path in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("place", SIGNING)
def test_an_unreadable_signing_key_file_is_a_key_file_error_naming_it(pair, tmp_path, place):
    with mode_enforced(pair.signing_key, 0o000), pytest.raises(KeyFileError, match="cannot be read") as caught:
        SIGNING[place](str(tmp_path / "run"), pair.signing_key)
    assert pair.signing_key in str(caught.value)


@pytest.mark.parametrize("place", VERIFY)
@pytest.mark.parametrize(
    ("kind", "reason"),
    [("missing", "does not exist"), ("private", "holds a private key"), ("malformed", "is not a PEM public key")],
)
def test_a_verify_key_file_that_cannot_be_used_is_a_key_file_error_naming_it(pair, tmp_path, place, kind, reason):
    path = {"missing": str(tmp_path / "nowhere.pub"), "private": pair.signing_key, "malformed": str(tmp_path / "x")}
    Path(tmp_path / "x").write_bytes(b"-----BEGIN PUBLIC KEY-----\n!!\n-----END PUBLIC KEY-----\n")
    with pytest.raises(KeyFileError, match=reason) as caught:
        VERIFY[place](str(tmp_path / "run"), path[kind])
    assert path[kind] in str(caught.value)


@pytest.mark.parametrize("place", VERIFY)
def test_an_unreadable_verify_key_file_is_a_key_file_error_naming_it(pair, tmp_path, place):
    with mode_enforced(pair.verify_key, 0o000), pytest.raises(KeyFileError, match="cannot be read") as caught:
        VERIFY[place](str(tmp_path / "run"), pair.verify_key)
    assert pair.verify_key in str(caught.value)


def test_a_key_of_the_wrong_half_or_type_is_refused_naming_the_setting(pair, tmp_path):
    run = str(tmp_path / "run")
    signing = SigningKey.load(pair.signing_key)
    with pytest.raises(TypeError, match="signing_key: a VerifyKey cannot sign"):
        Checkpointer(run, signing_key=signing.public)
    with pytest.raises(TypeError, match=r"verify_key: give the public half \(signing_key.public\)"):
        Checkpointer(run, verify_key=signing)
    with pytest.raises(TypeError, match="signing_key must be a SigningKey or the path of its key file, got bytes"):
        BundleStore(run, signing_key=b"/keys/signing.key")
