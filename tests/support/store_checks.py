"""Helpers for store tests: what a run holds besides committed bundles (debris), and a standard sample save."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Any

from rlckpt.store import BundleStore, BundleTransaction, Intent
from rlckpt.store.paths.paths import TXN_DIR, parse_step_dirname
from rlckpt.store.records.run_record import RUN_RECORD_NAME


def all_paths(store: BundleStore) -> list[str]:
    """Every file under the run, relative to it."""
    root = store.root
    try:
        found = store.fs.find(root)
    except FileNotFoundError:
        return []
    return sorted(p[len(root) + 1 :] for p in found if p.startswith(root + "/"))


def multipart_uploads(store: BundleStore) -> list[str]:
    """Keys of incomplete multipart uploads under the run (always [] off S3)."""
    return [key for key, _ in store.backend.incomplete_uploads()]


def debris(store: BundleStore) -> list[str]:
    """Files that belong to no committed bundle (intents, staging, uncommitted steps) + open multipart uploads.
    The run record is the run's own, not debris."""
    committed = {f"step_{s}" for s in store.steps()}
    out = []
    for rel in all_paths(store):
        if rel == RUN_RECORD_NAME:
            continue
        head = rel.split("/", 1)[0]
        if head not in committed or parse_step_dirname(head) is None:
            out.append(rel)
    if store.is_local:
        for name in os.listdir(store.root) if os.path.isdir(store.root) else []:
            path = os.path.join(store.root, name)
            if name not in committed and name.startswith("step_") and os.path.isdir(path) and not os.listdir(path):
                out.append(name + "/")
    return out + [f"upload:{k}" for k in multipart_uploads(store)]


def make_intent_foreign(store: BundleStore, step: int, age: float, host: str = "another-host") -> Intent:
    """Rewrite the intent of `step` as if its writer ran on another host and started `age` seconds ago
    (what a hung writer elsewhere looks like once its lease has run out); returns the new intent."""
    current = store.claims.read(step)
    assert current is not None and current.intent is not None, f"step {step} has no readable intent"
    foreign = dataclasses.replace(current.intent, host=host, started=time.time() - age, pid_start=None)
    store.backend.remove_file(store.claims.path(step))
    store.backend.create_exclusive(store.claims.path(step), foreign.to_bytes())
    return foreign


NO_SUCH_PID = 2**22 + 1  # above Linux's largest pid_max: no process can have it


def declare_writers_dead(store: BundleStore) -> list[str]:
    """Rewrite every readable intent of the run as if its writer process on this host had exited (what a
    crashed writer leaves); returns their txids."""
    txids = []
    for rel in sorted(store.backend.list_files(store.backend.path(TXN_DIR)).sizes):
        read = store.claims.read_at(store.backend.path(TXN_DIR, rel))
        if read is None or read.intent is None:
            continue
        dead = dataclasses.replace(read.intent, host=socket.gethostname(), pid=NO_SUCH_PID, pid_start=None)
        store.backend.remove_file(read.path)
        store.backend.create_exclusive(read.path, dead.to_bytes())
        txids.append(dead.txid)
    return txids


def abandoned_transaction(store: BundleStore, step: int, files: dict[str, bytes] | None = None) -> BundleTransaction:
    """A transaction left behind by a writer presumed dead: begun, some files written, never ended, and
    its intent made to look like a writer on another host whose lease ran out long ago."""
    txn = store.begin(step)
    for rel, data in (files if files is not None else {"a": b"1" * 100}).items():
        txn.write_bytes(rel, data)
    make_intent_foreign(store, step, age=10 * 24 * 3600)
    return txn


def sample_payload(step: int) -> dict[str, bytes]:
    """Deterministic file contents for a step (distinct per step, some compressible)."""
    return {
        "policy/weights.bin": bytes((step * 7 + i) % 251 for i in range(3000)),
        "policy/optim.bin": (b"adam-%d-" % step) * 200,
        "train_dataloader.pt": b"position=%d" % step,
    }


def save_sample(
    store: BundleStore,
    step: int,
    local_dir: Any = None,
    metadata: dict[str, Any] | None = None,
    reuse: bool = False,
) -> dict[str, bytes]:
    """A full save through every write API: write_bytes, open (streamed, zstd), put_file and put_dir; with
    `reuse`, the files of `local_dir` (the same at every step) are taken from the previous bundle."""
    payload = sample_payload(step)
    with store.begin(step, reuse=reuse) as txn:
        txn.write_bytes("train_dataloader.pt", payload["train_dataloader.pt"])
        with txn.open("policy/optim.bin", compression="zstd") as stream:
            data = payload["policy/optim.bin"]
            stream.write(data[:1000])
            stream.write(data[1000:])
        txn.write_bytes("policy/weights.bin", payload["policy/weights.bin"])
        if local_dir is not None:
            txn.put_dir("data_plane", local_dir)
        txn.commit(metadata or {"step": step})
    return payload


def raw_path(store: BundleStore, *parts: str) -> str:
    """The full path of something under the run, to tamper with it behind the store's back."""
    return "/".join([store.root, *parts])


