"""The tensors of one DCP piece of a bundle (`policy/`, `state/`), consolidated in this process: each tensor whole,
whatever world size saved it, read through rlckpt's reader (every shard file digest-checked, `.metadata` through
the allowlist) in batches of bounded size. No process group: DCP's own planner puts each saved chunk into its
place in the full tensor, as it reshards a load to one rank."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from rlckpt.dcp import BundleStorageReader
from rlckpt.errors import ExportError, UncommittedBundleError
from rlckpt.store import Bundle, BundleStore

log = logging.getLogger(__name__)

PIECES = ("policy", "state")  # rlckpt train's DCP piece, the Checkpointer's
METADATA = ".metadata"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a piece as its `.metadata` states it: its DCP name, dtype and full shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * self.dtype.itemsize


@dataclass(frozen=True)
class Piece:
    """An opened piece: the bundle (records checked, signature too with a verify key), the piece's directory,
    its tensors in `.metadata` order and the names of its non-tensor items (left out of a tensor export)."""

    bundle: Bundle
    prefix: str
    tensors: list[TensorInfo]
    others: list[str]


def open_bundle(
    run: str | BundleStore,
    step: int | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    verify_key: Any = None,
    run_id: str | None = None,
) -> Bundle:
    """Bundle `step` of `run` (None: the newest committed one), its COMMIT, manifest and (with a verify key)
    signature checked. UncommittedBundleError when there is none; ExportError for a key given beside a store."""
    store = (
        run if isinstance(run, BundleStore) else BundleStore(run, storage_options, verify_key=verify_key, run_id=run_id)
    )
    if step is None:
        step = store.latest()
        if step is None:
            signed = " signed by the verify key for this run" if store.verify_key is not None else ""
            raise UncommittedBundleError(f"no committed bundle{signed} at {store.url}: nothing to export")
    return store.open(step)


def open_piece(bundle: Bundle, piece: str | None = None) -> Piece:
    """The DCP piece `piece` of `bundle` (None: `policy/`, else `state/`, whichever it holds), from its
    `.metadata` (digest-checked, unpickled through the allowlist). ExportError when it holds no such piece."""
    names = [piece] if piece is not None else list(PIECES)
    for prefix in names:
        relpath = f"{prefix}/{METADATA}"
        if relpath in bundle.manifest.files:
            metadata = BundleStorageReader(bundle, prefix=prefix).read_metadata()  # digest, allowlist
            return Piece(bundle, prefix, *_items(metadata))
    held = sorted({rel.split("/", 1)[0] for rel in bundle.manifest.files if rel.endswith(f"/{METADATA}")})
    raise ExportError(
        f"step {bundle.step} at {bundle.url} holds no DCP piece {' or '.join(repr(n) for n in names)} "
        f"(pieces with a {METADATA}: {held or 'none'})"
    )


def _items(metadata: Metadata) -> tuple[list[TensorInfo], list[str]]:
    tensors, others = [], []
    for name, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            tensors.append(TensorInfo(name, item.properties.dtype, tuple(item.size)))
        else:
            others.append(name)
    return tensors, others


def selected(tensors: Sequence[TensorInfo], only: Sequence[str] | None) -> list[TensorInfo]:
    """The tensors under the top-level keys `only` (`model`: `model.*`); None: all of them."""
    if only is None:
        return list(tensors)
    return [t for t in tensors if any(t.name == key or t.name.startswith(f"{key}.") for key in only)]


def default_only(tensors: Sequence[TensorInfo]) -> list[str] | None:
    """What an export takes unless told: the model's tensors, under a top-level `model` key (rlckpt train's
    policy) or a `<key>.model` one (a Checkpointer state saved as `{"train": {"model": ..., "optim": ...}}`), the
    optimizer's moments left out; everything when the state has no such key."""
    found: set[str] = set()
    for tensor in tensors:
        parts = tensor.name.split(".")
        if parts[0] == "model" and len(parts) > 1:
            found.add("model")
        elif len(parts) > 2 and parts[1] == "model":
            found.add(f"{parts[0]}.model")
    return sorted(found) or None


def load_batch(piece: Piece, batch: Sequence[TensorInfo]) -> dict[str, torch.Tensor]:
    """The tensors of `batch`, each whole, read from the piece's shard files (digest-checked as fetched). What
    stopped the read (CorruptBundleError naming the file, StoreUnavailableError, ...) is raised as itself, not
    inside DCP's CheckpointException: this process is the only rank."""
    targets = {t.name: torch.empty(t.shape, dtype=t.dtype) for t in batch}
    reader = BundleStorageReader(piece.bundle, prefix=piece.prefix)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(targets, storage_reader=reader, no_dist=True)
    except CheckpointException as exc:
        cause = _cause(exc)
        if cause is None:
            raise
        raise cause from None
    return targets


def _cause(exc: CheckpointException) -> BaseException | None:
    """The exception of this process (DCP's rank 0) inside a CheckpointException."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict) or not failures:
        return None
    found = failures[min(failures)]
    found = found[0] if isinstance(found, tuple) else found
    return found if isinstance(found, BaseException) else None


def cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`tensor` in `dtype` if it is a floating tensor (integers and bools keep theirs)."""
    if dtype is None or not tensor.is_floating_point() or tensor.dtype == dtype:
        return tensor
    return tensor.to(dtype)


def dtype_of(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    try:
        return DTYPES[name]
    except KeyError:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}") from None


def load_state(
    run: str | BundleStore,
    step: int | None = None,
    *,
    piece: str | None = None,
    only: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    verify_key: Any = None,
    run_id: str | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of a bundle's DCP piece as one flat state dict of whole tensors, in this process (for eval
    scripts and notebooks): every shard file it reads is digest-checked, `.metadata` unpickled through the
    allowlist, and with `verify_key` the bundle must be one that key signed for the run.

    Args:
        run: the run's URL (or a BundleStore).
        step: the bundle (None: the newest committed one).
        piece: `policy` (rlckpt train's), `state` (the Checkpointer's), None: whichever the bundle holds.
        only: top-level keys whose tensors to load (`["model"]`: `model.*`); None: every tensor.
    Returns:
        DCP name (`model.0.weight`) -> tensor, in `.metadata` order. Non-tensor items (optimizer param groups)
        are not tensors and are left out.
    Raises:
        UncommittedBundleError, CorruptBundleError (a file named), UnsignedBundleError, BadSignatureError,
        ExportError (no such piece), StoreUnavailableError.
    """
    bundle = open_bundle(run, step, storage_options=storage_options, verify_key=verify_key, run_id=run_id)
    opened = open_piece(bundle, piece)
    tensors = selected(opened.tensors, only)
    if not tensors:
        return {}
    return load_batch(opened, tensors)
