"""Helpers for store tests: what a run holds besides committed bundles (debris), and a standard sample save."""

from __future__ import annotations

import os
from typing import Any

from rlckpt.store import BundleStore
from rlckpt.store.paths import COMMIT_NAME, parse_step_dirname


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
    from rlckpt.store.gc import _multipart_uploads

    return [key for key, _ in _multipart_uploads(store)]


def debris(store: BundleStore) -> list[str]:
    """Files that belong to no committed bundle (intents, staging, uncommitted steps) + open multipart uploads."""
    committed = {f"step_{s}" for s in store.steps()}
    out = []
    for rel in all_paths(store):
        head = rel.split("/", 1)[0]
        if head not in committed or parse_step_dirname(head) is None:
            out.append(rel)
    if store._backend.local:
        for name in os.listdir(store.root) if os.path.isdir(store.root) else []:
            if name not in committed and os.path.isdir(os.path.join(store.root, name)):
                if not os.listdir(os.path.join(store.root, name)) and name.startswith("step_"):
                    out.append(name + "/")
    return out + [f"upload:{k}" for k in multipart_uploads(store)]


def sample_payload(step: int) -> dict[str, bytes]:
    """Deterministic file contents for a step (distinct per step, some compressible)."""
    return {
        "policy/weights.bin": bytes((step * 7 + i) % 251 for i in range(3000)),
        "policy/optim.bin": (b"adam-%d-" % step) * 200,
        "train_dataloader.pt": b"position=%d" % step,
    }


def save_sample(store: BundleStore, step: int, local_dir: Any = None, metadata: dict[str, Any] | None = None) -> dict[str, bytes]:
    """A full save through every write API: write_bytes, open (streamed, zstd), put_file and put_dir."""
    payload = sample_payload(step)
    with store.begin(step) as txn:
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


