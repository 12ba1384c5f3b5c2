"""Digests of stored bytes: the one place that knows the algorithms. Writers, participants' receipts, the
commit, every read and `verify` name an algorithm and go through here; nothing else imports a hash.

New bundles are written with BLAKE3 (WRITE_ALGORITHM): cryptographic like sha256, so a signature over a
manifest keeps its meaning, and 2-3x faster on one core here (4x on two), with tree-parallel hashing of
large inputs on its threads. sha256 (every bundle of manifest format 1) stays readable.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import blake3

from rlckpt.formats.json_text import quoted

SHA256 = "sha256"
BLAKE3 = "blake3"
WRITE_ALGORITHM = BLAKE3  # what this rlckpt writes; every algorithm below is read
ALGORITHMS = (BLAKE3, SHA256)

# An input at least this large is hashed on BLAKE3's threads (a tree hash: its subtrees hash in parallel
# and the result is the same digest). Below it the threads cost more than they save.
THREADED_MIN = 1 << 20

Bytes: TypeAlias = bytes | bytearray | memoryview

_HEX_64 = re.compile(r"[0-9a-f]{64}")  # both algorithms give 32 bytes; a commit checks 150k of these


class Hasher(Protocol):
    """An incremental hash: hashlib's interface, which blake3 shares."""

    def update(self, data: Bytes, /) -> object: ...

    def hexdigest(self) -> str: ...


def check_algorithm(name: object) -> str:
    """`name` if this rlckpt reads digests of that algorithm; ValueError otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown digest algorithm {quoted(name, 40)} (this rlckpt reads {', '.join(ALGORITHMS)})")
    return name


def new_hasher(algorithm: str, size: int | None = None, threaded: bool | None = None) -> Hasher:
    """A fresh hasher of `algorithm` for about `size` bytes (None: not known yet, e.g. a stream being
    written). BLAKE3 uses its threads unless the input is known to be small (`threaded` decides instead
    when given: the benchmark measures both)."""
    check_algorithm(algorithm)
    if algorithm == SHA256:
        return hashlib.sha256()
    if threaded is None:
        threaded = size is None or size >= THREADED_MIN
    return blake3.blake3(max_threads=blake3.blake3.AUTO if threaded else 1)


@dataclass(frozen=True)
class Digest:
    """A digest and the algorithm that made it: manifest entries and COMMIT name both, and two digests
    are equal only under the same algorithm."""

    algorithm: str
    hex: str

    def __post_init__(self) -> None:
        check_algorithm(self.algorithm)
        if not isinstance(self.hex, str) or _HEX_64.fullmatch(self.hex) is None:
            raise ValueError(f"not a {self.algorithm} digest (64 lowercase hex digits): {quoted(self.hex)}")

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"

    @classmethod
    def of(cls, data: Bytes, algorithm: str = WRITE_ALGORITHM) -> Digest:
        """The digest of `data` under `algorithm` (default: the one new bundles are written with)."""
        hasher = new_hasher(algorithm, memoryview(data).nbytes)
        hasher.update(data)
        return cls(algorithm, hasher.hexdigest())

    @classmethod
    def of_hasher(cls, algorithm: str, hasher: Hasher) -> Digest:
        """The digest a hasher made by new_hasher(algorithm) has computed so far."""
        return cls(algorithm, hasher.hexdigest())
