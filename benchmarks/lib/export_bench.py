"""The parts of `python -m benchmarks.export`: ranks that save a sharded fp32 model (FSDP2, no optimizer: what an
export takes) as one bundle, and the measured children, each a fresh process so that its peak RSS is its own:
`export` (rlckpt.export_safetensors to a local dir), `raw` (every file of the bundle's policy/ read once into a
reused buffer, nothing checked: the floor an export is held to) and `copy` (the same read, written to one local
file and fsynced: the floor of an export that writes what it reads)."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

MiB = 1 << 20
DEPTH = 8


@dataclass(frozen=True)
class SaveJob:
    url: str
    storage_options: dict[str, Any] | None
    size_mib: float


def width_for(size_mib: float) -> int:
    """MLP width whose fp32 weights come to about `size_mib`."""
    return max(64, int(round((size_mib * MiB / (4 * DEPTH)) ** 0.5 / 64)) * 64)


def save_rank(rank: int, world_size: int, port: int, job: SaveJob) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    from rlckpt.dcp import BundleStorageWriter
    from support.dcp_ranks import mlp, process_group, quiet_dcp_warnings

    quiet_dcp_warnings()
    with process_group(rank, world_size, port) as mesh:
        model = mlp(width_for(job.size_mib), DEPTH, 0)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(0.0, 0.02, generator=generator)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        state = {"model": get_model_state_dict(model)}
        dcp.save(state, storage_writer=BundleStorageWriter(job.url, step=1, storage_options=job.storage_options))


def export_child(url: str, options: dict[str, Any] | None, out: str) -> dict[str, Any]:
    from rlckpt.export import export_safetensors  # imported before the clock starts: torch, DCP, safetensors

    started = time.perf_counter()
    report = export_safetensors(url, out=out, storage_options=options)
    return {"seconds": time.perf_counter() - started, "bytes": report.bytes, "files": len(report.files)}


def _policy_files(url: str, options: dict[str, Any] | None) -> tuple[Any, str, dict[str, int]]:
    """(backend, the data root of bundle 1, its policy/ files and their sizes)."""
    from rlckpt.store import BundleStore

    store = BundleStore(url, options)
    bundle = store.open(1)
    files = {rel: e.size for rel, e in bundle.manifest.files.items() if rel.startswith("policy/")}
    return store.backend, store.backend.bundle_root("step_1", bundle.manifest.txid), files


def raw_child(url: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """Every file under policy/ of step 1, read once into one reused buffer: no digest, no torch."""
    backend, root, files = _policy_files(url, options)
    buffer = bytearray(max(files.values()))
    started = time.perf_counter()
    total = 0
    for rel, size in sorted(files.items()):
        view = memoryview(buffer)[:size]
        total += backend.read_into(f"{root}/{rel}", view, 0)
    return {"seconds": time.perf_counter() - started, "bytes": total, "files": len(files)}


def copy_child(url: str, options: dict[str, Any] | None, out: str) -> dict[str, Any]:
    """The same files read as `raw_child` reads them, each written to one local file and that file fsynced: the
    floor of any export that writes the bytes it read (no digest, no torch)."""
    backend, root, files = _policy_files(url, options)
    buffer = bytearray(max(files.values()))
    started = time.perf_counter()
    total = 0
    with open(out, "wb") as sink:
        for rel, size in sorted(files.items()):
            view = memoryview(buffer)[:size]
            got = backend.read_into(f"{root}/{rel}", view, 0)
            sink.write(view[:got])
            total += got
        sink.flush()
        os.fsync(sink.fileno())
    seconds = time.perf_counter() - started
    os.remove(out)
    return {"seconds": seconds, "bytes": total, "files": len(files)}


def largest_tensor_bytes(url: str, options: dict[str, Any] | None) -> int:
    from rlckpt.export.consolidate import open_bundle, open_piece

    piece = open_piece(open_bundle(url, 1, storage_options=options))
    return max(t.nbytes for t in piece.tensors)


def baseline_child() -> dict[str, Any]:
    """What the export's process holds before it reads anything: its imports (torch among them)."""
    import rlckpt.export  # noqa: F401
    from rlckpt.store import BundleStore  # noqa: F401

    return {"seconds": 0.0, "bytes": 0, "files": 0}


def peak_rss() -> int:
    """This process's peak resident set (VmHWM of /proc/self/status), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(argv: list[str]) -> int:
    what = argv[0]
    if what == "baseline":
        print(json.dumps({**baseline_child(), "peak_rss": peak_rss()}), flush=True)
        return 0
    url, options = argv[1], json.loads(argv[2]) or None
    if what == "export":
        result = export_child(url, options, argv[3])
    elif what == "copy":
        result = copy_child(url, options, argv[3])
    else:
        result = raw_child(url, options)
    print(json.dumps({**result, "peak_rss": peak_rss()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    raise SystemExit(main(sys.argv[1:]))
