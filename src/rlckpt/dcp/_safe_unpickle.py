"""The two places a DCP checkpoint is unpickled, closed to code from the bundle.

DCP trusts its checkpoints (PyTorch's SECURITY.md): its reader unpickles `.metadata` with plain
`pickle`, and its `DefaultLoadPlanner.load_bytes` loads every non-tensor item (BYTE_IO) with
`torch.load(weights_only=False)`. A bundle is untrusted input (docs/security.md), so:

- `.metadata` is unpickled by an allowlist unpickler that reaches DCP's metadata classes, its storage
  record, torch values and plain containers, nothing else (`load_metadata`);
- a non-tensor item reaches a planner only through `VettedBytesPlanner`: it must load as a torch.save
  archive naming allowed globals only, under `torch.load(weights_only=True)`; the planner then gets
  rlckpt's own re-save of that value, never the bundle's bytes, so whatever the planner's loader is
  (DCP's default one is not weights-only), it reads only what rlckpt wrote from a vetted value.

Tensor items are loaded by DCP's own read loop with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import pathlib
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo  # DCP's storage record (see _format.py)
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem

from rlckpt.errors import CorruptBundleError
from rlckpt.safeload import TENSORS, TORCH_VALUES, Allowlist, load_torch_bytes, restricted_loads, save_torch_bytes

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"

# What `.metadata` may name, as DCP's FileSystemWriter, its FsspecWriter and rlckpt's writer pickle it
# (torch 2.13): the Metadata record and its parts, the enum TensorProperties encodes memory formats
# with, the storage record of each item, torch values (sizes, dtypes, layouts, devices, memory
# formats), and the path DCP's FileSystemWriter keeps as StorageMeta.checkpoint_id. Planner and storage
# data are plain containers for DCP's default planner and filesystem storage; another planner's
# objects are refused by name.
DCP_METADATA_GLOBALS: Allowlist = {
    **TORCH_VALUES,
    **{
        (_METADATA_MODULE, cls.__name__): cls
        for cls in (
            dcp_metadata.Metadata,
            dcp_metadata.MetadataIndex,
            dcp_metadata.TensorStorageMetadata,
            dcp_metadata.BytesStorageMetadata,
            dcp_metadata.ChunkStorageMetadata,
            dcp_metadata.TensorProperties,
            dcp_metadata.StorageMeta,
            dcp_metadata._MEM_FORMAT_ENCODING,
        )
    },
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
}

# What a non-tensor item may name. rlckpt's trainer state names none at all (AdamW's param_groups are
# floats, bools, None, a tuple and a list of names; the trainer record is a JSON string); tensors and
# torch values are allowed on top, as torch's weights-only loader allows them.
BYTE_ITEM_GLOBALS = TENSORS


def load_metadata(data: bytes, origin: str) -> Metadata:
    """DCP's `.metadata` from `data`, unpickled through DCP_METADATA_GLOBALS only.

    Raises:
        UnsafeContentError: the pickle names another global (named in the message) or is unreadable.
        CorruptBundleError: it unpickles to something that is not DCP metadata.
    """
    metadata = restricted_loads(data, DCP_METADATA_GLOBALS, origin)
    if not isinstance(metadata, Metadata):
        raise CorruptBundleError(f"{origin} is not DCP metadata (it holds a {type(metadata).__name__})")
    return metadata


class VettedBytesPlanner(LoadPlanner):
    """`inner` with every non-tensor item vetted before it sees it (see the module docstring); every
    other call goes to `inner` unchanged. `origin(read_item)` names the item and its file in errors."""

    def __init__(self, inner: LoadPlanner, origin: Callable[[ReadItem], str]) -> None:
        self.inner = inner
        self.origin = origin

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        vetted = load_torch_bytes(value.getvalue(), self.origin(read_item), BYTE_ITEM_GLOBALS.keys())
        self.inner.load_bytes(read_item, io.BytesIO(save_torch_bytes(vetted)))

    def set_up_planner(self, state_dict: Any, metadata: Metadata | None = None, is_coordinator: bool = False) -> None:
        self.inner.set_up_planner(state_dict, metadata, is_coordinator)

    def create_local_plan(self) -> LoadPlan:
        return self.inner.create_local_plan()

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return self.inner.create_global_plan(global_plan)

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return self.inner.finish_plan(central_plan)

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        return self.inner.resolve_tensor(read_item)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        self.inner.commit_tensor(read_item, tensor)
