"""`export_safetensors`: a bundle's consolidated tensors as safetensors files for serving and eval, verified as
read, bounded in memory (one output shard at a time), written as a transaction (safetensors_out.py)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tqdm import tqdm

from rlckpt.export.consolidate import (
    TensorInfo,
    cast,
    default_only,
    dtype_of,
    load_batch,
    open_bundle,
    open_piece,
    selected,
)
from rlckpt.export.names import PrefixRule, Rename, export_names, renamer
from rlckpt.export.safetensors_out import (
    INDEX,
    PROVENANCE,
    ExportTarget,
    WrittenFile,
    index_of,
    iter_names,
    plan_shards,
)
from rlckpt.store import BundleStore

log = logging.getLogger(__name__)

DEFAULT_MAX_SHARD_SIZE = 5_000_000_000  # bytes, as Hugging Face's save_pretrained shards by default ("5GB")
ALL = "all"  # `only`: every tensor of the piece, the optimizer's included


@dataclass
class ExportReport:
    """What an export wrote, and from which bundle (also written as `rlckpt-export.json` beside the files)."""

    source: str
    step: int
    txid: str
    manifest_digest: str
    piece: str
    out: str
    tensors: int
    bytes: int
    files: list[WrittenFile] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # non-tensor items, and tensors not selected or renamed away
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def export_safetensors(
    run: str | BundleStore,
    step: int | None = None,
    *,
    out: str,
    piece: str | None = None,
    only: Sequence[str] | None = None,
    dtype: str | None = None,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    rename: Sequence[PrefixRule | str] = (),
    rename_hook: Rename | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    out_storage_options: dict[str, Any] | None = None,
    verify_key: Any = None,
    run_id: str | None = None,
    progress: bool = False,
) -> ExportReport:
    """Write the tensors of a bundle's DCP piece, each consolidated whole, as safetensors files at `out`.

    Every shard file read is digest-checked before a byte of it is used, `.metadata` is unpickled through the
    allowlist, and with `verify_key` only a bundle that key signed for the run is exported. Memory: the tensors
    of one output shard at a time, plus the reader's few fetched files.

    Args:
        run, step: the bundle (step None: the newest committed one).
        out: a local directory or an fsspec URL (`s3://bucket/export`), absent or empty unless `overwrite`.
        piece: `policy` (rlckpt train's) or `state` (the Checkpointer's); None: whichever the bundle holds.
        only: top-level keys to export (`["model"]`: `model.*`; `["all"]`: everything, optimizer state
            included). None: the model's tensors when the state has a `model` key, else everything.
        dtype: `bf16`, `fp16` or `fp32`: floating tensors cast to it (others keep theirs); None: as saved.
        max_shard_size: bytes per file at most (a larger tensor alone); more than one file gets an index.
        rename, rename_hook: prefix rules (`"model.="`) applied first, then the hook (None drops a tensor).
        progress: a progress bar on stderr.
    Returns:
        The ExportReport (files with their sizes and BLAKE3 digests).
    Raises:
        ExportError: `out` exists and is not empty, no such piece, a rename clash, a bad dtype.
        UncommittedBundleError, CorruptBundleError (names the file), UnsignedBundleError, BadSignatureError,
        StoreUnavailableError: nothing is left at `out` that looks complete.
    """
    started = time.perf_counter()
    cast_to = dtype_of(dtype)
    with ExportTarget(out, out_storage_options, overwrite=overwrite) as target:
        bundle = open_bundle(run, step, storage_options=storage_options, verify_key=verify_key, run_id=run_id)
        opened = open_piece(bundle, piece)
        keys = None if only is not None and ALL in only else (list(only) if only else default_only(opened.tensors))
        chosen = selected(opened.tensors, keys)
        names = export_names([t.name for t in chosen], renamer(rename, rename_hook))
        kept = [t for t in chosen if t.name in names]
        by_export = {names[t.name]: t for t in kept}

        # each tensor as it will be written: its export name and the dtype it is cast to
        slots = {
            n: TensorInfo(n, cast_to if cast_to is not None and t.dtype.is_floating_point else t.dtype, t.shape)
            for n, t in by_export.items()
        }
        shards = plan_shards([(n, slot.nbytes) for n, slot in slots.items()], max_shard_size) if kept else []
        total = sum(slot.nbytes for slot in slots.values())
        report = ExportReport(
            source=bundle.url,
            step=bundle.step,
            txid=bundle.manifest.txid,
            manifest_digest=str(bundle.commit.manifest) if bundle.commit is not None else "",
            piece=opened.prefix,
            out=out,
            tensors=len(kept),
            bytes=total,
            left_out=sorted(set(opened.others) | {t.name for t in opened.tensors} - {t.name for t in kept}),
        )
        meta = {"format": "pt", "rlckpt_step": str(bundle.step), "rlckpt_source": bundle.url}
        with tqdm(total=total, unit="B", unit_scale=True, desc="export", disable=not progress, file=sys.stderr) as bar:
            for file_name, shard in iter_names(shards):
                stream = target.open_shard(file_name, [slots[n] for n in shard], meta)
                try:
                    loaded = load_batch(opened, [by_export[n] for n in shard])  # one shard's tensors at a time
                    for n in shard:
                        tensor = cast(loaded.pop(by_export[n].name), cast_to)
                        stream.write(n, tensor)
                        bar.update(tensor.nbytes)
                        del tensor
                    del loaded
                except BaseException:
                    stream.abandon()
                    raise
                report.files.append(target.close_shard(stream))
        if len(report.files) > 1:
            target.write_json(INDEX, index_of(report.files, total))
        report.seconds = time.perf_counter() - started
        target.write_json(PROVENANCE, report.to_json())
        target.publish()
    log.info(
        "exported %d tensors (%d bytes) of step %s at %s to %s in %.2fs",
        report.tensors,
        report.bytes,
        report.step,
        report.source,
        out,
        report.seconds,
    )
    return report