def stored_path(store: BundleStore, step: int, rel: str) -> str:
    """Where the file `rel` of committed bundle `step` is stored (its manifest and COMMIT sit in the step
    dir; data files under the bundle's root, which on object stores is per transaction)."""
    from rlckpt.store.paths.paths import RESERVED_NAMES
    from rlckpt.store.records.manifest import CommitMarker

    if rel in RESERVED_NAMES:
        return raw_path(store, f"step_{step}", rel)
    marker = CommitMarker.from_bytes(store.fs.cat_file(raw_path(store, f"step_{step}", "COMMIT")))
    return f"{store.backend.bundle_root(f'step_{step}', marker.txid)}/{rel}"


def plant(store: BundleStore, rel: str, data: bytes) -> str:
    """Write a file at run-relative `rel` behind the store's back (creating local directories); its path."""
    path = raw_path(store, rel)
    if store.is_local:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    store.fs.pipe_file(path, data)
    return path


def corrupt_file(store: BundleStore, step: int, rel: str, how: str) -> None:
    """Damage one file of a committed bundle, leaving COMMIT and manifest intact: "flip" (one bit, same
    size: only a digest check sees it), "truncate" (one byte short) or "delete"."""
    path = stored_path(store, step, rel)
    if how == "delete":
        store.fs.rm_file(path)
        return
    data = bytearray(store.fs.cat_file(path))
    if how == "flip":
        data[len(data) // 2] ^= 0x01
    elif how == "truncate":
        del data[-1]
    else:
        raise ValueError(f"unknown corruption {how!r}")
    store.fs.pipe_file(path, bytes(data))


def rewrite_manifest(store: BundleStore, step: int, manifest_bytes: bytes) -> None:
    """Replace a bundle's manifest and rewrite its COMMIT to name it: what a writer that wrote these very
    bytes would have committed (digests alone cannot tell it from a genuine bundle). COMMIT keeps its run
    and its signature, if any, as they were: a forger cannot sign anew."""
    from rlckpt.store import CommitMarker, Digest

    marker = CommitMarker.from_bytes(store.fs.cat_file(raw_path(store, f"step_{step}", "COMMIT")))
    store.fs.pipe_file(raw_path(store, f"step_{step}", "manifest.json"), manifest_bytes)
    renamed = CommitMarker(
        step=step,
        txid=marker.txid,
        manifest=Digest.of(manifest_bytes),
        run=marker.run or store.ensure_run_record().run_id,
        signature=marker.signature,
    )
    store.fs.pipe_file(raw_path(store, f"step_{step}", "COMMIT"), renamed.to_bytes())


def forge_file(
    store: BundleStore, step: int, rel: str, stored: bytes, logical_size: int, compression: str | None
) -> None:
    """Put `stored` at `rel` in a committed bundle with a manifest entry that matches it exactly (size and
    digest), claiming `logical_size` and `compression`: a consistent bundle as a hostile writer makes it."""
    import json

    from rlckpt.store import Digest
    from rlckpt.store.io.compression import PLANES
    from rlckpt.store.records.manifest import MANIFEST_FORMAT, canonical_json

    obj = json.loads(store.fs.cat_file(raw_path(store, f"step_{step}", "manifest.json")))
    if compression in PLANES:
        obj["format"] = MANIFEST_FORMAT  # the format that names byte planes
    digest = Digest.of(stored)
    obj["files"][rel] = {
        "algorithm": digest.algorithm,
        "compression": compression,
        "digest": digest.hex,
        "logical_size": logical_size,
        "size": len(stored),
    }
    store.fs.pipe_file(stored_path(store, step, rel), stored)
    rewrite_manifest(store, step, canonical_json(obj))


def rewrite_as_format_1(store: BundleStore, step: int) -> bytes:
    """Turn committed bundle `step` into the bundle rlckpt wrote before manifest format 2, by hand: every
    entry re-hashed with sha256 under the key `sha256`, no writer version, a format-1 COMMIT naming the
    manifest's sha256. The files stay where they are. Returns the manifest bytes written."""
    import hashlib
    import json

    from rlckpt.store.records.manifest import canonical_json

    manifest = json.loads(store.fs.cat_file(raw_path(store, f"step_{step}", "manifest.json")))
    commit = json.loads(store.fs.cat_file(raw_path(store, f"step_{step}", "COMMIT")))
    files = {}
    for rel, entry in manifest["files"].items():
        stored = store.fs.cat_file(stored_path(store, step, rel))
        files[rel] = {
            "compression": entry["compression"],
            "logical_size": entry["logical_size"],
            "sha256": hashlib.sha256(stored).hexdigest(),
            "size": entry["size"],
        }
    old = {key: manifest[key] for key in ("created", "metadata", "step", "txid")}
    manifest_bytes = canonical_json({**old, "files": files, "format": 1})
    marker = {
        "format": 1,
        "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
        "step": step,
        "txid": commit["txid"],
    }
    store.fs.pipe_file(raw_path(store, f"step_{step}", "manifest.json"), manifest_bytes)
    store.fs.pipe_file(raw_path(store, f"step_{step}", "COMMIT"), canonical_json(marker))
    return manifest_bytes
