"""What anyone who can write a run's storage can commit, through rlckpt's own store API: a bundle
whose every digest matches, holding whatever bytes they like. The attacks of docs/security.md's tests
are built here; each payload, if anything ever unpickles it, runs code that writes a marker file, so a
test can tell "refused" from "refused after it ran". Without the signing key, what such a writer can do
to signed bundles is below too: carry a signature over, copy a bundle into another run, rewrite the
run record.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlckpt.store import BundleStore, RunRecord, step_dirname
from rlckpt.store.paths.paths import COMMIT_NAME
from rlckpt.store.records.manifest import canonical_json
from rlckpt.store.records.run_record import RUN_RECORD_NAME


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


# --- signed bundles: what a writer of the storage can do without the key ------------------------------


def commit_json(store: BundleStore, step: int) -> dict[str, Any]:
    """The COMMIT of `step` as its JSON object (read behind the store's back)."""
    return json.loads(store.fs.cat_file(f"{store.root}/{step_dirname(step)}/{COMMIT_NAME}"))


def put_commit_json(store: BundleStore, step: int, obj: dict[str, Any]) -> None:
    """Replace the COMMIT of `step` with `obj`, in the canonical form a reader accepts."""
    store.fs.pipe_file(f"{store.root}/{step_dirname(step)}/{COMMIT_NAME}", canonical_json(obj))


def carry_signature(store: BundleStore, source_step: int, step: int) -> None:
    """Give the COMMIT of `step` (committed without a key) the signature and run of `source_step`'s: all
    an attacker can do to make a bundle of their own look signed."""
    source = commit_json(store, source_step)
    put_commit_json(store, step, {**commit_json(store, step), "run": source["run"], "signature": source["signature"]})


def copy_bundle(source: BundleStore, step: int, target: BundleStore) -> None:
    """Copy committed `step` byte for byte (every object under `step_<N>/`: files, manifest, COMMIT) from
    one run into another: a signed bundle moved into a run it was not signed for."""
    prefix = f"{source.root}/{step_dirname(step)}/"
    for path in sorted(source.fs.find(prefix)):
        dest = f"{target.root}/{path[len(source.root) + 1 :]}"
        target.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
        target.fs.pipe_file(dest, source.fs.cat_file(path))


def recommit_bundle(source: BundleStore, step: int, target: BundleStore) -> None:
    """Commit `source`'s committed `step` into `target` as the same step, every file and the manifest
    metadata as they are, through `target` (without a key: unsigned): a consistent bundle of another run,
    as anyone who can write the target's storage can put there, whatever the two stores' layouts."""
    bundle = source.open(step)
    with target.begin(step) as txn:
        for rel in sorted(bundle.manifest.files):
            txn.write_bytes(rel, bundle.read_bytes(rel))
        txn.commit(dict(bundle.manifest.metadata))


def rewrite_run_record(store: BundleStore, run_id: str | None) -> None:
    """Replace the run's record with one naming `run_id`, or remove it (None)."""
    path = f"{store.root}/{RUN_RECORD_NAME}"
    if run_id is None:
        store.fs.rm_file(path)
    else:
        store.fs.pipe_file(path, RunRecord(run_id=run_id, created="2026-01-01T00:00:00Z").to_bytes())
