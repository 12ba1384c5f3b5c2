"""Reading back a file in a transaction's own data root, hashed as it arrives: how a resumed replica
checks what a dead earlier attempt of its transaction wrote before counting it (BundleTransaction.adopt)."""

from __future__ import annotations

from rlckpt.store.backends import Backend
from rlckpt.store.bundle import READ_BLOCK_SIZE
from rlckpt.store.io.buffers import READ_BUFFERS
from rlckpt.store.io.digest import Digest, new_hasher


def stored_digest(backend: Backend, path: str, algorithm: str, size: int) -> tuple[Digest, int]:
    """The digest under `algorithm` of the first `size` bytes stored at `path` (a ranged read a block at a
    time, each piece hashed as it lands), and how many bytes there were: fewer than `size` when the file is
    shorter. FileNotFoundError when it is not there."""
    hasher = new_hasher(algorithm, size)
    got = 0
    with READ_BUFFERS.lent(min(size, READ_BLOCK_SIZE) or 1) as block:
        for start in range(0, size, READ_BLOCK_SIZE):
            want = min(READ_BLOCK_SIZE, size - start)
            n = backend.read_into(path, block[:want], start, hasher.update)
            got += n
            if n < want:
                break
    return Digest.of_hasher(algorithm, hasher), got
