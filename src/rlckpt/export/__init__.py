"""A bundle's policy out of the bundle: `export_safetensors` writes its consolidated tensors as safetensors files
(the Hugging Face layout) for serving and eval, and `load_state` gives them back as one flat state dict in this
process; both read through rlckpt's reader (every file digest-checked, signatures with a verify key) and need no
process group (docs/export.md)."""

from __future__ import annotations

from rlckpt.export.consolidate import load_state
from rlckpt.export.export import DEFAULT_MAX_SHARD_SIZE, ExportReport, export_safetensors
from rlckpt.export.names import PrefixRule

__all__ = ["DEFAULT_MAX_SHARD_SIZE", "ExportReport", "PrefixRule", "export_safetensors", "load_state"]
