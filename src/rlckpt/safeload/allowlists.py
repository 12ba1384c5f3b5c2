"""Tables of the globals a bundle file may name: the torch values and the tensor machinery that
rlckpt's own files and DCP's hold. Each is a mapping (module, name) -> object, for the allowlist
unpickler and, by its keys, for the globals scan in front of `torch.load`.

Every entry builds a value and nothing else: a dtype, layout or memory format looked up by name, a
`torch.Size` or `torch.device` from plain values, a tensor rebuilt over a storage the archive holds.
None imports a module named by the pickle, opens a file or unpickles nested bytes.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

import torch
import torch._utils
import torch.serialization
import torch.storage

from .unpickler import Allowlist


def _by_name(module: str, names: Mapping[str, object]) -> dict[tuple[str, str], object]:
    return {(module, name): value for name, value in names.items()}


def _torch_attributes(kind: type) -> dict[tuple[str, str], object]:
    """`torch.<name>` for every attribute of the torch module that is an instance of `kind` (a dtype
    pickles as `torch.float32`, a memory format as `torch.contiguous_format`)."""
    return _by_name("torch", {name: value for name, value in vars(torch).items() if isinstance(value, kind)})


def _storage_classes() -> dict[tuple[str, str], object]:
    """The storage classes a torch.save archive names in its persistent ids (`torch.FloatStorage`, ...;
    `torch.storage.UntypedStorage` for the dtypes that have no class of their own)."""
    typed = {
        name: value
        for name, value in vars(torch).items()
        if name.endswith("Storage") and not name.startswith("_") and isinstance(value, type)
    }
    return {
        **_by_name("torch", typed),
        ("torch.storage", "UntypedStorage"): torch.storage.UntypedStorage,
        ("torch.storage", "TypedStorage"): torch.storage.TypedStorage,
    }


# torch values: dtypes, memory formats, layouts (pickled through torch.serialization._get_layout, a
# lookup by name among torch's own layouts), sizes and devices.
TORCH_VALUES: Allowlist = {
    **_torch_attributes(torch.dtype),
    **_torch_attributes(torch.memory_format),
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
}

# What a torch.save archive of tensors and plain containers names: the values above, the storage
# classes of its persistent ids, the tensor rebuild functions (v3 for dtypes without a storage class),
# and OrderedDict (a tensor's empty backward-hooks table).
TENSORS: Allowlist = {
    **TORCH_VALUES,
    **_storage_classes(),
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): torch._utils._rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): torch._utils._rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
}
