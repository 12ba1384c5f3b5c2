"""The two kinds of bundle rlckpt writes, told apart by a key of their manifest metadata: a run bundle of
`rlckpt train` (``rlckpt_run_format``) and a Checkpointer bundle (``checkpointer_format``). `rlckpt ls` and
`rlckpt verify` name a bundle's kind and its own format by it; each restore checks its own kind."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rlckpt.checkpoint.layout import META_FORMAT

CHECKPOINTER_FORMAT_KEY = "checkpointer_format"  # the Checkpointer bundle's format (checkpointer/record.py)
KIND_KEYS = (META_FORMAT, CHECKPOINTER_FORMAT_KEY)  # the metadata a listing reads to tell the kind

Kind = Literal["run", "checkpointer"]
_BY_KEY: dict[str, Kind] = {META_FORMAT: "run", CHECKPOINTER_FORMAT_KEY: "checkpointer"}


@dataclass(frozen=True)
class BundleKind:
    """Which kind a bundle is (None: its metadata names neither) and its format there, as written."""

    kind: Kind | None
    format: Any = None

    def describe(self) -> str:
        """``run-bundle format 3``, ``checkpointer-bundle format 1``, or that neither is recorded."""
        if self.kind is None:
            return "no run-bundle or checkpointer-bundle format"
        return f"{self.kind}-bundle format {self.format!r:.40}"


def bundle_kind(metadata: Mapping[str, Any]) -> BundleKind:
    """The kind a manifest's metadata names (the first of the keys it holds)."""
    for key, kind in _BY_KEY.items():
        if key in metadata:
            return BundleKind(kind, metadata[key])
    return BundleKind(None)
