"""Ed25519 keys for signed bundles: load a signing key (a private key file only its owner may read) or a
verify key, make a key pair (`rlckpt keygen`), and sign or check the message a COMMIT's signature covers.

The message is `bundle_message(run, step, manifest digest)`: canonical JSON under a purpose of its own, so
no other signature made with the key can pass for a bundle's, and a signed COMMIT moved to another step
or into another run no longer verifies. Key material never appears in a repr, a log line or an error
message; a signing key pickles (it travels to the controller actor over Ray) and is written nowhere else.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from rlckpt.errors import KeyFileError
from rlckpt.store.io.digest import Digest
from rlckpt.store.records.manifest import canonical_json

SIGNATURE_ALGORITHM = "ed25519"
MESSAGE_PURPOSE = "rlckpt bundle"  # a new message layout takes a new purpose, so old and new never mix
SIGNING_KEY_NAME = "signing.key"
VERIFY_KEY_NAME = "signing.pub"
KEY_FILE_MAX_BYTES = 16 << 10  # a PEM Ed25519 key is about 120 bytes; anything far larger is not one
PRIVATE_KEY_MODE = 0o600


def bundle_message(run: str, step: int, manifest: Digest) -> bytes:
    """The bytes a bundle's signature covers: which run, which step, which manifest (digest with its
    algorithm). The manifest's digest covers every file's digest, the txid and the metadata."""
    return canonical_json({"purpose": MESSAGE_PURPOSE, "run": run, "step": step, "manifest": str(manifest)})


def key_id_of(raw_public: bytes) -> str:
    """A key's id: 32 hex digits of the sha256 of its raw public key. It names the key in COMMIT and in
    messages ("signed by another key"); what proves the signer is the signature itself."""
    return hashlib.sha256(raw_public).hexdigest()[:32]


class VerifyKey:
    """An Ed25519 public key: checks bundle signatures. Plain data, safe to hand to any process (trainer
    ranks get it to open the bundle they load)."""

    __slots__ = ("_key", "_raw", "key_id")

    def __init__(self, raw: bytes) -> None:
        self._key = Ed25519PublicKey.from_public_bytes(raw)
        self._raw = bytes(raw)
        self.key_id = key_id_of(self._raw)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> VerifyKey:
        """The public key in PEM file `path` (`signing.pub`, as `rlckpt keygen` writes it).

        Raises:
            KeyFileError: missing, not a regular file, a private key, or not a PEM Ed25519 public key.
        """
        name = os.fspath(path)
        data = _read_key_file(name, "verify key", private=False)
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, UnsupportedAlgorithm):
            raise KeyFileError(
                f"verify key {name} is not a PEM public key (`rlckpt keygen` writes one as {VERIFY_KEY_NAME})"
            ) from None
        if not isinstance(key, Ed25519PublicKey):
            raise KeyFileError(f"verify key {name} holds {_kind(key)} key, not an Ed25519 one")
        return cls(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))

    def verifies(self, message: bytes, signature: bytes) -> bool:
        """Whether `signature` is this key's over `message`."""
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def public_pem(self) -> bytes:
        return self._key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def __reduce__(self) -> tuple[Any, ...]:
        return (VerifyKey, (self._raw,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VerifyKey) and other._raw == self._raw

    def __hash__(self) -> int:
        return hash(self._raw)

    def __repr__(self) -> str:
        return f"VerifyKey({self.key_id})"


class SigningKey:
    """An Ed25519 private key: signs the COMMIT of each bundle its store commits. Only the committing
    coordinator holds one. Its repr names its key id only; it pickles as its raw bytes, to reach the
    controller actor, and nothing of rlckpt logs it, prints it or writes it into a bundle."""

    __slots__ = ("_key", "public")

    def __init__(self, raw: bytes) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(raw)
        self.public = VerifyKey(
            self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        )

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(_raw_private(Ed25519PrivateKey.generate()))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        """The private key in PEM file `path` (`signing.key`, as `rlckpt keygen` writes it), which only its
        owner may read or write.

        Raises:
            KeyFileError: missing, not a regular file, open to group or others, encrypted, or not a PEM
                Ed25519 private key.
        """
        name = os.fspath(path)
        data = _read_key_file(name, "signing key", private=True)
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except TypeError:  # cryptography's word for "encrypted, and no password given"
            raise KeyFileError(
                f"signing key {name} is encrypted: rlckpt reads an unencrypted key, kept mode 0600"
            ) from None
        except (ValueError, UnsupportedAlgorithm):  # their messages are not shown: they could quote the file
            raise KeyFileError(
                f"signing key {name} is not a PEM private key (`rlckpt keygen` writes one as {SIGNING_KEY_NAME})"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"signing key {name} holds {_kind(key)} key, not an Ed25519 one")
        return cls(_raw_private(key))

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def private_pem(self) -> bytes:
        """The key as `rlckpt keygen` writes it (PKCS#8 PEM, unencrypted). Only keygen calls this."""
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (SigningKey, (_raw_private(self._key),))

    def __repr__(self) -> str:
        return f"SigningKey({self.key_id})"


# How a key is given wherever rlckpt takes one (BundleStore, CheckpointerConfig, ReplicationConfig,
# TrainConfig): the key itself, or the path of its PEM file.
SigningKeyInput = SigningKey | str | os.PathLike[str]
VerifyKeyInput = VerifyKey | str | os.PathLike[str]


def signing_key_of(key: SigningKeyInput | None, setting: str = "signing_key") -> SigningKey | None:
    """The signing key `key` gives: itself, or loaded from its file (the one loader of every place a key
    is taken); None stays None.

    Raises:
        KeyFileError: a file that cannot be used (missing, unreadable, open to others, not an Ed25519
            private key), naming it.
        TypeError: neither a SigningKey nor a path (a VerifyKey cannot sign).
    """
    if key is None or isinstance(key, SigningKey):
        return key
    if isinstance(key, (str, os.PathLike)):
        return SigningKey.load(key)
    if isinstance(key, VerifyKey):
        raise TypeError(f"{setting}: a VerifyKey cannot sign; give the SigningKey or the path of its file")
    raise TypeError(f"{setting} must be a SigningKey or the path of its key file, got {type(key).__name__}")


def verify_key_of(key: VerifyKeyInput | None, setting: str = "verify_key") -> VerifyKey | None:
    """The verify key `key` gives: itself, or loaded from its file; None stays None.

    Raises:
        KeyFileError: a file that cannot be used (missing, unreadable, a private key, not an Ed25519
            public key), naming it.
        TypeError: neither a VerifyKey nor a path (a SigningKey's public half is `key.public`).
    """
    if key is None or isinstance(key, VerifyKey):
        return key
    if isinstance(key, (str, os.PathLike)):
        return VerifyKey.load(key)
    if isinstance(key, SigningKey):
        raise TypeError(f"{setting}: give the public half (signing_key.public) or the path of its file, not the key")
    raise TypeError(f"{setting} must be a VerifyKey or the path of its key file, got {type(key).__name__}")


def _raw_private(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())


def _kind(key: object) -> str:
    """How a refusal names a key of another algorithm: `an RSA`, `an EC`, `a DSA`."""
    name = type(key).__name__.removesuffix("PrivateKey").removesuffix("PublicKey") or "another"
    return f"an {name}" if name[0] in "AEIOURX" else f"a {name}"


def _read_key_file(name: str, what: str, *, private: bool) -> bytes:
    """The bytes of key file `name` (symlinks followed: secrets are often mounted as links), refused unless
    it is a regular file within the cap, holds the half of a key pair asked for (a public key given as the
    signing key is named as such, before its mode is), and, for a private key, is open to its owner only.
    The mode is taken from the file as opened, so what is checked is what is read."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO cannot hang the open
    except FileNotFoundError:
        raise KeyFileError(f"{what} {name} does not exist") from None
    except OSError as exc:
        raise KeyFileError(f"{what} {name} cannot be read: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise KeyFileError(f"{what} {name} is not a regular file")
        chunks, size = [], 0
        while size <= KEY_FILE_MAX_BYTES:
            chunk = os.read(fd, KEY_FILE_MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > KEY_FILE_MAX_BYTES:
        raise KeyFileError(f"{what} {name} is larger than {KEY_FILE_MAX_BYTES} bytes: not a key file")
    data = b"".join(chunks)
    _refuse_the_other_half(data, name, what, private=private)
    if private and mode & 0o077:
        raise KeyFileError(
            f"{what} {name} is open to others (mode {stat.S_IMODE(mode):04o}): a private key must be "
            f"readable by its owner only; chmod 600 {name}"
        )
    return data


def _refuse_the_other_half(data: bytes, name: str, what: str, *, private: bool) -> None:
    """The one mistake worth its own words: the public key file where the private one is asked for (which
    keygen writes mode 0644, so the mode check would otherwise speak first), or the reverse. Decided on the
    PEM label only; nothing of the key is quoted."""
    if private and b"PUBLIC KEY-----" in data and b"PRIVATE KEY-----" not in data:
        raise KeyFileError(
            f"{what} {name} is a public key: signing needs the private key ({SIGNING_KEY_NAME}, mode 0600, "
            f"written beside {VERIFY_KEY_NAME} by `rlckpt keygen`)"
        )
    if not private and b"PRIVATE KEY-----" in data:
        raise KeyFileError(
            f"{what} {name} holds a private key: readers need only the public one ({VERIFY_KEY_NAME}, written "
            f"beside {SIGNING_KEY_NAME} by `rlckpt keygen`)"
        )


@dataclass(frozen=True)
class KeyPairFiles:
    """What `write_key_pair` wrote."""

    signing_key: str
    verify_key: str
    key_id: str


def write_key_pair(directory: str | os.PathLike[str]) -> KeyPairFiles:
    """A new Ed25519 key pair in `directory` (created mode 0700 if missing): `signing.key` (mode 0600,
    the private key) and `signing.pub` (the public key). Never overwrites: both names must be free.

    Raises:
        KeyFileError: a key file of either name is already there, or the directory cannot be written
            (nothing is left behind).
    """
    out = os.fspath(directory)
    key_path, pub_path = os.path.join(out, SIGNING_KEY_NAME), os.path.join(out, VERIFY_KEY_NAME)
    try:
        os.makedirs(out, mode=0o700, exist_ok=True)
        for path in (key_path, pub_path):
            if os.path.lexists(path):
                raise KeyFileError(f"{path} exists: keygen never overwrites a key; choose another --out")
        key = SigningKey.generate()
        _write_new(key_path, key.private_pem(), PRIVATE_KEY_MODE)
        try:
            _write_new(pub_path, key.public.public_pem(), 0o644)
        except BaseException:
            os.remove(key_path)
            raise
    except OSError as exc:
        raise KeyFileError(f"cannot write a key pair into {out}: {exc.strerror or exc}") from None
    return KeyPairFiles(key_path, pub_path, key.key_id)


def _write_new(path: str, data: bytes, mode: int) -> None:
    """Create `path` (never through a symlink, never over a file) with exactly `mode`, whatever the umask."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileExistsError:
        raise KeyFileError(f"{path} exists: keygen never overwrites a key; choose another --out") from None
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
