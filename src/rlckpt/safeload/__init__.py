"""Deserializing a bundle's bytes without running code from them.

Digests prove a bundle intact, not who wrote it: whoever can write the run's storage can commit a
bundle whose digests all match. So every byte of a bundle that rlckpt deserializes goes through one of
these (docs/security.md lists each place):

- `restricted_loads`: a pickle unpickled with only an explicit table of globals reachable;
- `load_torch_bytes`: a torch.save archive whose pickle names only allowed globals (scanned from its
  opcodes first), then loaded with `torch.load(weights_only=True)`;
- `load_storage_bytes`: a tensor storage a plain pickle carries (torch's legacy format), the same way;
- `check_pickle_globals`: the scan alone; `check_torch_bytes`: `load_torch_bytes`'s checks alone (for writers).

Imports torch; the store (rlckpt.store) does not import this package.
"""

from .allowlists import TENSORS, TORCH_VALUES
from .pickle_scan import PickleGlobal, UnreadablePickle, pickle_globals
from .torch_bytes import (
    check_pickle_globals,
    check_torch_bytes,
    load_storage_bytes,
    load_torch_bytes,
    save_torch_bytes,
)
from .unpickler import Allowlist, AllowlistUnpickler, restricted_loads

__all__ = [
    "TENSORS",
    "TORCH_VALUES",
    "Allowlist",
    "AllowlistUnpickler",
    "PickleGlobal",
    "UnreadablePickle",
    "check_pickle_globals",
    "check_torch_bytes",
    "load_storage_bytes",
    "load_torch_bytes",
    "pickle_globals",
    "restricted_loads",
    "save_torch_bytes",
]
