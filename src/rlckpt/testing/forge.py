"""What anyone who can write a run's storage can commit, through rlckpt's own store API: a bundle
whose every digest matches, holding whatever bytes they like. The attacks of docs/security.md's tests
are built here; each payload, if anything ever unpickles it, runs code that writes a marker file, so a
test can tell "refused" from "refused after it ran".
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlckpt.store import BundleStore


class RunsCode:
    """Unpickles to a call of `exec`: Python of the attacker's choosing, which here writes `marker`."""

    def __init__(self, marker: str | os.PathLike[str]) -> None:
        self.marker = os.fspath(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('the bundle ran code')",))


def code_pickle(marker: str | os.PathLike[str], protocol: int = pickle.DEFAULT_PROTOCOL) -> bytes:
    """A plain pickle that runs code when loaded (as `.metadata` or a TransferQueue snapshot file)."""
    return pickle.dumps(RunsCode(marker), protocol=protocol)


def code_torch_save(marker: str | os.PathLike[str]) -> bytes:
    """A torch.save archive that runs code when loaded without weights_only (a `.pt` piece, a DCP item)."""
    buffer = io.BytesIO()
    torch.save(RunsCode(marker), buffer)
    return buffer.getvalue()


def forge_step(store: BundleStore, source_step: int, step: int, changes: Mapping[str, bytes | None]) -> None:
    """Commit `step` holding every file of committed `source_step` with `changes` applied (bytes: that
    file's new content or a new file; None: drop it), under the same manifest metadata."""
    source = store.open(source_step)
    files: dict[str, bytes | None] = {rel: source.read_bytes(rel) for rel in source.manifest.files}
    files.update(changes)
    with store.begin(step) as txn:
        for rel, data in sorted(files.items()):
            if data is not None:
                txn.write_bytes(rel, data)
        txn.commit(dict(source.manifest.metadata))


def files_under(root: str | os.PathLike[str], prefix: str) -> dict[str, bytes]:
    """Every file below local dir `root`, keyed `prefix/<relpath>` (to put a directory into a forged step)."""
    base = Path(root)
    return {
        f"{prefix}/{p.relative_to(base).as_posix()}": p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()
    }
