"""The metadata beside a snapshot can be read as plain JSON and completed after the window."""

import asyncio
import json

import pytest
import torch

from rlckpt.dataplane.memory import InMemoryDataPlane
from rlckpt.dataplane.snapshot_metadata import read_snapshot_metadata, update_snapshot_metadata
from rlckpt.errors import DataPlaneError


def _snapshot(tmp_path, metadata):
    plane = InMemoryDataPlane()
    asyncio.run(plane.put_samples("p", ["a:0"], {"x": torch.zeros(1, 2)}))
    asyncio.run(plane.save_checkpoint(tmp_path / "snap", metadata))
    return tmp_path / "snap"


def test_read_returns_the_metadata_saved_with_the_snapshot(tmp_path):
    assert read_snapshot_metadata(_snapshot(tmp_path, {"step": 3})) == {"step": 3}


def test_update_merges_keys_and_a_load_returns_them(tmp_path):
    snap = _snapshot(tmp_path, {"step": 3})
    update_snapshot_metadata(snap, {"index_digest": "abc"})
    assert read_snapshot_metadata(snap) == {"step": 3, "index_digest": "abc"}
    assert json.loads((snap / "metadata.json").read_text())["storage_saved"] is True
    assert asyncio.run(InMemoryDataPlane().load_checkpoint(snap)) == {"step": 3, "index_digest": "abc"}


def test_an_unreadable_metadata_file_is_named_in_the_error(tmp_path):
    snap = _snapshot(tmp_path, {"step": 3})
    (snap / "metadata.json").write_text("{not json")
    with pytest.raises(DataPlaneError, match="metadata.json"):
        read_snapshot_metadata(snap)
    with pytest.raises(DataPlaneError, match="metadata.json"):
        update_snapshot_metadata(snap, {"k": 1})
