"""Extra pieces of a Checkpointer bundle (dataloader state, RNG states, metrics, counters): saved without pickle.

A piece is written in the first of two forms that holds it exactly, and read back only through a loader that
runs no code from the bundle (docs/security.md):

- ``json``: plain data that JSON gives back as it was — dicts with str keys, lists, str, int, float (NaN and
  infinities included), bool, None — nested at most ``MAX_JSON_DEPTH`` levels. Read with
  ``rlckpt.formats.load_json`` (json, with that bound checked before the parse).
- ``pt``: tensors (CPU, not DTensor) in plain containers (dicts of any plain key, lists, tuples) and plain
  values: ``torch.save``, checked before it is written by the very check its reader makes
  (``safeload.check_torch_bytes``: a zip archive naming only tensor machinery), read with
  ``safeload.load_torch_bytes`` (that check, then ``torch.load(weights_only=True)``). A tuple (Python's
  ``random.getstate()``) or an int key is kept as it is.

Anything else (a NumPy array, a custom object) would need pickle and is refused at the save, naming the piece
and where in it (``ExtraPieceError``); a piece file that is not one of the two forms is refused at the restore
(``UnsafeContentError``), whatever its digest says.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rlckpt.errors import ExtraPieceError, UnsafeContentError
from rlckpt.formats import MAX_JSON_DEPTH, load_json, nested_deeper_than
from rlckpt.safeload import check_torch_bytes, load_torch_bytes, save_torch_bytes

PieceKind = Literal["json", "pt"]
KINDS: tuple[PieceKind, ...] = ("json", "pt")
NAME_PATTERN = "[A-Za-z0-9_-]{1,64}"
EXTRA_DIR = "extra"  # inside the bundle: extra/<name>.<kind>, and each rank's under extra/rank<r>/

_PLAIN_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class EncodedPiece:
    """One piece as it is written: its name, its form and its bytes."""

    name: str
    kind: PieceKind
    data: bytes


def piece_path(name: str, kind: str, rank: int | None = None) -> str:
    """Where a piece is inside the bundle: ``extra/<name>.<kind>``, or ``extra/rank<r>/<name>.<kind>`` for a
    rank's own piece."""
    where = EXTRA_DIR if rank is None else f"{EXTRA_DIR}/rank{rank}"
    return f"{where}/{name}.{kind}"


def encode_pieces(pieces: Mapping[str, Any] | None, who: str) -> dict[str, EncodedPiece]:
    """Every piece of `pieces` encoded (`who` names the caller in errors: "extra", "rank 1's rank_extra").

    Raises:
        ExtraPieceError: a bad name, or a value that cannot be saved without pickle (named with its path).
    """
    if pieces is None:
        return {}
    if not isinstance(pieces, Mapping):
        raise ExtraPieceError(f"{who} must be a mapping of piece name -> value, got {type(pieces).__name__}")
    return {name: encode_piece(name, value, who) for name, value in pieces.items()}


def encode_piece(name: str, value: Any, who: str = "extra") -> EncodedPiece:
    """`value` as a ``json`` piece when JSON holds it exactly, else as a checked ``pt`` piece.

    Raises:
        ExtraPieceError: `name` is not 1-64 of [A-Za-z0-9_-], or `value` holds what neither form holds.
    """
    if not isinstance(name, str) or re.fullmatch(NAME_PATTERN, name) is None:
        raise ExtraPieceError(f"{who}: piece name must be 1-64 of [A-Za-z0-9_-], got {name!r:.80}")
    if nested_deeper_than(value, MAX_JSON_DEPTH):  # before any walk of it recurses (5,000 deep: RecursionError)
        raise ExtraPieceError(
            f"{who}: piece {name!r} is nested deeper than {MAX_JSON_DEPTH} levels of dicts, lists and tuples; no "
            "reader would load it"
        )
    if _exact_in_json(value):
        return EncodedPiece(name, "json", json.dumps(value).encode())
    problem = _not_savable(value, name)
    if problem is not None:
        raise ExtraPieceError(f"{who}: piece {problem}; save tensors, plain containers and plain values only")
    data = save_torch_bytes(value)
    try:
        check_torch_bytes(data, f"piece {name!r}")
    except UnsafeContentError as exc:  # a tensor subclass or a value torch pickles through a global of its own
        raise ExtraPieceError(f"{who}: {exc}; no reader would load it") from None
    return EncodedPiece(name, "pt", data)


def decode_piece(kind: str, data: bytes, origin: str) -> Any:
    """What `encode_piece` wrote, read without running code from it; `origin` names the file in errors.

    Raises:
        UnsafeContentError: not valid JSON, a torch archive that names a global outside the tensor
            allowlist (or not a torch.save archive), or a kind that is neither.
    """
    if kind == "json":
        try:
            return load_json(data, "the piece")
        except ValueError as exc:  # UnicodeDecodeError too; nested too deeply
            raise UnsafeContentError(f"{origin}: refused to load: not JSON ({exc})") from None
    if kind == "pt":
        return load_torch_bytes(data, origin)
    raise UnsafeContentError(f"{origin}: refused to load: a piece of kind {kind!r:.20} (only json and pt are read)")


def _exact_in_json(value: Any) -> bool:
    """Whether ``json.loads(json.dumps(value)) == value`` with the same types throughout (no tuple, no
    non-str key, no subclass of a plain type)."""
    kind = type(value)
    if kind in (str, int, float, bool, type(None)):
        return True  # a float's NaN and infinities too: Python's json writes and reads them
    if kind is list:
        return all(_exact_in_json(item) for item in value)
    if kind is dict:
        return all(type(key) is str and _exact_in_json(item) for key, item in value.items())
    return False


def _not_savable(value: Any, path: str) -> str | None:
    """Where `value` holds something a ``pt`` piece cannot (``'loader'['order'][2]: a numpy.ndarray``), or None."""
    kind = type(value)
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        if value.device.type != "cpu":
            return f"{path}: a tensor on {value.device} (move it to the CPU first)"
        return None
    if isinstance(value, torch.Tensor):
        return f"{path}: a {kind.__module__}.{kind.__qualname__} (a tensor subclass: put it in the DCP state)"
    if kind in _PLAIN_SCALARS:
        return None
    if kind in (list, tuple):
        for i, item in enumerate(value):
            problem = _not_savable(item, f"{path}[{i}]")
            if problem is not None:
                return problem
        return None
    if kind is dict:
        for key, item in value.items():
            if type(key) not in (str, int, bool, float, type(None)):
                return f"{path}: a key of type {type(key).__name__}"
            problem = _not_savable(item, f"{path}[{key!r}]")
            if problem is not None:
                return problem
        return None
    return f"{path}: a {kind.__module__}.{kind.__qualname__}"
