"""An unpickler that can only reach the globals it was given.

Every class or function a pickle uses is looked up through `find_class` (GLOBAL, STACK_GLOBAL, INST and
the extension-registry opcodes alike), so an unpickler whose `find_class` answers from a fixed table
cannot call anything else: a `__reduce__` naming `os.system` fails at the lookup, before any call.
Persistent ids are refused (this unpickler defines no `persistent_load`).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from typing import Any

from rlckpt.errors import UnsafeContentError

# (module, name) as the pickle spells it -> the object to hand back. The object is usually what the
# name resolves to, but a table may substitute a safer stand-in (see dataplane.tq_snapshot_check).
Allowlist = Mapping[tuple[str, str], Any]


class AllowlistUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` whose globals come from `allowed` only; anything else raises
    UnsafeContentError naming `origin` and the global."""

    def __init__(self, data: bytes, allowed: Allowlist, origin: str) -> None:
        super().__init__(io.BytesIO(data))
        self._allowed = allowed
        self._origin = origin

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except (KeyError, TypeError):  # TypeError: an unhashable name cannot be allowed either
            raise UnsafeContentError(
                f"{self._origin}: refused to unpickle: it asks for {module}.{name}, which is not allowed in this file"
            ) from None


def restricted_loads(data: bytes, allowed: Allowlist, origin: str) -> Any:
    """Unpickle `data` with only the globals in `allowed` reachable.

    Raises:
        UnsafeContentError: the pickle asks for another global (named), or is not a readable pickle.
    """
    try:
        return AllowlistUnpickler(data, allowed, origin).load()
    except UnsafeContentError:
        raise
    except Exception as exc:  # a truncated or malformed pickle raises many unrelated types
        raise UnsafeContentError(f"{origin}: not a readable pickle ({type(exc).__name__}: {exc})") from exc
