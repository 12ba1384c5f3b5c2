"""Key files for signed bundles: what `write_key_pair` (rlckpt keygen) writes, and every key file that
cannot be used refused in one line naming the file, never quoting key material (docs/security.md)."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from rlckpt.errors import KeyFileError
from rlckpt.store import BundleStore, SigningKey, VerifyKey, write_key_pair


@pytest.fixture
def pair(tmp_path):
    return write_key_pair(tmp_path / "keys")


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def one_line_naming(exc: pytest.ExceptionInfo[KeyFileError], path) -> str:
    message = str(exc.value)
    assert str(path) in message and "\n" not in message
    return message


def test_a_key_pair_is_a_private_key_only_its_owner_may_read_and_a_public_key(pair):
    assert mode(pair.signing_key) == 0o600 and mode(pair.verify_key) == 0o644
    assert mode(os.path.dirname(pair.signing_key)) == 0o700
    signing, verify = SigningKey.load(pair.signing_key), VerifyKey.load(pair.verify_key)
    assert signing.public == verify and verify.key_id == pair.key_id
    assert verify.verifies(b"m", signing.sign(b"m")) and not verify.verifies(b"n", signing.sign(b"m"))


def test_a_key_pair_is_never_written_over_an_existing_key(pair):
    before = Path(pair.signing_key).read_bytes()
    with pytest.raises(KeyFileError, match="exists: keygen never overwrites a key") as exc:
        write_key_pair(os.path.dirname(pair.signing_key))
    one_line_naming(exc, pair.signing_key)
    assert Path(pair.signing_key).read_bytes() == before


def test_a_missing_key_file_is_refused_in_one_line(tmp_path):
    missing = tmp_path / "nowhere" / "signing.key"
    with pytest.raises(KeyFileError, match="signing key .* does not exist") as exc:
        SigningKey.load(missing)
    one_line_naming(exc, missing)
    with pytest.raises(KeyFileError, match="verify key .* does not exist"):
        VerifyKey.load(tmp_path / "signing.pub")


@pytest.mark.parametrize("loose", [0o644, 0o640, 0o604, 0o620], ids=lambda m: f"{m:04o}")
def test_a_signing_key_file_open_to_others_is_refused_in_one_line(pair, loose):
    os.chmod(pair.signing_key, loose)
    with pytest.raises(KeyFileError, match=f"is open to others \\(mode {loose:04o}\\).*chmod 600") as exc:
        SigningKey.load(pair.signing_key)
    one_line_naming(exc, pair.signing_key)


def test_a_store_given_a_signing_key_file_open_to_others_refuses_to_be_built(pair, tmp_path):
    os.chmod(pair.signing_key, 0o644)
    with pytest.raises(KeyFileError, match="is open to others"):
        BundleStore(str(tmp_path / "run"), signing_key=pair.signing_key)


def test_a_private_key_given_as_the_verify_key_is_refused(pair):
    with pytest.raises(KeyFileError, match="holds a private key: readers need only the public one") as exc:
        VerifyKey.load(pair.signing_key)
    one_line_naming(exc, pair.signing_key)


@pytest.mark.parametrize("public_mode", [0o644, 0o600], ids=["as keygen writes it", "owner only"])
def test_a_public_key_given_as_the_signing_key_is_refused_as_the_public_key(pair, public_mode):
    os.chmod(pair.verify_key, public_mode)
    with pytest.raises(KeyFileError, match=r"signing key .* is a public key: signing needs the private key") as exc:
        SigningKey.load(pair.verify_key)
    assert "open to others" not in one_line_naming(exc, pair.verify_key)


@pytest.mark.parametrize(
    ("kind", "key"),
    [
        ("an RSA", rsa.generate_private_key(65537, 2048)),
        ("an EC", ec.generate_private_key(ec.SECP256R1())),
    ],
)
def test_a_key_of_another_algorithm_is_refused_naming_it(tmp_path, kind, key):
    private = tmp_path / "other.key"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    private.chmod(0o600)
    public = tmp_path / "other.pub"
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(KeyFileError, match=f"holds {kind} key, not an Ed25519 one"):
        SigningKey.load(private)
    with pytest.raises(KeyFileError, match=f"holds {kind} key, not an Ed25519 one"):
        VerifyKey.load(public)


def test_an_encrypted_signing_key_is_refused(tmp_path):
    path = tmp_path / "signing.key"
    encrypted = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")
    )
    path.write_bytes(encrypted)
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match="is encrypted"):
        SigningKey.load(path)


@pytest.mark.parametrize("content", [b"", b"not a key", b"x" * (64 << 10)], ids=["empty", "text", "large"])
def test_a_file_that_is_no_key_is_refused_without_quoting_it(tmp_path, content):
    path = tmp_path / "signing.key"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(KeyFileError) as exc:
        SigningKey.load(path)
    message = one_line_naming(exc, path)
    assert "not a key" not in message.replace("not a key file", "")


def test_a_directory_or_fifo_is_not_a_key_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path, tmp_path / "fifo"):
        with pytest.raises(KeyFileError, match="is not a regular file"):
            VerifyKey.load(path)


def test_a_signing_key_shows_and_pickles_nothing_but_what_it_must(pair):
    key = SigningKey.load(pair.signing_key)
    private_pem = Path(pair.signing_key).read_bytes()
    assert repr(key) == f"SigningKey({pair.key_id})" and private_pem.decode() not in repr(key)
    copy = pickle.loads(pickle.dumps(key))  # how it reaches the controller actor
    assert copy.key_id == key.key_id and copy.public.verifies(b"m", key.sign(b"m"))
    assert pickle.loads(pickle.dumps(key.public)) == key.public
